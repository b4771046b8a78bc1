/**
 * Llama-shaped model configs sized in gigabytes of BF16 weights, for the benchmarks whose model
 * must be larger than the caches or a given size on disk (bench:engine's 16-bit-weights
 * section, bench:load). Each keeps its own widths; only the layer count is derived here.
 */
import { headDim, type LlamaConfig } from "../src/engine/config.ts"

/** `shape` with as many layers (at least one) as make its parameters `gb` GB at 2 bytes each:
 * per layer q, k, v, o, gate, up, down and two norms; the embedding once when tied, else twice. */
export const sizedLlama = (gb: number, shape: Omit<LlamaConfig, "num_hidden_layers">): LlamaConfig => {
  const D = shape.hidden_size
  const hd = headDim({ ...shape, num_hidden_layers: 1 })
  const perLayer = 2 * D * hd * (shape.num_attention_heads + shape.num_key_value_heads) + 3 * D * shape.intermediate_size + 2 * D
  const embeddings = (shape.tie_word_embeddings ? 1 : 2) * shape.vocab_size * D
  return { ...shape, num_hidden_layers: Math.max(1, Math.round((gb * 1e9) / 2 / perLayer - embeddings / perLayer)) }
}
