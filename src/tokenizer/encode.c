/* SentencePiece-BPE encoding, step for step as the sentencepiece library does it (see tokenizer.h):
 * normalize -> split into characters and frozen user-defined pieces -> merge pairs best-score-first through a
 * binary heap of candidate pairs with lazy deletion -> ids with byte fallback. Also the UTF-8 helpers.
 *
 * Working memory of one call (n = normalized bytes):
 *   norm[n]            normalized text
 *   sym[n]             symbols: byte span in norm, prev/next links, frozen flag, id once merged
 *   heap[<= 3n]        candidate pairs (score, left, right, size); a popped pair is stale when either side is
 *                      empty or their sizes no longer add up, exactly the library's test. */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#define SPACE_SYM "\xE2\x96\x81"

/* ---- UTF-8 ------------------------------------------------------------------------------------------------- */
/* Allowed range of the second byte for a lead byte (Unicode Table 3-7); lo > hi marks an impossible lead. */
static void second_range(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c == 0xE0) *lo = 0xA0;
    else if (c == 0xED) *hi = 0x9F;
    else if (c == 0xF0) *lo = 0x90;
    else if (c == 0xF4) *hi = 0x8F;
}

static int need_of(uint8_t c) {
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) return 3;
    if (c < 0xF5) return 4;
    return 0;
}

int g3_utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    int need = need_of(s[0]);
    if (need <= 1) return need;
    if (n < (size_t)need) return 0;
    uint8_t lo, hi;
    second_range(s[0], &lo, &hi);
    if (s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need;
}

int g3_utf8_incomplete(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    int need = need_of(s[0]);
    if (need <= 1 || n >= (size_t)need) return 0;
    if (n >= 2) {
        uint8_t lo, hi;
        second_range(s[0], &lo, &hi);
        if (s[1] < lo || s[1] > hi) return 0;
    }
    for (size_t k = 2; k < n; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return 1;
}

/* ---- normalization ----------------------------------------------------------------------------------------- */
/* Identity normalization as the library's Normalizer: invalid UTF-8 bytes -> U+FFFD one byte at a time,
 * ' ' -> '▁' (escape_whitespaces), optional dummy prefix and whitespace folding. out holds 3*len+3 bytes. */
static size_t normalize(const g3_tokenizer *t, const uint8_t *in, size_t len, uint8_t *out) {
    size_t i = 0, o = 0;
    if (len == 0) return 0;
    if (t->remove_extra_ws)
        while (i < len && in[i] == ' ') i++;
    if (i == len) return 0;
    const char *ws = t->escape_ws ? SPACE_SYM : " ";
    const size_t wsn = t->escape_ws ? 3 : 1;
    if (t->add_dummy_prefix && !t->treat_ws_as_suffix) {
        memcpy(out, ws, wsn);
        o = wsn;
    }
    int prev_space = t->remove_extra_ws;
    while (i < len) {
        uint8_t c = in[i];
        if (c < 0x80) {
            if (c == ' ') {
                i++;
                if (prev_space) continue; /* folded away (only with remove_extra_whitespaces) */
                memcpy(out + o, ws, wsn);
                o += wsn;
                prev_space = t->remove_extra_ws;
            } else {
                out[o++] = c;
                i++;
                prev_space = 0;
            }
            continue;
        }
        int l = g3_utf8_valid_len(in + i, len - i);
        if (l == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(out + o, in + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        }
        prev_space = 0;
    }
    if (t->remove_extra_ws)
        while (o >= wsn && memcmp(out + o - wsn, ws, wsn) == 0) o -= wsn;
    if (t->add_dummy_prefix && t->treat_ws_as_suffix) {
        memcpy(out + o, ws, wsn);
        o += wsn;
    }
    return o;
}

/* ---- BPE --------------------------------------------------------------------------------------------------- */
typedef struct sym {
    uint32_t start, len; /* bytes in norm; len 0 = merged away */
    int32_t prev, next;  /* -1 = none */
    int32_t id;          /* piece id in the normal map once merged or matched; -1 = a single character */
    int32_t frozen;      /* a user-defined piece matched whole */
} sym;

typedef struct pair {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of the merged piece when pushed */
    int32_t id;    /* the merged piece */
} pair;

/* a goes before b: higher score, then smaller left (the library's SymbolPairComparator) */
static inline int pair_before(const pair *a, const pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct heap {
    pair *v;
    size_t n;
} heap;

static void heap_push(heap *h, pair p) {
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &h->v[up])) break;
        h->v[i] = h->v[up];
        i = up;
    }
    h->v[i] = p;
}

