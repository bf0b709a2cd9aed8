/* What the server needs from the model side, as a table of functions: the engine (driven only by the server's
 * engine thread) and the tokenizer (called from HTTP connection threads, so it must be safe to call concurrently).
 * ops_engine.c fills it from a g3_engine + g3_tokenizer; the unit tests fill it with a fake engine. */
#ifndef G3_SERVER_OPS_H
#define G3_SERVER_OPS_H

#include <stddef.h>

#include "gemma3.h"

/* One chat message, content already flattened to text. */
typedef struct g3_srv_msg {
    const char *role; /* "system", "user" or "assistant" ("developer" is mapped to "system") */
    const char *content;
} g3_srv_msg;

typedef struct g3_srv_ops {
    void *ctx;

    /* ---- engine: called only from the engine thread ---- */
    g3_status (*submit)(void *ctx, const g3_request *r, g3_request_id *id, g3_error *err);
    /* After cancel the server treats the request as finished; events that still arrive for its id are ignored. */
    void (*cancel)(void *ctx, g3_request_id id);
    g3_status (*step)(void *ctx, g3_event_fn fn, void *fn_ctx, int *n_active, g3_error *err);
    void (*get_stats)(void *ctx, g3_engine_stats *s);

    /* ---- tokenizer: any thread ---- */
    /* Text -> ids (no BOS added); *out malloc'd. */
    g3_status (*tokenize)(void *ctx, const char *text, size_t len, int parse_special, int32_t **out, int *n,
                          g3_error *err);
    /* Chat messages -> prompt ids (BOS included), ending with the model-turn opener; *out malloc'd. Errors
     * (G3_ERR_ARG) carry a message fit for the client, e.g. roles that do not alternate. */
    g3_status (*chat_tokens)(void *ctx, const g3_srv_msg *msgs, int n_msgs, int32_t **out, int *n, g3_error *err);
    /* Streaming detokenizer, one per choice: detok_push gives the text token id adds (complete UTF-8 characters,
     * possibly empty: control tokens vanish, byte pieces wait for the rest of their character); detok_flush gives
     * what is still held at the end. Returned text stays valid until the next call on the same detokenizer. */
    void *(*detok_create)(void *ctx);
    const char *(*detok_push)(void *ctx, void *d, int32_t id, size_t *len);
    const char *(*detok_flush)(void *ctx, void *d, size_t *len);
    void (*detok_free)(void *ctx, void *d);
    /* 1 for tokens that end a reply (eos, <end_of_turn>): their text is never shown. */
    int (*is_eog)(void *ctx, int32_t id);
    /* Whole id list -> text (for /detokenize); *out malloc'd. */
    g3_status (*detokenize)(void *ctx, const int32_t *ids, int n, char **out, size_t *len, g3_error *err);
    /* The token's piece as written in the vocabulary (control tokens as "<end_of_turn>", byte pieces as their
     * byte), for logprobs. Valid for the life of the tokenizer; *len gets its length. */
    const char *(*token_piece)(void *ctx, int32_t id, size_t *len);

    int vocab;    /* token ids are in [0, vocab) */
    int ctx_size; /* prompt + generated tokens per sequence */
    int bos_id;
    int max_seqs; /* sequences the engine decodes together */
} g3_srv_ops;

#endif
