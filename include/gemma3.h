/* gemma3 — public C API of the Gemma 3 inference engine.
 *
 * Load a model (Hugging Face folder or GGUF file), create an engine on a backend, submit requests and receive
 * tokens. The CLI, the server and the benchmarks all go through this API; there is no second code path.
 * Every function that can fail returns a g3_status and fills a caller-owned g3_error with a message. */
#ifndef GEMMA3_H
#define GEMMA3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ---------------------------------------------------------------------------------------------- */
typedef enum g3_status {
    G3_OK = 0,
    G3_ERR_IO,          /* file missing, unreadable, mmap failed */
    G3_ERR_FORMAT,      /* malformed or inconsistent file contents */
    G3_ERR_UNSUPPORTED, /* valid input that this build cannot handle (tensor type, architecture) */
    G3_ERR_NOMEM,       /* allocation failed or a requested size is absurd */
    G3_ERR_ARG,         /* bad argument from the caller (out-of-range token id, prompt too long, ...) */
    G3_ERR_DEVICE,      /* GPU/driver failure */
    G3_ERR_FULL,        /* no room (KV blocks, queue); try later */
    G3_ERR_CANCELLED,
} g3_status;

typedef struct g3_error {
    g3_status code;
    char msg[1024];
} g3_error;

const char *g3_status_name(g3_status s);

/* ---- tensor element types ------------------------------------------------------------------------------- */
/* Values of the GGUF types keep GGUF's numbering so files round-trip; ours start at 100. */
typedef enum g3_dtype {
    G3_DTYPE_F32 = 0,
    G3_DTYPE_F16 = 1,
    G3_DTYPE_Q4_0 = 2,
    G3_DTYPE_Q4_1 = 3,
    G3_DTYPE_Q5_0 = 6,
    G3_DTYPE_Q5_1 = 7,
    G3_DTYPE_Q8_0 = 8,
    G3_DTYPE_Q4_K = 12,
    G3_DTYPE_Q5_K = 13,
    G3_DTYPE_Q6_K = 14,
    G3_DTYPE_BF16 = 30,
    G3_DTYPE_COUNT_GGUF = 40, /* GGUF type ids are below this */
} g3_dtype;

const char *g3_dtype_name(g3_dtype t);
/* The type named (case-insensitive: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k",
 * "q6_k"); 0 when the name is none of them (*out unchanged). */
int g3_dtype_from_name(const char *name, g3_dtype *out);

/* ---- model configuration -------------------------------------------------------------------------------- */
#define G3_MAX_LAYERS 256

typedef struct g3_config {
    int vocab;           /* rows of the embedding table as stored (262144, or 262208 padded) */
    int hidden;          /* model width */
    int ffn;             /* intermediate size of the GeGLU MLP */
    int n_layers;
    int n_heads;         /* query heads */
    int n_kv_heads;      /* key/value heads (GQA) */
    int head_dim;
    float query_pre_attn_scalar; /* attention scores are scaled by 1/sqrt(this) */
    int sliding_window;  /* a query at p sees keys p-W+1..p on sliding layers */
    int sliding_pattern; /* informational: layer i is global when (i+1) % pattern == 0 (0 = from layer_types) */
    uint8_t layer_global[G3_MAX_LAYERS]; /* 1 = global (full attention) layer */
    float rope_base_global;   /* 1e6 */
    float rope_base_local;    /* 1e4 */
    float rope_scale_global;  /* linear scaling factor for global layers (1 = none); positions are divided by it */
    float rms_eps;
    float attn_softcap;  /* 0 = none */
    float final_softcap; /* 0 = none */
    float embed_scale;   /* embeddings are multiplied by this (sqrt(hidden) as the reference rounds it) */
    int max_ctx;         /* max_position_embeddings */
    int bos_id, eos_id, eot_id, pad_id;
    char size_name[16];  /* "270m", "1b", "4b", "12b", "27b" when the shape is a released one, else "custom" */
} g3_config;