static pair heap_pop(heap *h) {
    pair top = h->v[0];
    pair last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&h->v[c + 1], &h->v[c])) c++;
        if (!pair_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n) h->v[i] = last;
    return top;
}

/* Split of an UNUSED piece the last time a pair producing it was queued (the library's rev_merge). */
typedef struct revm {
    int32_t id;
    uint32_t left_len;
} revm;

typedef struct enc {
    const g3_tokenizer *t;
    const uint8_t *norm;
    sym *s;
    heap h;
    int parse_special;
    revm *rev;
    int n_rev, cap_rev;
    g3_status rc;
    g3_error *err;
} enc;

static void note_rev(enc *e, int32_t id, uint32_t left_len) {
    for (int i = 0; i < e->n_rev; i++)
        if (e->rev[i].id == id) {
            e->rev[i].left_len = left_len;
            return;
        }
    if (e->n_rev == e->cap_rev) {
        int cap = e->cap_rev ? e->cap_rev * 2 : 16;
        revm *r = realloc(e->rev, (size_t)cap * sizeof *r);
        if (!r) {
            e->rc = g3_fail(e->err, G3_ERR_NOMEM, "out of memory while encoding");
            return;
        }
        e->rev = r;
        e->cap_rev = cap;
    }
    e->rev[e->n_rev++] = (revm){id, left_len};
}

/* The merge of adjacent symbols left and right, if their concatenation is a piece a merge may produce: its id
 * (score in *score), else -1. Records the split of UNUSED pieces in the order the library queues pairs. */
static inline int32_t candidate_k(enc *e, int32_t left, int32_t right, uint64_t key, float *score) {
    const sym *l = &e->s[left], *r = &e->s[right];
    if (l->frozen || r->frozen) return -1;
    const g3_tokenizer *t = e->t;
    const g3_tok_slot *sl =
        g3_tok_probe(t, t->norm_slots, t->norm_mask, (const char *)e->norm + l->start, l->len + r->len, key);
    if (!sl) return -1;
    if ((sl->idp1 & G3_SLOT_SPECIAL) && !e->parse_special) return -1; /* a marker never comes from plain text */
    int32_t id = (int32_t)(sl->idp1 & G3_SLOT_ID) - 1;
    if (sl->idp1 & G3_SLOT_UNUSED) note_rev(e, id, l->len);
    *score = sl->score;
    return id;
}

static inline int32_t candidate(enc *e, int32_t left, int32_t right, float *score) {
    const sym *l = &e->s[left];
    return candidate_k(e, left, right, g3_tok_key((const char *)e->norm + l->start, l->len + e->s[right].len), score);
}

static inline void maybe_add(enc *e, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    float sc;
    int32_t id = candidate(e, left, right, &sc);
    if (id >= 0) heap_push(&e->h, (pair){sc, left, right, e->s[left].len + e->s[right].len, id});
}

static inline void merge(sym *s, int32_t left, int32_t id) {
    sym *l = &s[left], *r = &s[l->next];
    l->len += r->len;
    l->id = id;
    if (r->next >= 0) s[r->next].prev = left;
    l->next = r->next;
    r->len = 0;
}

/* BPE on a stretch of at most SMALL symbols: the best current pair found by a scan instead of a heap (the
 * library's heap, after skipping stale entries, yields exactly the best current pair, leftmost on ties). */
