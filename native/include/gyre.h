/*
 * gyre.h - the C ABI of Gyre's native engine.
 *
 * One ABI, two implementations: libgyre_cpu.so (C11 + OpenMP, always built) and
 * libgyre_cuda.so (CUDA, built when nvcc exists). The library knows a Llama-architecture
 * decoder (Hugging Face LlamaConfig semantics, with Qwen2's q/k/v biases and Qwen3's per-head q/k
 * RMSNorm as options), a paged KV cache for inference and a
 * tree-masked forward/backward with AdamW for training. It knows nothing of its callers:
 * every input and output goes through host memory buffers owned by the caller, every
 * object is an opaque handle, and every fallible call returns a gyre_status whose message
 * gyre_last_error() copies out.
 *
 * Conventions
 *   - Arrays are host pointers with an explicit length; floats are IEEE F32, little endian.
 *   - A function that fills a variable-size byte buffer takes (out, cap, len): with
 *     out == NULL it only stores the required size in *len; with cap too small it fails with
 *     GYRE_ERR_INVALID_ARGUMENT and still stores the required size.
 *   - Handles: a cache and a trainer keep their model alive (reference counted), so the
 *     gyre_*_free calls may come in any order. A model and its caches and trainers must not
 *     be used by two threads at once; calls on different models may run at the same time
 *     from different threads, each with its model's thread count (gyre_model_set_threads),
 *     its own scratch and its own error message.
 *   - Determinism: on one backend with one thread count, the same inputs give bit-identical
 *     outputs (all reductions have a fixed order).
 *
 * Parameter layout. A model's parameters are one flat F32 vector, the concatenation of
 * these tensors in this order (D = hidden_size, F = intermediate_size, V = vocab_size,
 * H = num_attention_heads, KV = num_key_value_heads, hd = head_dim (gyre_config; H * hd need
 * not be D); shapes row-major,
 * [out, in] for projections as in torch.nn.Linear):
 *     model.embed_tokens.weight                     [V, D]
 *     for each layer i:
 *       model.layers.{i}.input_layernorm.weight     [D]
 *       model.layers.{i}.self_attn.q_proj.weight    [H*hd, D]
 *       model.layers.{i}.self_attn.k_proj.weight    [KV*hd, D]
 *       model.layers.{i}.self_attn.v_proj.weight    [KV*hd, D]
 *       model.layers.{i}.self_attn.q_proj.bias      [H*hd]   (only with qkv_bias)
 *       model.layers.{i}.self_attn.k_proj.bias      [KV*hd]  (only with qkv_bias)
 *       model.layers.{i}.self_attn.v_proj.bias      [KV*hd]  (only with qkv_bias)
 *       model.layers.{i}.self_attn.q_norm.weight    [hd]     (only with qk_norm)
 *       model.layers.{i}.self_attn.k_norm.weight    [hd]     (only with qk_norm)
 *       model.layers.{i}.self_attn.o_proj.weight    [D, H*hd]
 *       model.layers.{i}.post_attention_layernorm.weight [D]
 *       model.layers.{i}.mlp.gate_proj.weight       [F, D]
 *       model.layers.{i}.mlp.up_proj.weight         [F, D]
 *       model.layers.{i}.mlp.down_proj.weight       [D, F]
 *     model.norm.weight                             [D]
 *     lm_head.weight                                [V, D]   (absent when tie_word_embeddings)
 * Weights, gradients and both AdamW moments use this layout; gyre_param_tensor() lists it.
 */
#ifndef GYRE_H
#define GYRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define GYRE_API __declspec(dllexport)
#else
#define GYRE_API __attribute__((visibility("default")))
#endif

/* Bumped on any incompatible change of a signature, struct or buffer format below. */
#define GYRE_ABI_VERSION 9 /* 2: gyre_loss_config.proximal_current; 3: RoPE scaling, tensor load/store;
                              4: gyre_config.head_dim, per-thread error messages, per-model thread counts;
                              5: gyre_cache_create's kv_dtype, gyre_cache_stats.kv_dtype (F16 KV);
                              6: gyre_config.qkv_bias, qk_norm and YaRN fields, gyre_rope_attention_scaling;
                              7: gyre_loss_config.temperature;
                              8: gyre_train_batch takes n > max_tokens (chunked), gyre_trainer_memory;
                              9: gyre_model_create_zero's weight_dtype, gyre_model_weight_dtype (16-bit weights) */

