/* The tokenizer's piece table and lookups: what every loader fills (g3_tok_init / set_piece / finalize), the two
 * piece maps of the sentencepiece library (normal and reserved) as open-addressing hash tables, the byte trie of
 * user-defined pieces, and the public accessors of include/gemma3.h (vocab size, pieces, special ids). */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_SYM "\xE2\x96\x81" /* U+2581, what ' ' becomes */

int32_t g3_tok_find_norm(const g3_tokenizer *t, const char *s, size_t len) {
    return g3_tok_lookup(t, t->norm_slots, t->norm_mask, s, len);
}
int32_t g3_tok_find_resv(const g3_tokenizer *t, const char *s, size_t len) {
    return g3_tok_lookup(t, t->resv_slots, t->resv_mask, s, len);
}
int32_t g3_tok_piece_to_id(const g3_tokenizer *t, const char *s, size_t len) {
    int32_t id = g3_tok_find_resv(t, s, len);
    if (id >= 0) return id;
    id = g3_tok_find_norm(t, s, len);
    return id >= 0 ? id : t->unk_id;
}

static uint32_t slot_flags(const g3_tok_piece *p) {
    return (p->special ? G3_SLOT_SPECIAL : 0) | (p->type == G3_PIECE_UNUSED ? G3_SLOT_UNUSED : 0);
}

/* Inserts piece id (key k) unless the same string is already there (the library keeps the first, so do we). */
static void insert_in(g3_tokenizer *t, g3_tok_slot *slots, uint32_t mask, int32_t id, uint64_t k) {
    const g3_tok_piece *p = &t->pieces[id];
    for (uint32_t i = g3_tok_slot_index(k, mask);; i = (i + 1) & mask) {
        g3_tok_slot *sl = &slots[i];
        if (!sl->idp1) {
            sl->key = k;
            sl->idp1 = ((uint32_t)id + 1) | slot_flags(p);
            sl->score = p->score;
            return;
        }
        if (sl->key != k) continue;
        const g3_tok_piece *q = &t->pieces[(sl->idp1 & G3_SLOT_ID) - 1];
        if (q->len == p->len && memcmp(t->arena + q->off, t->arena + p->off, p->len) == 0) return;
    }
}

void g3_tok_sync_slots(g3_tokenizer *t) {
    g3_tok_slot *maps[2] = {t->norm_slots, t->resv_slots};
    uint32_t masks[2] = {t->norm_mask, t->resv_mask};
    for (int m = 0; m < 2; m++)
        for (uint32_t i = 0; maps[m] && i <= masks[m]; i++) {
            g3_tok_slot *sl = &maps[m][i];
            if (!sl->idp1) continue;
            const g3_tok_piece *p = &t->pieces[(sl->idp1 & G3_SLOT_ID) - 1];
            sl->idp1 = (sl->idp1 & G3_SLOT_ID) | slot_flags(p);
            sl->score = p->score;
        }
}

void g3_tok_set_special(g3_tokenizer *t, int id, int special) {
    g3_tok_piece *p = &t->pieces[id];
    p->special = (uint8_t)(special != 0);
    if (!t->norm_slots) return; /* not finalized yet: insert_in will copy the flag */
    const char *s = t->arena + p->off;
    g3_tok_slot *sl = (g3_tok_slot *)g3_tok_probe(t, t->norm_slots, t->norm_mask, s, p->len, g3_tok_key(s, p->len));
    if (sl && (int)(sl->idp1 & G3_SLOT_ID) - 1 == id) sl->idp1 = (sl->idp1 & G3_SLOT_ID) | slot_flags(p);
}

/* 1 if the piece text has a U+2581 (memchr for its first byte is much faster than memmem on short strings). */
static int has_space_sym(const char *s, size_t len) {
    for (const char *e = s + len; (s = memchr(s, 0xE2, (size_t)(e - s))) != NULL; s++)
        if (e - s >= 3 && (uint8_t)s[1] == 0x96 && (uint8_t)s[2] == 0x81) return 1;
    return 0;
}

static int in_norm_map(int type) {
    return type == G3_PIECE_NORMAL || type == G3_PIECE_USER_DEFINED || type == G3_PIECE_UNUSED;
}