/* ---- model ---------------------------------------------------------------------------------------------- */
typedef struct g3_model g3_model;

typedef struct g3_load_opts {
    int progress;           /* draw a progress bar on stderr while loading (when stderr is a terminal) */
    int ctx_hint;           /* context size the caller plans to use (for memory estimates); 0 = default */
} g3_load_opts;

/* path is a Hugging Face folder (config.json + *.safetensors) or a .gguf file. The weights are memory-mapped. */
g3_status g3_model_load(const char *path, const g3_load_opts *opts, g3_model **out, g3_error *err);
void g3_model_free(g3_model *m);
const g3_config *g3_model_config(const g3_model *m);

/* Random weights with the shape of a released size ("270m", "1b", "4b", "12b", "27b") or of a fixture-like tiny
 * shape ("tiny"), every matrix stored as `type`. For benchmarks and tests. layers_override > 0 cuts the depth. */
g3_status g3_model_random(const char *size, g3_dtype type, uint64_t seed, int layers_override, g3_model **out,
                          g3_error *err);
/* The same with the matrices in a mix of types, as llama.cpp's quantizer writes them: "q4_k_m" (Q4_K, with Q6_K in
 * the embedding and in attn_v / ffn_down of the first and last eighth of the layers and every third between) or
 * "q5_k_m" (Q5_K with the same Q6_K tensors); rows that 256 does not divide (the 1B shape's 1152) take llama.cpp's
 * fallback types: Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K. */
g3_status g3_model_random_mix(const char *size, const char *mix, uint64_t seed, int layers_override, g3_model **out,
                              g3_error *err);

/* ---- sampling ------------------------------------------------------------------------------------------- */
typedef struct g3_logit_bias {
    int32_t token;
    float bias;
} g3_logit_bias;

typedef struct g3_sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off (CTRL-style: divide positive logits, multiply negative) */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    int penalty_last_n;       /* window of previous tokens the penalties look at (0 = all) */
    uint64_t seed;
    int n_logprobs;           /* return log-probabilities with this many top alternatives (0 = none) */
    const g3_logit_bias *logit_bias;
    int n_logit_bias;
} g3_sampling;

void g3_sampling_default(g3_sampling *s); /* greedy, everything off */

/* ---- engine --------------------------------------------------------------------------------------------- */
typedef struct g3_engine g3_engine;

typedef struct g3_engine_opts {
    const char *backend; /* "cpu" (default), "cuda", "vulkan"; NULL = best available */
    int n_threads;       /* CPU threads; 0 = all cores */
    int ctx_size;        /* max tokens per sequence; 0 = min(model max, 4096) */
    int max_seqs;        /* max sequences decoded together; 0 = 1 */
    int kv_block;        /* tokens per KV block; 0 = 16 */
    int n_kv_blocks;     /* blocks in the pool; 0 = enough for max_seqs full contexts */
    int prefill_chunk;   /* max prompt rows per step; 0 = 512 */
    int prefix_cache;    /* 0 = reuse KV blocks of shared prompt prefixes (default), -1 = off */
    int device;          /* GPU index for GPU backends (vulkan: `gemma3 info --devices` order); 0 = the first/best */
    int lazy_setup;      /* 1 = leave the per-batch-size setup (CUDA graph capture) to the first step of each size;
                            0 (default) = do it at create, so no request pays for it */
    int overlap;         /* overlapped decode: the next step is queued on the device before this one's tokens
                            come back (the device feeds them to it), so it never waits for the host between
                            steps. 0 (default) = where the backend has it on by default (none yet: the CUDA
                            backend's awaits a measurement on a GPU; the CPU's runs synchronously, for tests),
                            1 = wherever the backend has it, -1 = off. $G3_OVERLAP=1 / 0 overrides. */
} g3_engine_opts;

void g3_engine_opts_default(g3_engine_opts *o);
g3_status g3_engine_create(g3_model *m, const g3_engine_opts *opts, g3_engine **out, g3_error *err);
void g3_engine_free(g3_engine *e);

