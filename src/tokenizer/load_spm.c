/* Loader of SentencePiece's tokenizer.model: a protobuf ModelProto read with a small bounds-checked wire-format
 * reader (no protobuf library needed). Only the fields that change encoding or decoding are kept:
 *
 *   ModelProto     1: repeated SentencePiece {1: piece, 2: float score, 3: type (default NORMAL)}
 *                  2: TrainerSpec {3: model_type (BPE = 2), 24: treat_whitespace_as_suffix, 35: byte_fallback,
 *                                  44: unk_surface, 45..48: unk/bos/eos/pad piece names}
 *                  3: NormalizerSpec {1: name, 2: precompiled_charsmap, 3: add_dummy_prefix (default true),
 *                                     4: remove_extra_whitespaces (default true), 5: escape_whitespaces (true)} */
#include <stdlib.h>
#include <string.h>

#include "core/mmap_file.h"
#include "tokenizer/tokenizer.h"

typedef struct pb {
    const uint8_t *base, *p, *end;
    const char *path;
    g3_error *err;
} pb;

static g3_status pb_varint(pb *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end)
            return g3_fail(r->err, G3_ERR_FORMAT, "%s: truncated varint at byte %zu", r->path, (size_t)(r->p - r->base));
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return G3_OK;
        }
    }
    return g3_fail(r->err, G3_ERR_FORMAT, "%s: varint longer than 10 bytes at byte %zu", r->path,
                   (size_t)(r->p - r->base));
}

/* Reads one field header and, for LEN fields, the payload bounds; skips nothing. */
typedef struct pb_field {
    uint32_t num, wire;
    uint64_t v;                 /* varint value / fixed bits */
    const uint8_t *data;        /* LEN payload */
    size_t len;
} pb_field;

static g3_status pb_next(pb *r, pb_field *f) {
    uint64_t key;
    size_t at = (size_t)(r->p - r->base);
    G3_TRY(pb_varint(r, &key));
    f->num = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    f->data = NULL;
    f->len = 0;
    f->v = 0;
    switch (f->wire) {
    case 0: return pb_varint(r, &f->v);
    case 1:
        if (r->end - r->p < 8) break;
        memcpy(&f->v, r->p, 8);
        r->p += 8;
        return G3_OK;
    case 5: {
        if (r->end - r->p < 4) break;
        uint32_t w;
        memcpy(&w, r->p, 4);
        f->v = w;
        r->p += 4;
        return G3_OK;
    }
    case 2: {
        uint64_t n;
        G3_TRY(pb_varint(r, &n));
        if (n > (uint64_t)(r->end - r->p)) break;
        f->data = r->p;
        f->len = (size_t)n;
        r->p += n;
        return G3_OK;
    }
    default:
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: field %u has unsupported wire type %u at byte %zu", r->path, f->num,
                       f->wire, at);
    }
    return g3_fail(r->err, G3_ERR_FORMAT, "%s: field %u runs past the end of its message at byte %zu", r->path, f->num,
                   at);
}

static pb sub(const pb *r, const pb_field *f) {
    pb s = {r->base, f->data, f->data + f->len, r->path, r->err};
    return s;
}

typedef struct spm_names {
    const uint8_t *name[4]; /* unk, bos, eos, pad piece names from the trainer spec */
    size_t len[4];
} spm_names;

static g3_status read_trainer(g3_tokenizer *t, pb r, spm_names *nm) {
    pb_field f;
    int model_type = 1; /* UNIGRAM by default */
    t->byte_fallback = 0;
    while (r.p < r.end) {
        G3_TRY(pb_next(&r, &f));
        if (f.num == 3 && f.wire == 0) model_type = (int)f.v;
        else if (f.num == 24 && f.wire == 0) t->treat_ws_as_suffix = f.v != 0;
        else if (f.num == 35 && f.wire == 0) t->byte_fallback = f.v != 0;
        else if (f.num == 44 && f.wire == 2) {
            free(t->unk_surface);
            t->unk_surface = strndup((const char *)f.data, f.len);
            if (!t->unk_surface) return g3_fail(r.err, G3_ERR_NOMEM, "out of memory");
        } else if (f.num >= 45 && f.num <= 48 && f.wire == 2) {
            nm->name[f.num - 45] = f.data;
            nm->len[f.num - 45] = f.len;
        }
    }
    if (model_type != 2)
        return g3_fail(r.err, G3_ERR_UNSUPPORTED, "%s: trainer_spec.model_type is %d; only BPE (2) is supported", r.path,
                       model_type);
    return G3_OK;
}

