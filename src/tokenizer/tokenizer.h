/* Internal view of the SentencePiece-BPE tokenizer: the piece table every loader fills (tokenizer.model,
 * GGUF metadata, tokenizer.json), the lookup structures built from it, and the encoder entry point.
 *
 * Semantics follow the sentencepiece library (BPE model) exactly:
 *   text --normalize--> '▁' for ' ', invalid UTF-8 bytes -> U+FFFD, optional dummy prefix / whitespace folding
 *        --split------> one symbol per UTF-8 character, or a whole user-defined piece (frozen, never merged)
 *        --merge------> repeatedly merge the adjacent pair whose concatenation is a piece with the highest score
 *                       (ties: leftmost), through a priority queue of candidate pairs
 *        --emit-------> piece ids; a symbol that is not a piece becomes its bytes as <0xXX> pieces (byte fallback)
 * The library puts NORMAL, USER_DEFINED and UNUSED pieces in one map (the only ones a merge may produce) and
 * CONTROL, UNKNOWN and BYTE pieces in a "reserved" map that is consulted first when a final symbol gets its id. */
#ifndef G3_TOKENIZER_TOKENIZER_H
#define G3_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"

/* SentencePiece's piece types (same numbers in GGUF's tokenizer.ggml.token_type). */
enum {
    G3_PIECE_NORMAL = 1,
    G3_PIECE_UNKNOWN = 2,
    G3_PIECE_CONTROL = 3,
    G3_PIECE_USER_DEFINED = 4,
    G3_PIECE_UNUSED = 5,
    G3_PIECE_BYTE = 6,
};

typedef struct g3_tok_piece {
    uint32_t off, len;   /* raw piece bytes in arena ('▁' kept, "<0x41>" for bytes) */
    uint32_t disp_off;   /* NUL-terminated display text in arena: '▁' -> ' ', byte pieces as their byte */
    uint32_t disp_len;
    float score;
    uint8_t type;        /* G3_PIECE_* */
    uint8_t special;     /* USER_DEFINED only: a markup marker, matched only when parse_special is on */
    uint8_t byte;        /* BYTE only: the byte value */
    uint8_t lead_ws;     /* raw piece starts with U+2581 */
} g3_tok_piece;

/* A hash-table slot. Most encoder lookups are for short strings (two adjacent symbols), and most miss: a piece of
 * at most 7 bytes is held in the key itself, so such a lookup reads one slot and nothing else; the score and
 * flags the merge loop needs are in the slot too. Longer pieces keep 56 bits of their hash in the key and are
 * confirmed against the piece text. */
typedef struct g3_tok_slot {
    uint64_t key;   /* g3_tok_key of the piece */
    uint32_t idp1;  /* piece index + 1 in bits 0..23 (0 = empty slot); G3_SLOT_SPECIAL, G3_SLOT_UNUSED */
    float score;
} g3_tok_slot;
#define G3_SLOT_ID 0xFFFFFFu
#define G3_SLOT_SPECIAL 0x80000000u /* a marker piece: a merge may produce it only with parse_special */
#define G3_SLOT_UNUSED 0x40000000u  /* an UNUSED piece: split back after merging (library rule) */

/* Byte trie over the user-defined pieces, for the longest match at a text position. */
typedef struct g3_tok_trie_node {
    int32_t child;   /* first child node, -1 = none */
    int32_t sibling; /* next sibling, -1 = none */
    int32_t id;      /* piece ending here, -1 = none */
    uint8_t byte;
} g3_tok_trie_node;

struct g3_tokenizer {
    int n;                  /* number of pieces (ids 0..n-1) */
    g3_tok_piece *pieces;   /* [n] */
    char *arena;            /* raw and display strings of all pieces */
    size_t arena_len, arena_cap;

    /* open-addressing hash tables (g3_tok_slot), capacity mask+1 (a power of two), linear probing */
    struct g3_tok_slot *norm_slots; /* NORMAL, USER_DEFINED, UNUSED: the pieces a merge may produce */
    struct g3_tok_slot *resv_slots; /* CONTROL, UNKNOWN, BYTE */
    uint32_t norm_mask, resv_mask;
    int ws_chunks;          /* BPE may run separately on the stretches that start at a '▁' (see ws_chunk_ok) */