/* ------------------------------------------------------------------------------------ */
/* Status codes and errors                                                               */
/* ------------------------------------------------------------------------------------ */

typedef enum gyre_status {
  GYRE_OK = 0,
  GYRE_ERR_INVALID_ARGUMENT = 1, /* a bad argument: null pointer, shape, id, token, size */
  GYRE_ERR_OUT_OF_MEMORY = 2,    /* host or device allocation failed */
  GYRE_ERR_OUT_OF_BLOCKS = 3,    /* the KV cache has too few free blocks; nothing changed */
  GYRE_ERR_BAD_CHECKPOINT = 4,   /* safetensors buffer malformed, truncated or mismatched */
  GYRE_ERR_BAD_HANDOFF = 5,      /* KV export buffer malformed, mismatched or bad checksum */
  GYRE_ERR_STATE = 6,            /* the object is in the wrong state (e.g. sequence pinned) */
  GYRE_ERR_DEVICE = 7,           /* the device failed (CUDA error) */
  GYRE_ERR_UNSUPPORTED = 8       /* not available on this backend or build */
} gyre_status;

/* Copies the message of the calling thread's most recent failed call into buf, NUL
 * terminated and truncated to cap - 1 bytes; returns the message length (failures on other
 * threads do not change it). The message names the function and the offending value, e.g.
 * "gyre_forward: sequence 7 is pinned". */
GYRE_API size_t gyre_last_error(char *buf, size_t cap);
/* A failed call leaves a failure code in errno (the calling thread's); this copies that
 * failure's message from any thread while it is among the 64 most recent failures of the
 * process, else copies "" and returns 0. For callers that run calls on worker threads and
 * read the outcome elsewhere (an FFI's async calls carry errno back with the result). */
GYRE_API size_t gyre_error_message(int32_t code, char *buf, size_t cap);

/* "GYRE_OK", "GYRE_ERR_OUT_OF_BLOCKS", ...; "GYRE_ERR_UNKNOWN" for other values. */
GYRE_API const char *gyre_status_name(int32_t status);

/* ------------------------------------------------------------------------------------ */
/* Library and device                                                                    */
/* ------------------------------------------------------------------------------------ */

GYRE_API int32_t gyre_abi_version(void);          /* GYRE_ABI_VERSION of the build */
GYRE_API const char *gyre_backend(void);          /* "cpu" or "cuda" */
GYRE_API int32_t gyre_device_count(void);         /* CPU: 1; CUDA: visible devices */
GYRE_API gyre_status gyre_device_name(int32_t device, char *buf, size_t cap);
/* Selects the device for models created afterwards (CPU: only 0); a cache or trainer lives
 * on its model's device. The selection is process-wide, not per thread: a caller creating
 * models on several devices serialises each (set_device, create) pair. A device outside
 * [0, gyre_device_count()) fails with GYRE_ERR_INVALID_ARGUMENT. */
GYRE_API gyre_status gyre_set_device(int32_t device);
/* The process default of the host threads used by compute (CPU: OpenMP threads; 0 = one per
 * core), for models without their own count (gyre_model_set_threads). */
GYRE_API void gyre_set_num_threads(int32_t n);
GYRE_API int32_t gyre_num_threads(void);

/* ------------------------------------------------------------------------------------ */
/* Model configuration and parameter layout                                              */
/* ------------------------------------------------------------------------------------ */