/* 1 if no piece of the normal map has a '▁' right after a character that is not '▁': then no merge can join a
 * symbol ending in another character with one starting with '▁', and the encoder may run BPE on the stretches
 * between such places separately (same result, much smaller heaps). True for vocabularies trained with
 * split_by_whitespace (Gemma's). */
static int ws_chunk_ok(const g3_tokenizer *t) {
    for (int i = 0; i < t->n; i++) {
        const g3_tok_piece *p = &t->pieces[i];
        if (!in_norm_map(p->type)) continue;
        const char *s = t->arena + p->off;
        if (p->len < 4 || !has_space_sym(s + 1, p->len - 1)) continue;
        for (uint32_t k = 1; k + 3 <= p->len; k++)
            if (memcmp(s + k, SPACE_SYM, 3) == 0 && (k < 3 || memcmp(s + k - 3, SPACE_SYM, 3) != 0)) return 0;
    }
    return 1;
}

/* ---- building ---------------------------------------------------------------------------------------------- */
/* Makes room for `more` bytes of strings. */
static g3_status arena_reserve(g3_tokenizer *t, size_t more, g3_error *err) {
    if (t->arena_len + more <= t->arena_cap) return G3_OK;
    size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
    while (cap < t->arena_len + more) cap *= 2;
    if (cap > 0xFFFFFFFFu) return g3_fail(err, G3_ERR_NOMEM, "%s: vocabulary text exceeds 4 GiB", t->source);
    char *a = realloc(t->arena, cap);
    if (!a) return g3_fail(err, G3_ERR_NOMEM, "%s: out of memory for vocabulary text", t->source);
    t->arena = a;
    t->arena_cap = cap;
    return G3_OK;
}

g3_status g3_tok_reserve(g3_tokenizer *t, size_t bytes, g3_error *err) { return arena_reserve(t, bytes, err); }

static g3_status arena_put(g3_tokenizer *t, const char *s, size_t len, uint32_t *off, g3_error *err) {
    G3_TRY(arena_reserve(t, len + 1, err));
    *off = (uint32_t)t->arena_len;
    if (len) memcpy(t->arena + t->arena_len, s, len);
    t->arena[t->arena_len + len] = 0;
    t->arena_len += len + 1;
    return G3_OK;
}

g3_status g3_tok_init(g3_tokenizer *t, int n, const char *source, g3_error *err) {
    memset(t, 0, sizeof *t);
    snprintf(t->source, sizeof t->source, "%s", source ? source : "?");
    if (n <= 0 || n > (1 << 24))
        return g3_fail(err, G3_ERR_FORMAT, "%s: vocabulary size %d out of range (1..16777216)", t->source, n);
    t->pieces = calloc((size_t)n, sizeof *t->pieces);
    if (!t->pieces) return g3_fail(err, G3_ERR_NOMEM, "%s: out of memory for %d pieces", t->source, n);
    t->n = n;
    for (int i = 0; i < n; i++) t->pieces[i].len = UINT32_MAX; /* not set yet */
    t->unk_id = t->bos_id = t->eos_id = t->pad_id = t->eot_id = t->sot_id = -1;
    t->escape_ws = 1;
    t->byte_fallback = 1;
    return G3_OK;
}