typedef int64_t g3_request_id;

typedef struct g3_request {
    const int32_t *prompt; /* token ids, BOS included if wanted */
    int n_prompt;
    int max_tokens;        /* generated tokens at most */
    int ignore_eos;        /* keep going past eos/end_of_turn */
    g3_sampling sampling;
    void *user;            /* returned in events */
} g3_request;

typedef enum g3_finish {
    G3_FINISH_NONE = 0, /* still running */
    G3_FINISH_STOP,     /* eos / end_of_turn */
    G3_FINISH_LENGTH,   /* max_tokens or context */
    G3_FINISH_CANCELLED,
    G3_FINISH_ERROR,
} g3_finish;

typedef struct g3_token_logprob {
    int32_t token;
    float logprob;
} g3_token_logprob;

typedef struct g3_event {
    g3_request_id id;
    void *user;
    int32_t token;          /* the new token (valid when has_token) */
    int has_token;
    float logprob;          /* of token, when logprobs were asked for */
    const g3_token_logprob *top; /* n_top alternatives, valid during the callback */
    int n_top;
    g3_finish finish;       /* != NONE on the request's last event */
    int n_prompt, n_generated;
    int n_cached;           /* prompt tokens served from the prefix cache */
} g3_event;

typedef void (*g3_event_fn)(const g3_event *ev, void *ctx);

/* Queues a request; the prompt is copied. Fails with G3_ERR_ARG if the prompt does not fit the context. */
g3_status g3_engine_submit(g3_engine *e, const g3_request *r, g3_request_id *id, g3_error *err);
void g3_engine_cancel(g3_engine *e, g3_request_id id);
/* Runs one scheduler step (a batch of decode rows plus a chunk of prefill); calls fn for every new token and
 * finish. Returns G3_OK with *n_active = running + waiting requests after the step. With the overlapped decode
 * (g3_engine_opts.overlap) a step's tokens come with the next call, which has already queued the step after it; a
 * call may then report no token. Keep calling while *n_active > 0. */
g3_status g3_engine_step(g3_engine *e, g3_event_fn fn, void *ctx, int *n_active, g3_error *err);

/* Low-level: logits for a prompt in a fresh sequence (no sampling). all_positions=0 writes vocab floats, else
 * n_prompt*vocab (row-major). For `gemma3 logits` and parity tests. */
g3_status g3_engine_logits(g3_engine *e, const int32_t *prompt, int n_prompt, int all_positions, float *out,
                           g3_error *err);

typedef struct g3_engine_stats {
    int kv_blocks_total;
    int kv_blocks_used;     /* referenced by running sequences */
    int kv_blocks_cached;   /* referenced only by the prefix cache (reclaimable); free = total - used - cached */
    int n_running, n_waiting;
    int64_t prompt_tokens, generated_tokens, cached_prompt_tokens;
    int64_t n_preempted;    /* sequences sent back to the queue for lack of KV blocks */
    int64_t overlapped_steps; /* decode steps queued before the tokens of the step before them were back */
} g3_engine_stats;
void g3_engine_get_stats(const g3_engine *e, g3_engine_stats *s);
/* Tokens one sequence can hold (prompt + generated): the ctx_size the engine settled on. */
int g3_engine_ctx_size(const g3_engine *e);
/* Name of the backend the engine runs on ("cpu", "cuda"). */
const char *g3_engine_backend_name(const g3_engine *e);

/* ---- tokenizer ------------------------------------------------------------------------------------------ */
typedef struct g3_tokenizer g3_tokenizer;

/* From a model path (GGUF metadata, or tokenizer.model / tokenizer.json in an HF folder). */
g3_status g3_tokenizer_load(const char *model_path, g3_tokenizer **out, g3_error *err);
void g3_tokenizer_free(g3_tokenizer *t);
/* Encodes text (no BOS added). parse_special: match <start_of_turn>, <end_of_turn> and other special pieces.
 * *out is malloc'd; caller frees. A loaded tokenizer is read-only: any number of threads may encode/decode with it. */