/* The fields of Hugging Face's LlamaConfig, with the same meaning. head_dim as LlamaConfig's:
 * 0 means hidden_size / num_attention_heads (which must then divide), any other value is
 * used as it is, whether or not head_dim * num_attention_heads == hidden_size (q_proj is
 * [H*hd, D], k/v_proj [KV*hd, D], o_proj [D, H*hd]); it must be even (rotate-half RoPE),
 * and RoPE rotates all of it.
 * Architecture options (the decoder is Llama's with these):
 *   qkv_bias  q_proj, k_proj and v_proj have biases (Qwen2ForCausalLM); o_proj has none
 *   qk_norm   an RMSNorm over each head's q and k (weights q_norm [hd], k_norm [hd], eps
 *             rms_norm_eps) after the projections and before RoPE (Qwen3ForCausalLM)
 * RoPE scaling (LlamaConfig.rope_scaling), by rope_type:
 *   GYRE_ROPE_DEFAULT  inv_freq_j = 1 / theta^(2j / head_dim); the rope_* fields are unused
 *   GYRE_ROPE_LINEAR   inv_freq_j / rope_factor
 *   GYRE_ROPE_LLAMA3   Llama 3.1's frequency-dependent scaling (transformers'
 *                      _compute_llama3_parameters): wavelengths above
 *                      rope_original_max_position_embeddings / rope_low_freq_factor are
 *                      divided by rope_factor, those below .. / rope_high_freq_factor kept,
 *                      the ones between interpolated smoothly.
 *   GYRE_ROPE_YARN     YaRN (transformers' _compute_yarn_parameters): inv_freq_j blends
 *                      inv_freq_j / rope_factor (interpolation) and inv_freq_j
 *                      (extrapolation) by a linear ramp over the dimensions between the
 *                      correction dims of rope_beta_fast (0: 32) and rope_beta_slow (0: 1)
 *                      rotations in rope_original_max_position_embeddings (0:
 *                      max_position_embeddings) positions, floored and ceiled when
 *                      rope_truncate is 1; cos and sin are multiplied by the attention
 *                      factor: rope_attention_factor when > 0, else from rope_mscale and
 *                      rope_mscale_all_dim (both > 0: mscale(factor, rope_mscale) /
 *                      mscale(factor, rope_mscale_all_dim)), else mscale(factor), with
 *                      mscale(s, m) = s <= 1 ? 1 : 0.1 m ln(s) + 1
 *                      (gyre_rope_attention_scaling). */
typedef enum gyre_rope_type {
  GYRE_ROPE_DEFAULT = 0,
  GYRE_ROPE_LINEAR = 1,
  GYRE_ROPE_LLAMA3 = 2,
  GYRE_ROPE_YARN = 3
} gyre_rope_type;

typedef struct gyre_config {
  int32_t vocab_size;
  int32_t hidden_size;
  int32_t intermediate_size;
  int32_t num_hidden_layers;
  int32_t num_attention_heads;
  int32_t num_key_value_heads;    /* divides num_attention_heads (grouped-query attention) */
  int32_t max_position_embeddings;
  int32_t tie_word_embeddings;    /* 0 or 1: lm_head shares model.embed_tokens.weight */
  double rms_norm_eps;
  double rope_theta;
  int32_t rope_type;              /* gyre_rope_type */
  int32_t rope_original_max_position_embeddings; /* LLAMA3: > 0; YARN: >= 0 */
  double rope_factor;             /* LINEAR, LLAMA3, YARN: > 0 */
  double rope_low_freq_factor;    /* LLAMA3: > 0 */
  double rope_high_freq_factor;   /* LLAMA3: > rope_low_freq_factor */
  int32_t head_dim;               /* 0: hidden_size / num_attention_heads; else >= 2, even */
  int32_t qkv_bias;               /* 0 or 1 */
  int32_t qk_norm;                /* 0 or 1 */
  int32_t rope_truncate;          /* YARN: 0 or 1 */
  double rope_beta_fast;          /* YARN: >= 0 (0: 32) */
  double rope_beta_slow;          /* YARN: >= 0 (0: 1) */
  double rope_mscale;             /* YARN: >= 0 */
  double rope_mscale_all_dim;     /* YARN: >= 0 */
  double rope_attention_factor;   /* YARN: >= 0 (0: derived) */
} gyre_config;

/* GYRE_OK if the config is usable, else GYRE_ERR_INVALID_ARGUMENT naming the field. */
GYRE_API gyre_status gyre_config_check(const gyre_config *cfg);
/* Total number of F32 parameters (length of the flat vector). */
GYRE_API gyre_status gyre_param_count(const gyre_config *cfg, int64_t *count);
/* Number of named tensors in the layout. */
GYRE_API gyre_status gyre_param_tensor_count(const gyre_config *cfg, int32_t *count);
/* Tensor `index` of the layout: its HF name, offset in the flat vector, rank (1 or 2) and
 * shape (shape[1] = 0 for rank 1). */
GYRE_API gyre_status gyre_param_tensor(const gyre_config *cfg, int32_t index, char *name,
                                       size_t name_cap, int64_t *offset, int32_t *rank,
                                       int64_t shape[2]);

/* ------------------------------------------------------------------------------------ */
/* Model                                                                                 */
/* ------------------------------------------------------------------------------------ */

typedef struct gyre_model gyre_model;

