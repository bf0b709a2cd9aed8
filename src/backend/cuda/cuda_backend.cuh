/* Internal to the CUDA backend (cuda_backend.cu: create, steps, the ops table; cuda_weights.cu: resident matrices and
 * norms; cuda_forward.cu: the launches of one forward): the backend's state, shared by the three. */
#ifndef G3_BACKEND_CUDA_BACKEND_CUH
#define G3_BACKEND_CUDA_BACKEND_CUH

#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "backend/cuda/cuda_api.h"
}

#define NBUCKET 9 /* graphs for 1, 2, 4, ..., 256 rows */

typedef struct layer_dev {
    g3_dmat qkv, o, gu, down; /* [(NH+2NKV)D][H], [H][NH D], [2F][H] (gate, up interleaved), [H][F] */
    /* v's rows on their own ([NKV D][H]; v.q NULL where qkv holds them): where GGUF mixes give v another type than q
     * and k (llama.cpp's Q4_K_M: Q6_K v in half the layers), so that each keeps its quantized format instead of the
     * whole qkv matrix going to bf16; qkv then holds [(NH+NKV)D][H] and the product writes v after q and k
     * (g3c_attn_args.nyv) */
    g3_dmat v;
    float *attn_norm, *q_norm, *k_norm, *post_attn, *pre_ffn, *post_ffn; /* device, as 1+w */
    int kind, index_in_kind;
} layer_dev;

struct g3_backend {
    g3_config c;
    g3_backend_cfg bc;
    int qt_req, split, graphs_on;
    char desc[64];
    cudaStream_t st;
    cublasHandle_t cub;
    void *cub_ws;
    int n_sm;
    g3_dmat embed;
    layer_dev *L;
    float *final_norm, *norms, *inv_freq; /* inv_freq: [2][D/2], kind 0 = global (scaled), 1 = sliding */
    int n_kind[2];
    float *pool[2];  /* K/V pools (float32, or bf16 where kv16) */
    int kv16;        /* bf16 K/V cache ($G3_CUDA_KV=bf16) */
    size_t block_bytes[2];
    int R;                                      /* rows per forward */
    float *x, *xn, *y, *q, *o, *a, *part, *hx, *logy, *logits;
    float *pnb; /* decode of 1-2 rows with the add-norms inside the products (record): x2 [2][H], then the product
                 * outputs yq [2][NQKV], yo [2][H], yd [2][H], zero between uses like y */
    __nv_bfloat16 *xh, *oh, *ah, *hxh, *wscratch;
    void *q8;                                   /* q8 activations of the dp4a products (qgemv.cu) */
    int8_t *tq8;                                /* 9..64 rows: activations quantized by their producer for the int8
                                                 * tensor-core products (tc_q8.cu), [64][max(H, F)] + scales */
    int8_t *tq8g;                               /* the same for the down product's activations when the gate/up
                                                 * product quantizes them (g3c_wg_mm_geglu: its inputs are in tq8) */
    size_t q8_bytes;
    int HC;                                     /* head chunk rows */
    int32_t *d_par, *h_par, *d_ids, *seq_map;  /* h_par: the pinned parameter block of this step, h_parb[par_k] */
    int32_t *h_parb[2];                         /* pinned parameter blocks, taken in turn by the steps, so that the
                                                 * host fills one while the other's upload may still be queued */
    cudaEvent_t ev_par[2];                      /* after each block's upload */
    int par_k;
    /* the overlapped decode (forward_submit / forward_collect): steps submitted and not collected, oldest first in
     * buffer fly_k, each with its pinned ids [2][R] and (sampling) rows, an event after its ids' download */
    int32_t *h_ids;
    g3_dev_sample *h_srow;                      /* [2][max_seqs], pinned at the first submit that samples */
    g3_dev_adjust *h_sadj;                      /* [2][max_seqs * G3_DEV_ADJ_PER_ROW] */
    cudaEvent_t ev_ids[2];
    int fly_k, fly_cnt, fly_nout[2];
    int last_nout;                              /* out rows of the step submitted last (what feed may take) */
    g3_dev_sample *d_srow;                      /* [max_seqs] sampling rows of forward_sample (sample.cu) */
    g3_dev_adjust *d_sadj;                      /* [max_seqs * G3_DEV_ADJ_PER_ROW] their logit adjustments */
    unsigned *acnt, *tcnt;                      /* attention split counters [R][NKV]; GeGLU tile counters */
    unsigned *gdcnt;                            /* [G3C_GD_WORDS] past tcnt's: g3c_qgemv_gd's counters */
    int attn_min_keys;                          /* $G3_CUDA_ATTN_MIN, default 32 */
    int distinct;                               /* this step's rows are all of different sequences (decode) */
    int32_t *fa_useq;                           /* [R] row plan of the prefill attention (attention_prefill.cu) */
    int fa_step;                                /* this step takes the prefill attention (run eagerly) */
    int tcnt_n;
    size_t par_ints;
    cudaGraphExec_t graph[NBUCKET];
    int graph_failed[NBUCKET];
    int graph_nodes[NBUCKET];
    int graph_distinct[NBUCKET];                /* b->distinct when the bucket's graph was captured (record differs) */
    uint64_t resident;
    cudaEvent_t *prof_ev;                       /* g3_cuda_profile: an event after each launch group */
    const char **prof_lbl;
    int prof_n;
};

#define PROF_MAX 4096
static inline void prof_mark(g3_backend *b, const char *lbl) {
    if (!b->prof_ev || b->prof_n >= PROF_MAX) return;
    cudaEventRecord(b->prof_ev[b->prof_n], b->st);
    b->prof_lbl[b->prof_n++] = lbl;
}

static inline size_t off_bt(const g3_backend *b) { return (size_t)4 * b->R; }

/* cuda_weights.cu */
void *g3cb_dalloc(size_t bytes, int *ok); /* cudaMalloc unless an earlier one failed (*ok = 0 then) */
g3_status g3cb_load_weights(g3_backend *b, const g3_model *m, uint64_t seed, g3_error *err);
/* cuda_forward.cu */
int g3cb_n_splits(const g3_backend *b, int m); /* ~4 blocks per SM of keys split for decode */
cudaError_t g3cb_record(g3_backend *b, int m, int n_out);

#endif