g3_status g3_tok_set_piece(g3_tokenizer *t, int id, const char *s, size_t len, float score, int type,
                           g3_error *err) {
    if (id < 0 || id >= t->n) return g3_fail(err, G3_ERR_FORMAT, "%s: piece id %d out of range", t->source, id);
    if (len == 0) return g3_fail(err, G3_ERR_FORMAT, "%s: piece %d is empty", t->source, id);
    if (len > 65535) return g3_fail(err, G3_ERR_FORMAT, "%s: piece %d is %zu bytes long", t->source, id, len);
    if (type < G3_PIECE_NORMAL || type > G3_PIECE_BYTE)
        return g3_fail(err, G3_ERR_FORMAT, "%s: piece %d has unknown type %d", t->source, id, type);
    g3_tok_piece *p = &t->pieces[id];
    G3_TRY(arena_put(t, s, len, &p->off, err));
    p->len = (uint32_t)len;
    p->score = score;
    p->type = (uint8_t)type;
    return G3_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0x41>" -> 0x41, else -1 (the library requires exactly this form for BYTE pieces). */
static int byte_of_piece(const char *s, size_t len) {
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static g3_status trie_node(g3_tokenizer *t, uint8_t byte, int32_t *out, g3_error *err) {
    if (t->n_trie == t->cap_trie) {
        int cap = t->cap_trie ? t->cap_trie * 2 : 256;
        g3_tok_trie_node *a = realloc(t->trie, (size_t)cap * sizeof *a);
        if (!a) return g3_fail(err, G3_ERR_NOMEM, "%s: out of memory for the user-defined trie", t->source);
        t->trie = a;
        t->cap_trie = cap;
    }
    g3_tok_trie_node *nd = &t->trie[t->n_trie];
    nd->child = nd->sibling = nd->id = -1;
    nd->byte = byte;
    *out = t->n_trie++;
    return G3_OK;
}

static g3_status trie_insert(g3_tokenizer *t, int32_t id, g3_error *err) {
    const g3_tok_piece *p = &t->pieces[id];
    const uint8_t *s = (const uint8_t *)t->arena + p->off;
    int32_t node = t->root[s[0]];
    if (node < 0) {
        G3_TRY(trie_node(t, s[0], &node, err));
        t->root[s[0]] = node;
    }
    for (uint32_t i = 1; i < p->len; i++) {
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != s[i]) c = t->trie[c].sibling;
        if (c < 0) {
            G3_TRY(trie_node(t, s[i], &c, err)); /* may move t->trie: index only */
            t->trie[c].sibling = t->trie[node].child;
            t->trie[node].child = c;
        }
        node = c;
    }
    if (t->trie[node].id < 0) t->trie[node].id = id; /* first piece wins, as in the library's map */
    return G3_OK;
}

static int looks_like_marker(const char *s, size_t len) {
    if (len < 3) return 0;
    return (s[0] == '<' && s[len - 1] == '>') || (s[0] == '[' && s[len - 1] == ']');
}

static int32_t find_any(const g3_tokenizer *t, const char *s) {
    int32_t id = g3_tok_find_resv(t, s, strlen(s));
    return id >= 0 ? id : g3_tok_find_norm(t, s, strlen(s));
}

g3_status g3_tok_finalize(g3_tokenizer *t, g3_error *err) {
    for (int i = 0; i < t->n; i++)
        if (t->pieces[i].len == UINT32_MAX) return g3_fail(err, G3_ERR_FORMAT, "%s: piece %d missing", t->source, i);

    /* maps at load <= 1/2 */
    int n_norm = 0;
    for (int i = 0; i < t->n; i++) n_norm += in_norm_map(t->pieces[i].type);
    uint32_t cap = 16;
    while (cap < (uint32_t)n_norm * 2u) cap *= 2;
    t->norm_mask = cap - 1;
    t->norm_slots = calloc(cap, sizeof *t->norm_slots);
    cap = 16;
    while (cap < (uint32_t)(t->n - n_norm) * 2u) cap *= 2;
    t->resv_mask = cap - 1;
    t->resv_slots = calloc(cap, sizeof *t->resv_slots);
    if (!t->norm_slots || !t->resv_slots) return g3_fail(err, G3_ERR_NOMEM, "%s: out of memory for the piece map", t->source);
    for (int b = 0; b < 256; b++) t->byte_id[b] = t->root[b] = -1;
    uint64_t *hs = malloc(sizeof *hs * (size_t)t->n);
    if (!hs) return g3_fail(err, G3_ERR_NOMEM, "%s: out of memory for the piece map", t->source);

    /* pass 1, sequential: hashes, types, bytes, trie; and how much text the display strings need */
    size_t disp_bytes = 0;
    g3_status rc = G3_OK;
    for (int i = 0; i < t->n && rc == G3_OK; i++) {
        g3_tok_piece *p = &t->pieces[i];
        const char *s = t->arena + p->off;
        hs[i] = g3_tok_key(s, p->len);
        p->lead_ws = p->len >= 3 && memcmp(s, SPACE_SYM, 3) == 0;
        p->disp_off = p->off; /* shared with the raw piece unless it has a '▁' or is a byte */
        p->disp_len = p->len;
        switch (p->type) {
        case G3_PIECE_NORMAL:
        case G3_PIECE_UNUSED:
            p->special = 0;
            if (p->type == G3_PIECE_UNUSED) t->has_unused = 1;
            break;
        case G3_PIECE_USER_DEFINED:
            rc = trie_insert(t, i, err);
            if (!t->special_known) p->special = (uint8_t)looks_like_marker(s, p->len);
            break;
        case G3_PIECE_BYTE: {
            int b = byte_of_piece(s, p->len);
            if (b < 0) {
                rc = g3_fail(err, G3_ERR_FORMAT, "%s: byte piece %d is '%.*s', not of the form <0xXX>", t->source, i,
                             (int)(p->len > 40 ? 40 : p->len), s);
                break;
            }
            p->byte = (uint8_t)b;
            if (t->byte_id[b] < 0) t->byte_id[b] = i;
            disp_bytes += 2;
            break;
        }
        case G3_PIECE_UNKNOWN:
            if (t->unk_id < 0) t->unk_id = i;
            break;
        default: /* CONTROL */
            break;
        }
        if (p->type != G3_PIECE_BYTE && has_space_sym(s, p->len)) disp_bytes += p->len + 1;
    }
    /* pass 2: the maps, prefetching the slot of a piece a few steps ahead (the tables are larger than caches) */
    for (int i = 0; i < t->n && rc == G3_OK; i++) {
        if (i + 8 < t->n) {
            const g3_tok_slot *sl = in_norm_map(t->pieces[i + 8].type)
                                        ? &t->norm_slots[g3_tok_slot_index(hs[i + 8], t->norm_mask)]
                                        : &t->resv_slots[g3_tok_slot_index(hs[i + 8], t->resv_mask)];
            __builtin_prefetch(sl, 1);
        }
        if (in_norm_map(t->pieces[i].type)) insert_in(t, t->norm_slots, t->norm_mask, i, hs[i]);
        else insert_in(t, t->resv_slots, t->resv_mask, i, hs[i]);
    }
    free(hs);
    if (rc != G3_OK) return rc;
    if (t->unk_id < 0) return g3_fail(err, G3_ERR_FORMAT, "%s: the vocabulary has no <unk> (UNKNOWN) piece", t->source);
    if (t->unk_id >= t->n || t->pieces[t->unk_id].type != G3_PIECE_UNKNOWN)
        return g3_fail(err, G3_ERR_FORMAT, "%s: unk id %d is not an UNKNOWN piece", t->source, t->unk_id);

    /* display strings: '▁' -> ' ', byte pieces as their byte; the arena is grown once so pointers stay put */
    G3_TRY(arena_reserve(t, disp_bytes, err));
    for (int i = 0; i < t->n; i++) {
        g3_tok_piece *p = &t->pieces[i];
        if (p->type == G3_PIECE_BYTE) {
            char b = (char)p->byte;
            G3_TRY(arena_put(t, &b, 1, &p->disp_off, err));
            p->disp_len = 1;
            continue;
        }
        const char *s = t->arena + p->off;
        if (!has_space_sym(s, p->len)) continue;
        char *o = t->arena + t->arena_len;
        size_t n = 0;
        for (const char *e = s + p->len; s < e;) { /* copy runs up to each U+2581, which becomes ' ' */
            const char *c = memchr(s, 0xE2, (size_t)(e - s));
            if (!c) c = e;
            memcpy(o + n, s, (size_t)(c - s));
            n += (size_t)(c - s);
            s = c;
            if (s == e) break;
            if (e - s >= 3 && (uint8_t)s[1] == 0x96 && (uint8_t)s[2] == 0x81) {
                o[n++] = ' ';
                s += 3;
            } else {
                o[n++] = *s++;
            }
        }
        o[n] = 0;
        p->disp_off = (uint32_t)t->arena_len;
        p->disp_len = (uint32_t)n;
        t->arena_len += n + 1;
    }

    t->resv_overlap = 0;
    for (int i = 0; i < t->n; i++) {
        const g3_tok_piece *p = &t->pieces[i];
        if (!in_norm_map(p->type) && g3_tok_find_norm(t, t->arena + p->off, p->len) >= 0) t->resv_overlap = 1;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->ascii_norm[b] = g3_tok_find_norm(t, &c, 1);
        t->ascii_resv[b] = g3_tok_find_resv(t, &c, 1);
    }
    t->unused_merge = 0;
    for (int i = 0; i < t->n && !t->unused_merge; i++) { /* can a merge produce an UNUSED piece? */
        const g3_tok_piece *p = &t->pieces[i];
        if (p->type != G3_PIECE_UNUSED) continue;
        const char *s = t->arena + p->off;
        for (uint32_t k = 1; k < p->len && !t->unused_merge; k++)
            if (g3_tok_find_norm(t, s, k) >= 0 && g3_tok_find_norm(t, s + k, p->len - k) >= 0) t->unused_merge = 1;
    }
    t->ws_chunks = t->escape_ws && !t->unused_merge && ws_chunk_ok(t);
    if (t->bos_id < 0) t->bos_id = find_any(t, "<bos>");
    if (t->eos_id < 0) t->eos_id = find_any(t, "<eos>");
    if (t->pad_id < 0) t->pad_id = find_any(t, "<pad>");
    if (t->sot_id < 0) t->sot_id = find_any(t, "<start_of_turn>");
    if (t->eot_id < 0) t->eot_id = find_any(t, "<end_of_turn>");
    if (!t->unk_surface) {
        t->unk_surface = strdup(" \xE2\x81\x87 ");
        if (!t->unk_surface) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    return G3_OK;
}

void g3_tok_deinit(g3_tokenizer *t) {
    if (!t) return;
    free(t->pieces);
    free(t->arena);
    free(t->norm_slots);
    free(t->resv_slots);
    free(t->trie);
    free(t->unk_surface);
    free(t->chat_template);
    memset(t, 0, sizeof *t);
}

g3_status g3_i32vec_push(g3_i32vec *a, int32_t x, g3_error *err) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return g3_fail(err, G3_ERR_NOMEM, "out of memory for %d token ids", cap);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return G3_OK;
}

/* ---- public accessors -------------------------------------------------------------------------------------- */
void g3_tokenizer_free(g3_tokenizer *t) {
    if (!t) return;
    g3_tok_deinit(t);
    free(t);
}

int g3_tokenizer_vocab(const g3_tokenizer *t) { return t ? t->n : 0; }

const char *g3_token_piece(const g3_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n) return NULL;
    return t->arena + t->pieces[id].disp_off;
}