/* Random initialisation as Hugging Face's LlamaPreTrainedModel: every projection and the
 * embedding ~ N(0, init_std^2) (init_std = initializer_range, 0.02 by default), every
 * RMSNorm weight = 1, every bias = 0. Deterministic given seed on every backend. */
GYRE_API gyre_status gyre_model_create(const gyre_config *cfg, uint64_t seed, float init_std,
                                       gyre_model **out);
/* A model from a safetensors file held in memory (e.g. model.safetensors read from disk
 * or an object store). Every tensor of the layout must be present, F32, of the exact shape;
 * lm_head.weight is ignored when tied and "*.rotary_emb.inv_freq" buffers are ignored; any
 * other tensor name, a short buffer, bad JSON, overlapping or out-of-range offsets fail
 * with GYRE_ERR_BAD_CHECKPOINT and a message naming the problem. */
GYRE_API gyre_status gyre_model_load(const gyre_config *cfg, const uint8_t *safetensors,
                                     size_t len, gyre_model **out);
/* Element types of stored tensors (safetensors' F32, F16, BF16). */
typedef enum gyre_dtype { GYRE_F32 = 0, GYRE_F16 = 1, GYRE_BF16 = 2 } gyre_dtype;

/* A model whose weights are all zero, to be filled tensor by tensor (gyre_model_read_tensor).
 * weight_dtype (gyre_dtype) is how it keeps its matrices (projections, embedding, lm_head):
 *   GYRE_F32            F32, as every other model
 *   GYRE_F16, GYRE_BF16 16-bit, as a checkpoint stores them (CPU backend; the CUDA backend
 *                       fails with GYRE_ERR_UNSUPPORTED): products widen each element exactly
 *                       to F32 as it is read and sum in F32, so logits are the bits an F32 model
 *                       holding the same (16-bit) values gives, from half the weight bytes.
 *                       Vectors (norms, biases) stay F32; values written in (set_weights,
 *                       read_tensor from another dtype) are rounded to nearest even; a trainer
 *                       needs F32 master weights, so gyre_trainer_create widens the model's
 *                       weights to F32 (exactly) for good. */
GYRE_API gyre_status gyre_model_create_zero(const gyre_config *cfg, int32_t weight_dtype, gyre_model **out);
/* The model's weight dtype now (GYRE_F32 after a trainer widened it). */
GYRE_API gyre_status gyre_model_weight_dtype(const gyre_model *model, int32_t *dtype);

/* Sets tensor `index` of the layout (gyre_param_tensor) from `nbytes` bytes of the file at
 * `path` starting at byte `offset`, elements of `dtype`. A matrix stored in the model's 16-bit
 * weight dtype is memory-mapped read-only (its pages read in at once, in parallel) and used
 * where it is: not copied, not converted (the file may be renamed or unlinked meanwhile, not
 * changed in place). Otherwise the values are converted (to F32 exactly: every F16 and BF16
 * value is an F32 value; into a 16-bit matrix rounded): the range is memory-mapped, read once
 * in order and unmapped as it is consumed, so the host never holds more than a bounded window
 * of the file. nbytes must be the tensor's element count times the dtype's size. */
GYRE_API gyre_status gyre_model_read_tensor(gyre_model *model, int32_t index, int32_t dtype,
                                            const char *path, int64_t offset, int64_t nbytes);
/* Copies tensor `index` out as `dtype` (F16 and BF16 rounded to nearest even; NaN stays
 * NaN) into out[cap]; the size is the element count times the dtype's size. */
GYRE_API gyre_status gyre_model_write_tensor(const gyre_model *model, int32_t index, int32_t dtype,
                                             uint8_t *out, size_t cap);
/* The RoPE inverse frequencies [head_dim / 2] the config rotates by (after scaling). */
GYRE_API gyre_status gyre_rope_inv_freq(const gyre_config *cfg, float *out, int32_t n);
/* The factor cos and sin are multiplied by (YARN's attention factor; 1 for the other types). */
GYRE_API gyre_status gyre_rope_attention_scaling(const gyre_config *cfg, float *out);

/* Serialises the weights as a safetensors file (F32, HF names, metadata {"format":"pt"}). */
GYRE_API gyre_status gyre_model_save(const gyre_model *model, uint8_t *out, size_t cap,
                                     size_t *len);