    int32_t byte_id[256];   /* id of <0xXX>, -1 = missing */
    int32_t ascii_norm[256], ascii_resv[256]; /* id of a one-byte piece in either map, -1 = none */
    int resv_overlap;       /* some string is in both maps (then the reserved one wins, as in the library) */
    int32_t root[256];      /* trie: first node for a leading byte, -1 = no user-defined piece starts there */
    g3_tok_trie_node *trie;
    int n_trie, cap_trie;

    int unk_id, bos_id, eos_id, pad_id, eot_id, sot_id;
    int has_unused;         /* some piece is UNUSED: merged UNUSED pieces are split back (library rule) */
    int unused_merge;       /* some UNUSED piece is the concatenation of two pieces (a merge may produce it) */

    /* normalizer_spec / trainer_spec settings */
    int add_dummy_prefix, remove_extra_ws, escape_ws, treat_ws_as_suffix, byte_fallback;
    int special_known;      /* the loader set `special` from a file; otherwise a name heuristic is applied */
    char *unk_surface;      /* what <unk> decodes to (" \xE2\x81\x87 " by default) */
    char *chat_template;    /* Jinja text from tokenizer_config.json / chat_template.jinja / GGUF, or NULL */
    char source[512];       /* file the vocabulary came from, for messages */
};

/* ---- building (used by the loaders) --------------------------------------------------------------------- */
/* Allocates n empty pieces and sets the library's defaults (no dummy prefix unless the loader says so). */
g3_status g3_tok_init(g3_tokenizer *t, int n, const char *source, g3_error *err);
/* Copies scores and flags changed after g3_tok_finalize into the maps' slots. */
void g3_tok_sync_slots(g3_tokenizer *t);
/* Sets whether user-defined piece id is a marker (matched and produced only with parse_special). */
void g3_tok_set_special(g3_tokenizer *t, int id, int special);
/* Optional: room for this many bytes of piece text (spares regrowing the string arena). */
g3_status g3_tok_reserve(g3_tokenizer *t, size_t bytes, g3_error *err);
/* Sets piece `id`; all ids must be set before g3_tok_finalize. */
g3_status g3_tok_set_piece(g3_tokenizer *t, int id, const char *s, size_t len, float score, int type,
                           g3_error *err);
/* Builds the hash tables, the user-defined trie, the byte table and display strings; resolves special ids
 * (bos/eos/pad/unk ids already set by the loader, >= 0, are kept). */
g3_status g3_tok_finalize(g3_tokenizer *t, g3_error *err);
/* Frees the contents (not t itself). */
void g3_tok_deinit(g3_tokenizer *t);

g3_status g3_tok_load_spm(g3_tokenizer *t, const char *path, g3_error *err);
g3_status g3_tok_load_gguf(g3_tokenizer *t, const char *path, g3_error *err);
g3_status g3_tok_load_hfjson(g3_tokenizer *t, const char *path, g3_error *err);
/* Reads the optional tokenizer_config.json (and chat_template.jinja) of an HF folder: special flags of
 * added tokens, the chat template. Missing files are fine; malformed ones are errors. */
g3_status g3_tok_load_hfconfig(g3_tokenizer *t, const char *dir, g3_error *err);

/* Writes the vocabulary as GGUF metadata (tokenizer.ggml.*, tokenizer.chat_template) in llama.cpp's convention:
 * marker pieces are typed CONTROL, so g3_tok_load_gguf (and llama.cpp) give them back their meaning. */
struct g3_gguf_writer;
g3_status g3_tok_write_gguf(const g3_tokenizer *t, struct g3_gguf_writer *gw, g3_error *err);

/* ---- lookups ---------------------------------------------------------------------------------------------- */
/* 64-bit hash of a byte string: 8 bytes at a time, the tail read as two overlapping loads (which together
 * determine the tail, as its length is known), so no byte past the string is touched. */
