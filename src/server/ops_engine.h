/* Fills a g3_srv_ops from a real engine and tokenizer. */
#ifndef G3_SERVER_OPS_ENGINE_H
#define G3_SERVER_OPS_ENGINE_H

#include "server/ops.h"

typedef struct g3_srv_engine {
    g3_engine *engine;        /* touched only by the server's engine thread */
    const g3_tokenizer *tok;  /* shared read-only by the HTTP threads */
    int ctx_size;             /* the engine's context per sequence */
    int max_seqs;             /* the engine's max_seqs */
} g3_srv_engine;

/* ops->ctx = se (which must outlive the server). */
void g3_srv_ops_from_engine(g3_srv_ops *ops, g3_srv_engine *se);

#endif