GYRE_API gyre_status gyre_model_config(const gyre_model *model, gyre_config *cfg);
/* Copy the flat parameter vector out / in (n must equal gyre_param_count). */
GYRE_API gyre_status gyre_model_get_weights(const gyre_model *model, float *out, int64_t n);
GYRE_API gyre_status gyre_model_set_weights(gyre_model *model, const float *in, int64_t n);
GYRE_API void gyre_model_free(gyre_model *model);
/* Host threads of this model's compute and its caches' and trainers' (CPU: the OpenMP team of
 * each call; 0, the default: gyre_set_num_threads'). Takes effect from the next call;
 * gyre_model_threads reports the count its calls use (CUDA: 1, the device computes). */
GYRE_API gyre_status gyre_model_set_threads(gyre_model *model, int32_t n);
GYRE_API gyre_status gyre_model_threads(const gyre_model *model, int32_t *n);

/* ------------------------------------------------------------------------------------ */
/* Paged KV cache and inference                                                          */
/* ------------------------------------------------------------------------------------ */

/* A fixed pool of num_blocks blocks of block_tokens tokens each, for one model. Each
 * sequence owns a block table; blocks are reference counted, so gyre_seq_fork shares the
 * parent's blocks and a later append copies only the shared, partly filled last block
 * (copy-on-write at the first divergent block). K and V are stored as kv_dtype:
 *   GYRE_KV_F32  4 bytes an element: the model's own F32 values
 *   GYRE_KV_F16  2 bytes an element (IEEE binary16, rounded to nearest even, saturating at
 *                +-65504): half the memory and the bytes a long-context decode step reads;
 *                attention still sums in F32. Both backends.
 * KV bytes per token are 2 * layers * kv_heads * head_dim * (4 or 2). */
typedef struct gyre_cache gyre_cache;

#define GYRE_KV_F32 0
#define GYRE_KV_F16 1

typedef struct gyre_cache_stats {
  int32_t block_tokens;
  int32_t num_blocks;
  int32_t used_blocks;      /* blocks referenced by at least one sequence */
  int32_t free_blocks;      /* num_blocks - used_blocks */
  int32_t pinned_blocks;    /* blocks referenced by a pinned sequence */
  int32_t num_sequences;    /* live sequences, including freed-but-pinned ones */
  int32_t kv_dtype;         /* GYRE_KV_F32 | GYRE_KV_F16 */
  int64_t bytes_per_token;  /* 2 * layers * kv_heads * head_dim * (4 or 2) */
  int64_t bytes_total;      /* bytes_per_token * block_tokens * num_blocks */
} gyre_cache_stats;

GYRE_API gyre_status gyre_cache_create(gyre_model *model, int32_t block_tokens,
                                       int32_t num_blocks, int32_t kv_dtype, gyre_cache **out);
GYRE_API gyre_status gyre_cache_stats_get(const gyre_cache *cache, gyre_cache_stats *out);
GYRE_API void gyre_cache_free(gyre_cache *cache);

/* Sequences are small integer ids, never reused within a cache. */
GYRE_API gyre_status gyre_seq_create(gyre_cache *cache, int32_t *seq);
/* A new sequence sharing all of parent's tokens (its blocks, reference counted). */
GYRE_API gyre_status gyre_seq_fork(gyre_cache *cache, int32_t parent, int32_t *child);
/* A new sequence sharing parent's first `length` tokens (0 < length <= parent's length): the
 * blocks that hold them, reference counted; its first append copies a shared, partly filled
 * last block, so the parent's K/V past `length` stays intact. */
GYRE_API gyre_status gyre_seq_fork_prefix(gyre_cache *cache, int32_t parent, int32_t length, int32_t *child);
/* Drops the sequence; its blocks return to the pool when no other sequence or pin holds
 * them. Freeing a pinned sequence defers the release of its blocks to gyre_seq_unpin. */
GYRE_API gyre_status gyre_seq_free(gyre_cache *cache, int32_t seq);
GYRE_API gyre_status gyre_seq_length(const gyre_cache *cache, int32_t seq, int32_t *len);
/* Number of blocks in the sequence's table. */
GYRE_API gyre_status gyre_seq_blocks(const gyre_cache *cache, int32_t seq, int32_t *blocks);

/* Sampling of the next token from a row of logits. temperature 0 is greedy (argmax, ties to
 * the lowest id); top_p in (0, 1] keeps the smallest set of most likely tokens whose
 * probability reaches top_p. The uniform draw is a pure function of (seed, counter), so a
 * sample is reproducible and independent of batch composition. */
