/**
 * Model presets. All use the byte-level tokenizer's vocabulary (256 bytes + 16 special
 * slots).
 *   tiny       ~0.8M parameters, contexts up to 8192: fits the 2-core demo; tied embeddings
 *   small      ~25M parameters, contexts up to 8192: the benchmark's larger model; untied lm_head
 *   tiny-long  ~0.3M parameters, contexts up to 1,048,576 (2^20): attention cheap enough that a
 *              1M-token execution tree with 64k-token contexts is prefilled and trained on 2
 *              cores (2 layers, 2 query heads sharing 1 kv head of head_dim 32, rope_theta 5e5);
 *              its KV cache holds 512 bytes per token (F32; 256 with F16 KV), a training batch
 *              1.5 KB per token of K/V and their gradients (ARCHITECTURE.md, "Native engine")
 */
import type { LlamaConfig } from "./config.ts"
import { VOCAB_SIZE } from "./tokenizer.ts"

export const presets = {
  tiny: {
    vocab_size: VOCAB_SIZE,
    hidden_size: 128,
    intermediate_size: 384,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    max_position_embeddings: 8192,
    rms_norm_eps: 1e-5,
    rope_theta: 10000,
    tie_word_embeddings: true
  },
  small: {
    vocab_size: VOCAB_SIZE,
    hidden_size: 512,
    intermediate_size: 1536,
    num_hidden_layers: 8,
    num_attention_heads: 8,
    num_key_value_heads: 4,
    max_position_embeddings: 8192,
    rms_norm_eps: 1e-5,
    rope_theta: 10000,
    tie_word_embeddings: false
  },
  "tiny-long": {
    vocab_size: VOCAB_SIZE,
    hidden_size: 128,
    intermediate_size: 320,
    num_hidden_layers: 2,
    num_attention_heads: 2,
    num_key_value_heads: 1,
    head_dim: 32,
    max_position_embeddings: 1_048_576,
    rms_norm_eps: 1e-5,
    rope_theta: 500_000,
    tie_word_embeddings: true
  }
} as const satisfies Record<string, LlamaConfig>

export type PresetName = keyof typeof presets
export const presetNames = Object.keys(presets) as ReadonlyArray<PresetName>
