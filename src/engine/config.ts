/**
 * The model configuration: the fields of Hugging Face's `LlamaConfig` that the engine reads,
 * with the same names, meaning and defaults, and the `config.json` a checkpoint carries.
 *
 * Architectures (`model_type`, also inferred from `architectures`): `llama`
 * (`LlamaForCausalLM`), `qwen2` (`Qwen2ForCausalLM`: biases on q_proj, k_proj and v_proj) and
 * `qwen3` (`Qwen3ForCausalLM`: an RMSNorm over each head's q and k before RoPE, `head_dim`
 * explicit). The config keeps `model_type` only for the Qwen ones.
 *
 * Reading (`parseConfigJson`) takes a `config.json` as the hub ships it: `head_dim` (default:
 * hidden_size // num_attention_heads; any even value, also one with head_dim x
 * num_attention_heads != hidden_size: q_proj [H*hd, D], k/v_proj [KV*hd, D], o_proj
 * [D, H*hd]), `num_key_value_heads` (default: `num_attention_heads`), `tie_word_embeddings`
 * (default false), `rope_theta` (default 10000), `rope_scaling` of types `linear`, `llama3`
 * and `yarn` (also under `rope_parameters`, transformers 5; the key `type` for `rope_type`),
 * `bos_token_id` / `eos_token_id` as a number or a list. Anything the engine does not
 * implement is refused with one line naming the field: another model_type or architecture,
 * activation or RoPE type, biases other than Qwen2's (`attention_bias`, `mlp_bias`), sliding
 * windows (`sliding_window` on Llama, `use_sliding_window` / `layer_types` on Qwen), partial
 * rotary embeddings, experts. A config has one form: `head_dim` is kept only where it is not
 * hidden_size / num_attention_heads, so equal configs compare equal.
 *
 * Writing (`toConfigJson`) gives the fields `transformers` expects for the architecture
 * (`architectures`, `model_type`), so a Gyre checkpoint loads there unchanged; extra fields of
 * the config it was read from are kept.
 */
import { Schema } from "effect"

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const Positive = Schema.Number.check(Schema.isGreaterThan(0))

/** `rope_scaling` the engine implements (gyre.h: gyre_rope_type). YaRN's optional fields keep
 * transformers' defaults when absent (original_max_position_embeddings: max_position_embeddings,
 * beta_fast 32, beta_slow 1, the attention factor from factor and the mscales, truncate true). */
export const RopeScaling = Schema.Union([
  Schema.Struct({ rope_type: Schema.Literal("linear"), factor: Positive }),
  Schema.Struct({
    rope_type: Schema.Literal("llama3"),
    factor: Positive,
    low_freq_factor: Positive,
    high_freq_factor: Positive,
    original_max_position_embeddings: PositiveInt
  }),
  Schema.Struct({
    rope_type: Schema.Literal("yarn"),
    factor: Positive,
    original_max_position_embeddings: Schema.optional(PositiveInt),
    beta_fast: Schema.optional(Positive),
    beta_slow: Schema.optional(Positive),
    mscale: Schema.optional(Positive),
    mscale_all_dim: Schema.optional(Positive),
    attention_factor: Schema.optional(Positive),
    truncate: Schema.optional(Schema.Boolean)
  })
])
export type RopeScaling = typeof RopeScaling.Type

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
  tie_word_embeddings: Schema.Boolean,
  rope_scaling: Schema.optional(RopeScaling),
  /** Absent: hidden_size / num_attention_heads (`headDim`). */
  head_dim: Schema.optional(PositiveInt),
  /** Absent: Llama. */
  model_type: Schema.optional(Schema.Literals(["qwen2", "qwen3"]))
})
export type LlamaConfig = typeof LlamaConfig.Type

/** The architectures the engine runs: `model_type` -> the `architectures` entry transformers loads. */
export const architectures = { llama: "LlamaForCausalLM", qwen2: "Qwen2ForCausalLM", qwen3: "Qwen3ForCausalLM" } as const
export type ModelType = keyof typeof architectures
const modelTypes = Object.keys(architectures) as ReadonlyArray<ModelType>

/** A config's model_type (`llama` when absent). */
export const modelType = (c: LlamaConfig): ModelType => c.model_type ?? "llama"

const TokenIds = Schema.NullOr(Schema.Union([Schema.Int, Schema.Array(Schema.Int)]))