typedef struct gyre_sampling {
  float temperature;
  float top_p;
  uint64_t seed;
} gyre_sampling;

/* Samples one token from logits[vocab]. *logprob is the token's log-probability under the
 * distribution actually sampled from: softmax(logits / temperature) restricted to the
 * top-p set and renormalised; for greedy (temperature 0) it is log-softmax(logits). */
GYRE_API gyre_status gyre_sample(int32_t vocab, const float *logits, const gyre_sampling *params,
                                 uint64_t counter, int32_t *token, float *logprob);

#define GYRE_LOGITS_NONE 0 /* no logits out */
#define GYRE_LOGITS_LAST 1 /* one row per sequence: after its last new token */
#define GYRE_LOGITS_ALL 2  /* one row per new token, in input order */

/* Batched prefill and decode: appends n_new[s] tokens to each of n_seqs distinct sequences
 * (tokens concatenated in the order of seq_ids), writes their K/V into the cache and runs
 * the model over them (a new token attends to its sequence's earlier tokens and itself;
 * its position is its index in the sequence). Decode is the case n_new[s] == 1.
 *   logits_mode  GYRE_LOGITS_NONE | LAST (n_seqs x vocab) | ALL (sum(n_new) x vocab)
 *   sampling     NULL, or n_seqs entries: then sampled[s] / sampled_logprobs[s] receive a
 *                token drawn from sequence s's last logits with counter = the sequence's
 *                length after the append (see gyre_sample).
 * Blocks for all sequences are reserved before anything is computed: if the pool is short,
 * the call fails with GYRE_ERR_OUT_OF_BLOCKS and changes nothing. Pinned sequences cannot
 * be appended to (GYRE_ERR_STATE). */
GYRE_API gyre_status gyre_forward(gyre_cache *cache, int32_t n_seqs, const int32_t *seq_ids,
                                  const int32_t *n_new, const int32_t *tokens,
                                  int32_t logits_mode, float *logits,
                                  const gyre_sampling *sampling, int32_t *sampled,
                                  float *sampled_logprobs);

/* KV hand-off between caches (processes, machines).
 *   pin     holds the sequence's blocks and freezes it (no append) until unpinned;
 *           pins nest.
 *   export  serialises the sequence's K/V (all layers) into a host buffer, format below;
 *   import  rebuilds it as a new sequence of another cache of a model with the same layers,
 *           kv_heads and head_dim (any block size, either kv_dtype: an F16 payload widens
 *           exactly into an F32 pool, an F32 payload is rounded into an F16 pool); a
 *           checksum or layout mismatch fails with GYRE_ERR_BAD_HANDOFF; a short pool with
 *           GYRE_ERR_OUT_OF_BLOCKS;
 *   unpin   after the destination acknowledged; releases the blocks if the sequence was
 *           freed meanwhile.
 * Decoding the imported sequence gives the same logits, bit for bit, on the same backend and
 * kv_dtype (an F16 sequence through an F32 pool and back too: the widening is exact).
 *
 * Export format (little endian):
 *   offset 0   char[4]  magic "GYKV"
 *          4   u32      format version (1)
 *          8   u32      num_hidden_layers
 *         12   u32      num_key_value_heads
 *         16   u32      head_dim
 *         20   u32      element size in bytes (4: F32, 2: F16; the exporting pool's kv_dtype)
 *         24   u32      length: number of tokens
 *         28   u32      reserved (0)
 *         32   u64      payload bytes = layers * 2 * length * kv_heads * head_dim * element size
 *         40   u64      FNV-1a 64-bit hash of the payload bytes
 *         48   payload: for each layer, K then V, each [length][kv_heads][head_dim] F32 or
 *                       F16 (K after RoPE, exactly as cached)
 */
GYRE_API gyre_status gyre_seq_pin(gyre_cache *cache, int32_t seq);
GYRE_API gyre_status gyre_seq_unpin(gyre_cache *cache, int32_t seq);
GYRE_API gyre_status gyre_seq_export(const gyre_cache *cache, int32_t seq, uint8_t *out,
                                     size_t cap, size_t *len);
GYRE_API gyre_status gyre_seq_import(gyre_cache *cache, const uint8_t *buf, size_t len,
                                     int32_t *seq);