#define SMALL 32
static void bpe_small(enc *e, int32_t cs, int32_t ce) {
    sym *s = e->s;
    float sc[SMALL];
    int32_t pid[SMALL]; /* candidate merge of symbol cs+k with its right neighbour */
    uint64_t k[SMALL];
    /* key every initial pair and prefetch its slot first: the lookups then overlap their cache misses */
    for (int32_t i = cs; i + 1 < ce; i++) {
        k[i - cs] = g3_tok_key((const char *)e->norm + s[i].start, s[i].len + s[i + 1].len);
        __builtin_prefetch(&e->t->norm_slots[g3_tok_slot_index(k[i - cs], e->t->norm_mask)]);
    }
    for (int32_t i = cs; i < ce; i++) pid[i - cs] = i + 1 < ce ? candidate_k(e, i, i + 1, k[i - cs], &sc[i - cs]) : -1;
    for (;;) {
        int32_t best = -1;
        for (int32_t i = cs; i >= 0; i = s[i].next)
            if (pid[i - cs] >= 0 && (best < 0 || sc[i - cs] > sc[best - cs])) best = i;
        if (best < 0) return;
        merge(s, best, pid[best - cs]);
        int32_t pv = s[best].prev, nx = s[best].next;
        if (pv >= 0) pid[pv - cs] = candidate(e, pv, best, &sc[pv - cs]);
        pid[best - cs] = nx >= 0 ? candidate(e, best, nx, &sc[best - cs]) : -1;
    }
}

/* Final symbol -> ids: the library's PieceToId, resegmentation of UNUSED pieces, byte fallback of unknowns. */
static g3_status emit_piece(enc *e, const uint8_t *s, uint32_t len, int32_t known_id, g3_i32vec *out) {
    const g3_tokenizer *t = e->t;
    int32_t id;
    if (known_id >= 0 && !t->resv_overlap) {
        id = known_id; /* a piece of the normal map that no reserved piece shadows */
    } else if (len == 1) {
        id = t->ascii_resv[s[0]] >= 0 ? t->ascii_resv[s[0]] : t->ascii_norm[s[0]];
    } else {
        id = g3_tok_find_resv(t, (const char *)s, len);
        if (id < 0) id = known_id >= 0 ? known_id : g3_tok_find_norm(t, (const char *)s, len);
    }
    if (id < 0) id = t->unk_id;
    if (t->pieces[id].type == G3_PIECE_UNUSED) {
        for (int i = 0; i < e->n_rev; i++)
            if (e->rev[i].id == id) {
                uint32_t ll = e->rev[i].left_len;
                G3_TRY(emit_piece(e, s, ll, -1, out));
                return emit_piece(e, s + ll, len - ll, -1, out);
            }
    }
    if (id == t->unk_id && t->byte_fallback) {
        for (uint32_t k = 0; k < len; k++) {
            int32_t b = t->byte_id[s[k]];
            G3_TRY(g3_i32vec_push(out, b >= 0 ? b : t->unk_id, e->err));
        }
        return G3_OK;
    }
    return g3_i32vec_push(out, id, e->err);
}

/* Longest user-defined piece allowed here, or 0. */
static inline uint32_t match_user(const g3_tokenizer *t, const uint8_t *s, size_t n, int parse_special,
                                  int32_t *id) {
    int32_t node = t->root[s[0]];
    uint32_t best = 0;
    for (size_t k = 1;; k++) {
        const g3_tok_trie_node *nd = &t->trie[node];
        if (nd->id >= 0 && (parse_special || !t->pieces[nd->id].special)) {
            best = (uint32_t)k;
            *id = nd->id;
        }
        if (k == n) break;
        int32_t c = nd->child;
        while (c >= 0 && t->trie[c].byte != s[k]) c = t->trie[c].sibling;
        if (c < 0) break;
        node = c;
    }
    return best;
}

static inline int is_ws_sym(const uint8_t *norm, const sym *y) {
    return y->len == 3 && memcmp(norm + y->start, SPACE_SYM, 3) == 0;
}

