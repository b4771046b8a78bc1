/**
 * The model configuration: the fields of Hugging Face's `LlamaConfig` that the engine reads,
 * with the same names and meaning, and the `config.json` a checkpoint carries.
 *
 * `config.json` is written with the fields the `transformers` library expects for a
 * `LlamaForCausalLM` (so a Gyre checkpoint loads there); reading accepts any extra fields but
 * refuses features the engine does not implement (biases, RoPE scaling, another activation).
 */
import { Schema } from "effect"

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const Positive = Schema.Number.check(Schema.isGreaterThan(0))

export const LlamaConfig = Schema.Struct({
  vocab_size: PositiveInt,
  hidden_size: PositiveInt,
  intermediate_size: PositiveInt,
  num_hidden_layers: PositiveInt,
  num_attention_heads: PositiveInt,
  num_key_value_heads: PositiveInt,
  max_position_embeddings: PositiveInt,
  rms_norm_eps: Positive,
  rope_theta: Positive,
  tie_word_embeddings: Schema.Boolean
})
export type LlamaConfig = typeof LlamaConfig.Type

/** `config.json` as read: the engine's fields plus the optional ones it checks. */
const ConfigJson = Schema.Struct({
  ...LlamaConfig.fields,
  num_key_value_heads: Schema.optional(PositiveInt),
  rope_theta: Schema.optional(Positive),
  tie_word_embeddings: Schema.optional(Schema.Boolean),
  model_type: Schema.optional(Schema.String),
  hidden_act: Schema.optional(Schema.String),
  head_dim: Schema.optional(Schema.NullOr(PositiveInt)),
  attention_bias: Schema.optional(Schema.Boolean),
  mlp_bias: Schema.optional(Schema.Boolean),
  rope_scaling: Schema.optional(Schema.Unknown)
})

export const headDim = (c: LlamaConfig): number => c.hidden_size / c.num_attention_heads

/** KV cache bytes per token: 2 x layers x kv_heads x head_dim x 4 (F32). */
export const kvBytesPerToken = (c: LlamaConfig): number =>
  2 * c.num_hidden_layers * c.num_key_value_heads * headDim(c) * 4

/**
 * Parses a `config.json` value; the error names the offending field. Defaults as in
 * `LlamaConfig`: num_key_value_heads = num_attention_heads, rope_theta = 10000,
 * tie_word_embeddings = false.
 */
export const parseConfigJson = (json: unknown): LlamaConfig => {
  const c = Schema.decodeUnknownSync(ConfigJson)(json)
  const refuse = (why: string) => {
    throw new Error(`config.json: ${why}`)
  }
  if (c.model_type !== undefined && c.model_type !== "llama") refuse(`model_type '${c.model_type}' is not 'llama'`)
  if (c.hidden_act !== undefined && c.hidden_act !== "silu") refuse(`hidden_act '${c.hidden_act}' is not 'silu'`)
  if (c.attention_bias === true || c.mlp_bias === true) refuse("attention_bias / mlp_bias are not supported")
  if (c.rope_scaling !== undefined && c.rope_scaling !== null) refuse("rope_scaling is not supported")
  if (c.head_dim != null && c.head_dim * c.num_attention_heads !== c.hidden_size) {
    refuse(`head_dim ${c.head_dim} x num_attention_heads ${c.num_attention_heads} != hidden_size ${c.hidden_size}`)
  }
  return {
    vocab_size: c.vocab_size,
    hidden_size: c.hidden_size,
    intermediate_size: c.intermediate_size,
    num_hidden_layers: c.num_hidden_layers,
    num_attention_heads: c.num_attention_heads,
    num_key_value_heads: c.num_key_value_heads ?? c.num_attention_heads,
    max_position_embeddings: c.max_position_embeddings,
    rms_norm_eps: c.rms_norm_eps,
    rope_theta: c.rope_theta ?? 10000,
    tie_word_embeddings: c.tie_word_embeddings ?? false
  }
}

/** The `config.json` of a checkpoint (Hugging Face `LlamaForCausalLM`, F32). */
export const toConfigJson = (c: LlamaConfig, extra: Readonly<Record<string, unknown>> = {}) => ({
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  hidden_act: "silu",
  torch_dtype: "float32",
  attention_bias: false,
  attention_dropout: 0.0,
  mlp_bias: false,
  rope_scaling: null,
  initializer_range: 0.02,
  pretraining_tp: 1,
  use_cache: true,
  head_dim: headDim(c),
  ...c,
  ...extra
})