/* FNV-1a 64 over len bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3). */
GYRE_API uint64_t gyre_checksum(const uint8_t *data, size_t len);

/* ------------------------------------------------------------------------------------ */
/* Training                                                                              */
/* ------------------------------------------------------------------------------------ */

/* A trainer owns the gradient buffer, the AdamW moments and the activations for chunks of up
 * to max_tokens tokens (allocated once, up front), and updates its model's weights in place.
 * A batch of any length trains in chunks of max_tokens rows (gyre_train_batch); its memory
 * beyond the fixed part is a few KB per token of the batch (gyre_trainer_memory). */
typedef struct gyre_trainer gyre_trainer;

/* A model with 16-bit weights gets F32 ones (widened exactly) for good: the master weights the
 * trainer updates (gyre_model_create_zero). */
GYRE_API gyre_status gyre_trainer_create(gyre_model *model, int32_t max_tokens,
                                         gyre_trainer **out);
GYRE_API void gyre_trainer_free(gyre_trainer *trainer);

#define GYRE_LOSS_SFT 0 /* loss_i = -logp_i */
#define GYRE_LOSS_PPO 1 /* decoupled PPO-clip with truncated importance weight, below */

/* Per loss term i (a token with parent >= 0), with logp_i = log pi_theta(tokens[i] | the
 * ancestors of i) where pi_theta = softmax(logits / temperature) (the distribution the
 * behaviour tokens were drawn from; entropy and token_logprobs are of it too), mu_i = behaviour log-prob, prox_i = proximal log-prob (NaN or a NULL
 * array: prox_i = mu_i; with proximal_current: prox_i = logp_i, the weights being trained
 * are the proximal policy, so r_i = 1), A_i = advantage:
 *   w_i = min(exp(prox_i - mu_i), is_cap)        (is_cap <= 0: no cap)
 *   r_i = exp(logp_i - prox_i)
 *   loss_i = -w_i * min(r_i * A_i, clip(r_i, 1 - clip_eps_low, 1 + clip_eps_high) * A_i)
 * (w_i is a constant: no gradient flows through it). The batch loss is
 * sum_i weights[i] * loss_i; normalisation is the caller's, through weights.
 * Staleness bound: with max_staleness >= 0, a term whose versions[i] >= 0 and
 * current_version - versions[i] > max_staleness is dropped (counted in stale_tokens). */
typedef struct gyre_loss_config {
  int32_t kind;            /* GYRE_LOSS_SFT or GYRE_LOSS_PPO */
  float clip_eps_low;
  float clip_eps_high;
  float is_cap;
  int32_t current_version;
  int32_t max_staleness;   /* < 0: no bound */
  int32_t proximal_current; /* nonzero: prox_i = logp_i (proximal_logprobs ignored) */
  float temperature;        /* > 0; 1: the model's own distribution */
} gyre_loss_config;

/* Means are unweighted over the trained terms (weight != 0, not stale). */
typedef struct gyre_train_stats {
  double loss;               /* sum_i weights[i] * loss_i */
  double weight_sum;         /* sum of weights over trained terms */
  double entropy;            /* mean entropy (nats) of the predictive distribution */
  double mean_logprob;       /* mean logp_i */
  double mean_ratio;         /* PPO: mean r_i; SFT: 1 */
  double clip_fraction;      /* PPO: share of terms whose clipped branch is active */
  double mean_is_weight;     /* PPO: mean w_i; SFT: 1 */
  double truncated_fraction; /* PPO: share of terms whose w_i hit is_cap */
  int32_t trained_tokens;
  int32_t stale_tokens;
} gyre_train_stats;