static inline uint64_t g3_tok_hash(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w;
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        w = (uint64_t)a | (uint64_t)b << 32;
    } else if (n > 0) {
        w = (uint64_t)(uint8_t)s[0] | (uint64_t)(uint8_t)s[n / 2] << 8 | (uint64_t)(uint8_t)s[n - 1] << 16;
    } else {
        w = 0;
    }
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h;
}

/* Slot key: strings of at most 7 bytes are packed exactly (bytes in bits 0..55, length in the top byte: one
 * key per string); longer ones are 0xFF in the top byte and 56 bits of their hash. */
static inline uint64_t g3_tok_key(const char *s, size_t n) {
    if (n > 7) return (g3_tok_hash(s, n) & 0x00FFFFFFFFFFFFFFull) | 0xFF00000000000000ull;
    uint64_t w = 0;
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        w = (uint64_t)a | (n > 4 ? (uint64_t)(b >> (8 * (8 - n))) << 32 : 0); /* bytes 4..n-1 from b */
    } else if (n > 0) {
        w = (uint64_t)(uint8_t)s[0] | (uint64_t)(uint8_t)s[n / 2] << 8 | (uint64_t)(uint8_t)s[n - 1] << 16;
    }
    return w | (uint64_t)n << 56;
}

static inline uint32_t g3_tok_slot_index(uint64_t key, uint32_t mask) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 29) & mask;
}

/* The slot holding the string s (key = g3_tok_key(s, len)), or NULL. */
static inline const g3_tok_slot *g3_tok_probe(const g3_tokenizer *t, const g3_tok_slot *slots, uint32_t mask,
                                              const char *s, size_t len, uint64_t key) {
    for (uint32_t i = g3_tok_slot_index(key, mask);; i = (i + 1) & mask) {
        const g3_tok_slot *sl = &slots[i];
        if (!sl->idp1) return NULL;
        if (sl->key != key) continue;
        if (len <= 7) return sl; /* the key is the string */
        const g3_tok_piece *p = &t->pieces[(sl->idp1 & G3_SLOT_ID) - 1];
        if (p->len == len && memcmp(t->arena + p->off, s, len) == 0) return sl;
    }
}

static inline int32_t g3_tok_lookup(const g3_tokenizer *t, const g3_tok_slot *slots, uint32_t mask, const char *s,
                                    size_t len) {
    if (!slots) return -1;
    const g3_tok_slot *sl = g3_tok_probe(t, slots, mask, s, len, g3_tok_key(s, len));
    return sl ? (int32_t)(sl->idp1 & G3_SLOT_ID) - 1 : -1;
}

/* Id of the piece with these bytes in the normal map (NORMAL/USER_DEFINED/UNUSED) or the reserved map
 * (CONTROL/UNKNOWN/BYTE); -1 if absent. */
int32_t g3_tok_find_norm(const g3_tokenizer *t, const char *s, size_t len);
int32_t g3_tok_find_resv(const g3_tokenizer *t, const char *s, size_t len);
/* The library's PieceToId: reserved map first, then the normal map, else unk. */
int32_t g3_tok_piece_to_id(const g3_tokenizer *t, const char *s, size_t len);

/* ---- encoding --------------------------------------------------------------------------------------------- */
typedef struct g3_i32vec {
    int32_t *v;
    int n, cap;
} g3_i32vec;
g3_status g3_i32vec_push(g3_i32vec *a, int32_t x, g3_error *err);

/* Appends the ids of text to out. parse_special: user-defined pieces flagged special are matched whole
 * (as the library does for every user-defined piece); otherwise they are ordinary text. */
g3_status g3_tok_encode(const g3_tokenizer *t, const char *text, size_t len, int parse_special, g3_i32vec *out,
                        g3_error *err);

/* ---- small UTF-8 helpers shared by encoder, decoder and chat ---------------------------------------------- */
/* Length of the well-formed UTF-8 character at s (n bytes available): 1..4, or 0 if s does not start with one
 * (the library's IsValidDecodeUTF8 rule: shortest form, no surrogates, <= U+10FFFF). */
int g3_utf8_valid_len(const uint8_t *s, size_t n);
/* 1 if the n bytes at s (n < the length the lead byte announces) can still be completed into a well-formed
 * character, else 0. */
int g3_utf8_incomplete(const uint8_t *s, size_t n);

#endif