/** `config.json` as read: the engine's fields, with HF's optional ones. */
const ConfigJson = Schema.Struct({
  ...LlamaConfig.fields,
  num_key_value_heads: Schema.optional(Schema.NullOr(PositiveInt)),
  rope_theta: Schema.optional(Positive),
  tie_word_embeddings: Schema.optional(Schema.Boolean),
  rms_norm_eps: Schema.optional(Positive),
  rope_scaling: Schema.optional(Schema.Unknown),
  rope_parameters: Schema.optional(Schema.Unknown),
  model_type: Schema.optional(Schema.String),
  architectures: Schema.optional(Schema.Array(Schema.String)),
  hidden_act: Schema.optional(Schema.String),
  head_dim: Schema.optional(Schema.NullOr(PositiveInt)),
  attention_bias: Schema.optional(Schema.Boolean),
  mlp_bias: Schema.optional(Schema.Boolean),
  sliding_window: Schema.optional(Schema.Unknown),
  use_sliding_window: Schema.optional(Schema.Boolean),
  layer_types: Schema.optional(Schema.Array(Schema.String)),
  partial_rotary_factor: Schema.optional(Schema.Number),
  bos_token_id: Schema.optional(TokenIds),
  eos_token_id: Schema.optional(TokenIds)
})

/** The head dimension, as LlamaConfig: `head_dim`, else hidden_size // num_attention_heads. */
export const headDim = (c: LlamaConfig): number => c.head_dim ?? Math.floor(c.hidden_size / c.num_attention_heads)

/** How a KV cache stores K and V: F32 (the model's own values) or F16 (half the bytes; sums stay F32). */
export type KvDtype = "f32" | "f16"
export const kvDtypes: ReadonlyArray<KvDtype> = ["f32", "f16"]

/** KV cache bytes per token: 2 x layers x kv_heads x head_dim x 4 (F32) or 2 (F16). */
export const kvBytesPerToken = (c: LlamaConfig, dtype: KvDtype = "f32"): number =>
  2 * c.num_hidden_layers * c.num_key_value_heads * headDim(c) * (dtype === "f16" ? 2 : 4)

/** A config.json field the engine cannot honour; the message is one line naming it. */
export class ConfigRefused extends Error {}

const refuse = (why: string): never => {
  throw new ConfigRefused(`config.json: ${why}`)
}

/** One line of a schema decode error (its paths name the field). */
const oneLine = (e: unknown) => (e instanceof Error ? e.message : String(e)).replace(/\s*\n\s*/g, "; ")

const ropeOf = (c: typeof ConfigJson.Type): { theta: number | undefined; scaling: RopeScaling | undefined } => {
  const field = c.rope_parameters !== undefined && c.rope_parameters !== null ? "rope_parameters" : "rope_scaling"
  const raw = field === "rope_parameters" ? c.rope_parameters : c.rope_scaling
  if (raw === undefined || raw === null) return { theta: c.rope_theta, scaling: undefined }
  if (typeof raw !== "object" || Array.isArray(raw)) return refuse(`${field} must be an object or null`)
  const r = Object.fromEntries(Object.entries(raw as Record<string, unknown>).filter(([, v]) => v !== null)) // null: transformers' default
  const type = r.rope_type ?? r.type ?? "default"
  const theta = typeof r.rope_theta === "number" ? r.rope_theta : c.rope_theta
  if (type === "default") return { theta, scaling: undefined }
  if (type !== "linear" && type !== "llama3" && type !== "yarn") return refuse(`${field}.rope_type '${String(type)}' is not supported (default, linear, llama3, yarn)`)
  try {
    return { theta, scaling: Schema.decodeUnknownSync(RopeScaling)({ ...r, rope_type: type }, { onExcessProperty: "ignore" }) }
  } catch (e) {
    return refuse(`${field} (${type}): ${oneLine(e)}`)
  }
}

/** The architecture of a config.json: its model_type, else the one its `architectures` names, else Llama. */
const architectureOf = (c: typeof ConfigJson.Type): ModelType => {
  const named = c.architectures?.[0]
  const byArchitecture = modelTypes.find((t) => architectures[t] === named)
  const type = c.model_type ?? byArchitecture ?? "llama"
  if (!modelTypes.includes(type as ModelType)) refuse(`model_type '${type}' is not supported (${modelTypes.join(", ")})`)
  if (named !== undefined && named !== architectures[type as ModelType]) {
    refuse(`architectures ['${named}'] is not ${architectures[type as ModelType]} (model_type '${type}')`)
  }
  return type as ModelType
}

