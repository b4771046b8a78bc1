/**
 * Model presets. Both use the byte-level tokenizer's vocabulary (256 bytes + 16 special
 * slots) and contexts up to 8192 tokens.
 *   tiny   ~0.8M parameters: fits the 2-core demo; tied embeddings
 *   small  ~25M parameters: the benchmark's larger model; untied lm_head
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
  }
} as const satisfies Record<string, LlamaConfig>

export type PresetName = keyof typeof presets
export const presetNames = Object.keys(presets) as ReadonlyArray<PresetName>