/* Forward (and, with backward != 0, backward) over a packed batch of n tokens forming a
 * forest (the PackedBatch of src/common/packed-batch.ts): token i attends to its ancestors
 * (following parents[], each < i, -1 for a root) and itself; RoPE rotates it by positions[i]
 * (in [0, max_position_embeddings)); loss term i predicts tokens[i] from the output at
 * parents[i]. Arrays are [n]. weights, advantages, behaviour_logprobs, proximal_logprobs and
 * versions may be NULL for SFT (weights NULL: every non-root token has weight 1); PPO needs
 * weights, advantages and behaviour_logprobs. Gradients are ADDED to the trainer's gradient
 * buffer (accumulation across batches). token_logprobs (may be NULL) receives logp_i for
 * each i, NaN for roots. stats may be NULL.
 *
 * Any n >= 1: the batch runs in chunks of max_tokens rows in index order. The forward runs
 * every chunk in order, keeping each layer's K (after RoPE) and V of every token; a chunk's
 * queries attend to their ancestors in earlier chunks through them. The backward runs the
 * chunks in reverse order, each recomputing its forward from the kept K/V (all but the last
 * chunk: checkpointing; each chunk's attention outputs are kept too, so it does not attend
 * again), and carries the gradients of earlier tokens' K and V back to them, so loss,
 * stats, token_logprobs and gradients equal those of one unchunked pass up to the order of
 * float sums. Memory beyond gyre_trainer_create's: the K/V (and, for n > max_tokens, their
 * gradients and attention outputs) of every token, kv_bytes_per_token of gyre_trainer_memory
 * (per layer: 6 x num_key_value_heads x head_dim floats, plus num_attention_heads x
 * (head_dim + 1) of attention output; CUDA: 4 x num_key_value_heads x head_dim plus the same,
 * on the device), plus about 40 bytes per token and 8 per ancestor range of the forest on the host
 * (CUDA: as many again on the device); released on return. */
GYRE_API gyre_status gyre_train_batch(gyre_trainer *trainer, int32_t n, const int32_t *tokens,
                                      const int32_t *parents, const int32_t *positions,
                                      const float *weights, const float *advantages,
                                      const float *behaviour_logprobs,
                                      const float *proximal_logprobs, const int32_t *versions,
                                      const gyre_loss_config *loss, int32_t backward,
                                      float *token_logprobs, gyre_train_stats *stats);

/* What a trainer allocates, in bytes. */
typedef struct gyre_trainer_memory_info {
  int64_t fixed_bytes;        /* gyre_trainer_create's: activations of max_tokens rows, gradients,
                                 AdamW moments, the K/V of a max_tokens batch */
  int64_t kv_bytes_per_token; /* a batch longer than max_tokens: its K/V and their gradients,
                                 per token, all layers */
  int64_t last_batch_bytes;   /* the K/V store the last gyre_train_batch allocated beyond
                                 fixed_bytes (0 when its n <= max_tokens) */
} gyre_trainer_memory_info;

GYRE_API gyre_status gyre_trainer_memory(const gyre_trainer *trainer, gyre_trainer_memory_info *out);

/* Gradient buffer (flat layout): zero, copy out, overwrite, add scale * in. */
GYRE_API gyre_status gyre_trainer_zero_grads(gyre_trainer *trainer);
GYRE_API gyre_status gyre_trainer_get_grads(const gyre_trainer *trainer, float *out, int64_t n);
GYRE_API gyre_status gyre_trainer_set_grads(gyre_trainer *trainer, const float *in, int64_t n);
GYRE_API gyre_status gyre_trainer_add_grads(gyre_trainer *trainer, const float *in, int64_t n,
                                            float scale);

/* AdamW as torch.optim.AdamW (decoupled weight decay on every parameter, bias-corrected
 * moments), after clipping the gradient to a global L2 norm of max_grad_norm as
 * torch.nn.utils.clip_grad_norm_ (scale min(1, max_grad_norm / (norm + 1e-6)); <= 0: no
 * clipping). The gradient buffer is left unchanged (zero it for the next step). */
typedef struct gyre_adamw {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float max_grad_norm;
} gyre_adamw;

/* One optimizer step; *grad_norm (may be NULL) receives the norm before clipping. */
GYRE_API gyre_status gyre_trainer_step(gyre_trainer *trainer, const gyre_adamw *opt,
                                       float *grad_norm);
GYRE_API gyre_status gyre_trainer_step_count(const gyre_trainer *trainer, int64_t *steps);
/* Optimizer state as a safetensors file: tensors "exp_avg.<name>" and "exp_avg_sq.<name>"
 * for each layout tensor, metadata {"format":"gyre-adamw","step":"<n>"}. Loading checks
 * names and shapes as gyre_model_load does. */
GYRE_API gyre_status gyre_trainer_save_optimizer(const gyre_trainer *trainer, uint8_t *out,
                                                 size_t cap, size_t *len);
GYRE_API gyre_status gyre_trainer_load_optimizer(gyre_trainer *trainer, const uint8_t *buf,
                                                 size_t len);

#ifdef __cplusplus
}
#endif

#endif /* GYRE_H */