g3_status g3_tokenize(const g3_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **out,
                      int *n_out, g3_error *err);
int g3_tokenizer_vocab(const g3_tokenizer *t);
/* The piece text of a token (with '▁' replaced by ' ', byte pieces as their byte). */
const char *g3_token_piece(const g3_tokenizer *t, int32_t id);
/* Id of the piece whose stored text is exactly `piece` ("<end_of_turn>", "\xE2\x96\x81the", "<0x0A>"); -1 if none. */
int32_t g3_token_id(const g3_tokenizer *t, const char *piece);

typedef struct g3_special_tokens {
    int32_t bos, eos, pad, unk; /* -1 = the vocabulary has none */
    int32_t sot, eot;           /* <start_of_turn>, <end_of_turn> */
} g3_special_tokens;
void g3_tokenizer_special(const g3_tokenizer *t, g3_special_tokens *out);
/* 1 for the tokens that end a reply: eos and <end_of_turn>. */
int g3_token_is_eog(const g3_tokenizer *t, int32_t id);
/* The model file's chat template (Jinja text from tokenizer_config.json, chat_template.jinja or GGUF
 * tokenizer.chat_template), or NULL. Shown by `gemma3 info`; g3_chat_render renders Gemma's format natively. */
const char *g3_tokenizer_chat_template(const g3_tokenizer *t);

/* Text of a whole id list as sentencepiece's decode gives it: control tokens vanish, byte pieces are joined into
 * characters (an invalid byte becomes U+FFFD), '▁' becomes ' '. *out is malloc'd and NUL-terminated. */
g3_status g3_detokenize(const g3_tokenizer *t, const int32_t *ids, int n, char **out, size_t *len, g3_error *err);

/* Streaming decode: push ids one at a time and get back only complete UTF-8 text; byte-fallback pieces are held
 * until their character is complete. The concatenated output equals g3_detokenize of the whole list. */
typedef struct g3_detok g3_detok;
g3_status g3_detok_create(const g3_tokenizer *t, g3_detok **out, g3_error *err);
void g3_detok_free(g3_detok *d);
/* *text (*len bytes, NUL-terminated) is valid until the next call on d. Bad id -> G3_ERR_ARG, state unchanged. */
g3_status g3_detok_push(g3_detok *d, int32_t id, const char **text, size_t *len, g3_error *err);
/* Ends the stream: returns what was held (incomplete bytes become U+FFFD) and starts a new stream. */
const char *g3_detok_flush(g3_detok *d, size_t *len);
void g3_detok_reset(g3_detok *d);

/* ---- chat format ---------------------------------------------------------------------------------------- */
typedef struct g3_chat_message {
    const char *role;    /* "system" (first message only), "user", "assistant" or "model" */
    const char *content;
} g3_chat_message;

/* Gemma 3 prompt text, without <bos>:
 *   <start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n{reply}<end_of_turn>\n...
 * as the model's chat template renders it (contents trimmed, system folded into the first user turn, roles must
 * alternate user/model: G3_ERR_ARG otherwise). add_generation_prompt appends "<start_of_turn>model\n".
 * *out is malloc'd. */
g3_status g3_chat_render(const g3_tokenizer *t, const g3_chat_message *msgs, int n, int add_generation_prompt,
                         char **out, g3_error *err);
/* The same prompt as ids with <bos> first: the turn markers become their special tokens, while message text is
 * encoded with special parsing off (a user typing "<end_of_turn>" gets the literal characters). *ids is malloc'd. */
g3_status g3_chat_tokenize(const g3_tokenizer *t, const g3_chat_message *msgs, int n, int add_generation_prompt,
                           int32_t **ids, int *n_ids, g3_error *err);

#ifdef __cplusplus
}
#endif
#endif