static g3_status read_normalizer(g3_tokenizer *t, pb r) {
    pb_field f;
    t->add_dummy_prefix = t->remove_extra_ws = t->escape_ws = 1; /* proto defaults */
    const uint8_t *name = NULL;
    size_t name_len = 0, charsmap = 0;
    while (r.p < r.end) {
        G3_TRY(pb_next(&r, &f));
        if (f.num == 1 && f.wire == 2) {
            name = f.data;
            name_len = f.len;
        } else if (f.num == 2 && f.wire == 2) charsmap = f.len;
        else if (f.num == 3 && f.wire == 0) t->add_dummy_prefix = f.v != 0;
        else if (f.num == 4 && f.wire == 0) t->remove_extra_ws = f.v != 0;
        else if (f.num == 5 && f.wire == 0) t->escape_ws = f.v != 0;
    }
    if (charsmap > 0)
        return g3_fail(r.err, G3_ERR_UNSUPPORTED,
                       "%s: normalizer_spec '%.*s' has a %zu-byte normalization table; only identity normalization "
                       "(Gemma's) is supported",
                       r.path, (int)(name_len > 64 ? 64 : name_len), name ? (const char *)name : "", charsmap);
    return G3_OK;
}

g3_status g3_tok_load_spm(g3_tokenizer *t, const char *path, g3_error *err) {
    g3_mmap m;
    G3_TRY(g3_mmap_open(&m, path, err));
    pb r = {m.data, m.data, m.data + m.size, path, err};
    pb_field f;
    g3_status rc = G3_OK;
    int n = 0, have_trainer = 0;
    /* pass 1: count pieces, read the specs */
    spm_names nm = {{NULL}, {0}};
    const uint8_t *tr = NULL, *no = NULL;
    size_t trl = 0, nol = 0;
    while (r.p < r.end && rc == G3_OK) {
        rc = pb_next(&r, &f);
        if (rc != G3_OK) break;
        if (f.num == 1 && f.wire == 2) n++;
        else if (f.num == 2 && f.wire == 2) tr = f.data, trl = f.len, have_trainer = 1;
        else if (f.num == 3 && f.wire == 2) no = f.data, nol = f.len;
    }
    if (rc == G3_OK && n == 0) rc = g3_fail(err, G3_ERR_FORMAT, "%s: no pieces (not a SentencePiece model?)", path);
    if (rc == G3_OK) rc = g3_tok_init(t, n, path, err);
    if (rc == G3_OK) rc = g3_tok_reserve(t, m.size + (size_t)n, err); /* the pieces' text is part of the file */
    if (rc == G3_OK && !have_trainer)
        rc = g3_fail(err, G3_ERR_FORMAT, "%s: no trainer_spec (field 2): cannot tell the model type", path);
    if (rc == G3_OK) rc = read_trainer(t, (pb){m.data, tr, tr + trl, path, err}, &nm);
    if (rc == G3_OK) {
        if (no) rc = read_normalizer(t, (pb){m.data, no, no + nol, path, err});
        else t->add_dummy_prefix = t->remove_extra_ws = t->escape_ws = 1;
    }
    /* pass 2: the pieces */
    r.p = m.data;
    int id = 0;
    while (rc == G3_OK && r.p < r.end) {
        size_t at = (size_t)(r.p - r.base);
        rc = pb_next(&r, &f);
        if (rc != G3_OK || f.num != 1 || f.wire != 2) continue;
        pb s = sub(&r, &f);
        const uint8_t *piece = NULL;
        size_t plen = 0;
        float score = 0;
        int type = G3_PIECE_NORMAL;
        pb_field g;
        while (rc == G3_OK && s.p < s.end) {
            rc = pb_next(&s, &g);
            if (rc != G3_OK) break;
            if (g.num == 1 && g.wire == 2) piece = g.data, plen = g.len;
            else if (g.num == 2 && g.wire == 5) {
                uint32_t w = (uint32_t)g.v;
                memcpy(&score, &w, 4);
            } else if (g.num == 3 && g.wire == 0) type = (int)g.v;
        }
        if (rc != G3_OK) break;
        if (!piece || !plen) {
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: piece %d (byte %zu) has no text", path, id, at);
            break;
        }
        rc = g3_tok_set_piece(t, id, (const char *)piece, plen, score, type, err);
        if (rc == G3_OK && type == G3_PIECE_BYTE && !t->byte_fallback)
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: byte piece %d present but trainer_spec.byte_fallback is off", path, id);
        id++;
    }
    if (rc == G3_OK) rc = g3_tok_finalize(t, err);
    if (rc == G3_OK) {
        /* the library's bos_id()/eos_id()/pad_id(): the named piece if it is a CONTROL piece */
        static const char *defaults[4] = {"<unk>", "<s>", "</s>", "<pad>"};
        int *ids[4] = {NULL, &t->bos_id, &t->eos_id, &t->pad_id};
        for (int k = 1; k < 4; k++) {
            const char *s = nm.name[k] ? (const char *)nm.name[k] : defaults[k];
            size_t l = nm.name[k] ? nm.len[k] : strlen(defaults[k]);
            int32_t pid = g3_tok_find_resv(t, s, l);
            if (pid >= 0 && t->pieces[pid].type == G3_PIECE_CONTROL) *ids[k] = pid;
        }
    }
    g3_mmap_close(&m);
    if (rc != G3_OK) g3_tok_deinit(t);
    return rc;
}
