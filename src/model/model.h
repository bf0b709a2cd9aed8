/* The loaded model: configuration plus every weight bound by name, used in place from the memory mapping
 * (or owned, for random-weight models). Norm weights are stored as float32 (1 + w) whatever the file holds. */
#ifndef G3_MODEL_MODEL_H
#define G3_MODEL_MODEL_H

#include "gemma3.h"
#include "format/gguf.h"
#include "format/safetensors.h"

typedef struct g3_weight {
    uint32_t type;    /* g3_dtype */
    int64_t n;        /* rows = output channels */
    int64_t k;        /* values per row = input channels (contiguous) */
    const void *data; /* n rows of g3_row_bytes(type, k) bytes */
    size_t nbytes;
} g3_weight;

typedef struct g3_layer_weights {
    g3_weight wq;     /* [n_heads*head_dim][hidden] */
    g3_weight wk;     /* [n_kv_heads*head_dim][hidden] */
    g3_weight wv;     /* [n_kv_heads*head_dim][hidden] */
    g3_weight wo;     /* [hidden][n_heads*head_dim] */
    g3_weight w_gate; /* [ffn][hidden] */
    g3_weight w_up;   /* [ffn][hidden] */
    g3_weight w_down; /* [hidden][ffn] */
    float *attn_norm;      /* [hidden]   input_layernorm, as 1+w */
    float *q_norm;         /* [head_dim] */
    float *k_norm;         /* [head_dim] */
    float *post_attn_norm; /* [hidden] */
    float *pre_ffn_norm;   /* [hidden] */
    float *post_ffn_norm;  /* [hidden] */
} g3_layer_weights;

typedef enum g3_model_source { G3_SRC_HF = 1, G3_SRC_GGUF = 2, G3_SRC_RANDOM = 3 } g3_model_source;

struct g3_model {
    g3_config cfg;
    g3_weight embed;           /* [vocab][hidden]; also the output head (tied) */
    float *final_norm;         /* [hidden], 1+w */
    g3_layer_weights *layers;  /* [n_layers] */
    g3_model_source source;
    char path[1024];
    g3_gguf gguf;              /* source == GGUF */
    g3_safetensors st;         /* source == HF */
    void *owned;               /* random weights' storage */
    float *norm_storage;       /* all float norm vectors in one block */
    char *chat_template;       /* from tokenizer_config.json or GGUF tokenizer.chat_template; may be NULL */
    uint64_t n_params;         /* parameter count (text model) */
    uint64_t weight_bytes;     /* bytes of all matrices (embedding included once) */
};

/* Bytes that every decode step reads (all matrices, embedding once as the output head). */
uint64_t g3_model_decode_bytes(const g3_model *m);
/* KV-cache bytes for one sequence of ctx tokens with float32 K/V, knowing sliding layers keep only the window. */
uint64_t g3_model_kv_bytes(const g3_config *c, int ctx, int bytes_per_value);

#endif