/* End (exclusive) of the stretch of symbols that starts at cs. */
static int32_t chunk_end(const g3_tokenizer *t, const uint8_t *norm, const sym *s, int32_t cs, int32_t ns) {
    if (t->unused_merge) return ns;
    int32_t ce = cs + 1;
    if (s[cs].frozen) return ce;
    while (ce < ns && !s[ce].frozen && !(t->ws_chunks && is_ws_sym(norm, &s[ce]) && !is_ws_sym(norm, &s[ce - 1])))
        ce++;
    return ce;
}

g3_status g3_tok_encode(const g3_tokenizer *t, const char *text, size_t len, int parse_special, g3_i32vec *out,
                        g3_error *err) {
    if (len > (size_t)1 << 28)
        return g3_fail(err, G3_ERR_ARG, "text of %zu bytes is too long to tokenize at once (limit 256 MiB)", len);
    if (len == 0) return G3_OK;
    uint8_t *norm = malloc(3 * len + 4);
    if (!norm) return g3_fail(err, G3_ERR_NOMEM, "out of memory encoding %zu bytes", len);
    size_t n = normalize(t, (const uint8_t *)text, len, norm);
    sym *s = malloc((n + 1) * sizeof *s); /* at most n symbols */
    if (!s) {
        free(norm);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory encoding %zu bytes", len);
    }

    /* split: a user-defined piece (frozen) or one character as its lead byte announces */
    static const uint8_t onechar[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    int32_t ns = 0;
    for (size_t p = 0; p < n;) {
        sym *y = &s[ns];
        y->start = (uint32_t)p;
        y->id = -1;
        y->frozen = 0;
        uint32_t l = 0;
        if (t->root[norm[p]] >= 0) l = match_user(t, norm + p, n - p, parse_special, &y->id);
        if (l) {
            y->frozen = 1;
        } else {
            l = onechar[norm[p] >> 4];
            if (l > n - p) l = (uint32_t)(n - p);
        }
        y->len = l;
        ns++;
        p += l;
    }

    /* BPE on independent stretches: a frozen symbol stands alone, and with ws_chunks a '▁' after another
     * character starts a new stretch (no piece spans that place, see ws_chunk_ok). When a merge may produce an
     * UNUSED piece, the library's split table depends on the global merge order: one stretch then. */
    int32_t max_chunk = 0;
    for (int32_t cs = 0; cs < ns;) {
        int32_t ce = chunk_end(t, norm, s, cs, ns);
        if (ce - cs > max_chunk) max_chunk = ce - cs;
        cs = ce;
    }
    pair *hv = malloc((3 * (size_t)max_chunk + 1) * sizeof *hv); /* n-1 initial pairs plus 2 per merge */
    if (!hv) {
        free(norm);
        free(s);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory encoding %zu bytes", len);
    }
    enc e = {t, norm, s, {hv, 0}, parse_special, NULL, 0, 0, G3_OK, err};
    g3_status rc = G3_OK;
    for (int32_t cs = 0; cs < ns && rc == G3_OK;) {
        int32_t ce = chunk_end(t, norm, s, cs, ns);
        for (int32_t i = cs; i < ce; i++) {
            s[i].prev = i == cs ? -1 : i - 1;
            s[i].next = i + 1 == ce ? -1 : i + 1;
        }
        if (ce - cs <= SMALL) {
            bpe_small(&e, cs, ce);
        } else {
            e.h.n = 0;
            for (int32_t i = cs + 1; i < ce; i++) maybe_add(&e, i - 1, i);
            while (e.h.n && e.rc == G3_OK) {
                pair top = heap_pop(&e.h);
                sym *l = &s[top.left], *r = &s[top.right];
                if (l->len == 0 || r->len == 0 || l->len + r->len != top.size) continue; /* stale */
                merge(s, top.left, top.id);
                maybe_add(&e, l->prev, top.left);
                maybe_add(&e, top.left, l->next);
            }
        }
        rc = e.rc;
        for (int32_t i = cs; i >= 0 && rc == G3_OK; i = s[i].next)
            rc = emit_piece(&e, norm + s[i].start, s[i].len, s[i].id, out);
        cs = ce;
    }
    free(e.rev);
    free(norm);
    free(s);
    free(hv);
    return rc;
}