int32_t g3_token_id(const g3_tokenizer *t, const char *piece) {
    if (!t || !piece || !*piece) return -1;
    return find_any(t, piece);
}

void g3_tokenizer_special(const g3_tokenizer *t, g3_special_tokens *out) {
    out->bos = t->bos_id;
    out->eos = t->eos_id;
    out->pad = t->pad_id;
    out->unk = t->unk_id;
    out->sot = t->sot_id;
    out->eot = t->eot_id;
}

int g3_token_is_eog(const g3_tokenizer *t, int32_t id) {
    return id >= 0 && (id == t->eos_id || id == t->eot_id);
}

const char *g3_tokenizer_chat_template(const g3_tokenizer *t) { return t ? t->chat_template : NULL; }

g3_status g3_tokenize(const g3_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **out,
                      int *n_out, g3_error *err) {
    *out = NULL;
    *n_out = 0;
    if (!t) return g3_fail(err, G3_ERR_ARG, "g3_tokenize: no tokenizer");
    if (!text && len) return g3_fail(err, G3_ERR_ARG, "g3_tokenize: NULL text of length %zu", len);
    g3_i32vec v = {0};
    g3_status rc = g3_tok_encode(t, text ? text : "", len, parse_special, &v, err);
    if (rc != G3_OK) {
        free(v.v);
        return rc;
    }
    if (!v.v) { /* empty result: still hand back a freeable pointer */
        v.v = malloc(sizeof(int32_t));
        if (!v.v) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    *out = v.v;
    *n_out = v.n;
    return G3_OK;
}