/** Config fields asking for a part the engine does not have, each refused by name. */
const refuseUnsupported = (c: typeof ConfigJson.Type, type: ModelType, json: Record<string, unknown>) => {
  if (c.hidden_act !== undefined && c.hidden_act !== "silu") refuse(`hidden_act '${c.hidden_act}' is not 'silu'`)
  // Llama's and Qwen3's attention_bias also puts a bias on o_proj; Qwen2 has q/k/v biases whatever it says
  if (c.attention_bias === true && type !== "qwen2") refuse("attention_bias true is not supported")
  if (c.mlp_bias === true) refuse("mlp_bias true is not supported")
  if (type === "llama" && c.sliding_window !== undefined && c.sliding_window !== null) refuse("sliding_window is not supported")
  if (c.use_sliding_window === true) refuse("use_sliding_window true is not supported")
  const sliding = c.layer_types?.find((t) => t !== "full_attention")
  if (sliding !== undefined) refuse(`layer_types '${sliding}' is not supported (full_attention only)`)
  if (c.partial_rotary_factor !== undefined && c.partial_rotary_factor !== 1) refuse(`partial_rotary_factor ${c.partial_rotary_factor} is not supported (1 only)`)
  for (const field of ["num_experts", "num_local_experts", "n_routed_experts"]) {
    const n = json[field]
    if (typeof n === "number" && n > 0) refuse(`${field} ${n} is not supported (no mixture of experts)`)
  }
}

/** Parses a `config.json` value with HF's meanings and defaults (module comment). */
export const parseConfigJson = (json: unknown): LlamaConfig => {
  let c: typeof ConfigJson.Type
  try {
    c = Schema.decodeUnknownSync(ConfigJson)(json)
  } catch (e) {
    return refuse(oneLine(e))
  }
  const type = architectureOf(c)
  refuseUnsupported(c, type, json as Record<string, unknown>)
  const hd = c.head_dim ?? Math.floor(c.hidden_size / c.num_attention_heads)
  const { theta, scaling } = ropeOf(c)
  return {
    vocab_size: c.vocab_size,
    hidden_size: c.hidden_size,
    intermediate_size: c.intermediate_size,
    num_hidden_layers: c.num_hidden_layers,
    num_attention_heads: c.num_attention_heads,
    num_key_value_heads: c.num_key_value_heads ?? c.num_attention_heads,
    max_position_embeddings: c.max_position_embeddings,
    rms_norm_eps: c.rms_norm_eps ?? 1e-6,
    rope_theta: theta ?? 10000,
    tie_word_embeddings: c.tie_word_embeddings ?? false,
    ...(scaling === undefined ? {} : { rope_scaling: scaling }),
    ...(hd * c.num_attention_heads === c.hidden_size ? {} : { head_dim: hd }),
    ...(type === "llama" ? {} : { model_type: type })
  }
}

/** A token-id field that may be a number, a list or null, as a list. */
export const tokenIdList = (value: unknown): Array<number> =>
  typeof value === "number" ? [value] : Array.isArray(value) ? value.filter((v): v is number => typeof v === "number") : []

/** The fields transformers' config class of each architecture writes that the engine's config does not hold. */
const architectureDefaults: Record<ModelType, Record<string, unknown>> = {
  llama: { attention_bias: false, mlp_bias: false, pretraining_tp: 1 },
  qwen2: { use_sliding_window: false, sliding_window: null },
  qwen3: { attention_bias: false, use_sliding_window: false, sliding_window: null }
}

/**
 * The `config.json` of a checkpoint (`LlamaForCausalLM`, `Qwen2ForCausalLM` or
 * `Qwen3ForCausalLM`): `base` (the file it was read from, if any) with the engine's fields and
 * `torch_dtype` over it.
 */
export const toConfigJson = (c: LlamaConfig, dtype: string, base: Readonly<Record<string, unknown>> = {}) => {
  const type = modelType(c)
  return {
    hidden_act: "silu",
    attention_dropout: 0.0,
    initializer_range: 0.02,
    use_cache: true,
    ...architectureDefaults[type],
    ...base,
    ...c,
    architectures: [architectures[type]],
    model_type: type,
    head_dim: headDim(c),
    rope_scaling: c.rope_scaling ?? null,
    torch_dtype: dtype,
    ...("dtype" in base ? { dtype } : {}) // transformers 5's name for torch_dtype
  }
}
