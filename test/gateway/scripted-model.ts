/**
 * A Hugging Face model directory whose weights are set by hand so that the real engine
 * generates one fixed turn whatever the prompt (by default reasoning, then a tool call; any
 * `Script`: a template and the turn's tokens).
 *
 * The tokenizer is byte-level (ids 0..255 the bytes, no merges) with ChatML specials and
 * non-special added tokens for `<think>`, `</think>`, `<tool_call>`, `</tool_call>` and two
 * phrases (the reasoning text and the call's JSON). The model is a bigram: every layer's
 * output projections are zero, so the last hidden state is the current token's embedding;
 * each token of the script has its own embedding direction and the untied `lm_head` maps it
 * to the next token of the script with a margin of ~22 logits (the chance of any other token
 * is ~1e-7 per step at temperature 1). The prompt always ends with the template's generation
 * prompt `<|im_start|>assistant\n`, so every turn is
 *
 *   <think>Read the file first.</think><tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>
 *
 * The chat template is ChatML with tools (`chatmlToolsTemplate`: tools in the system turn,
 * calls as `<tool_call>` blocks, tool results as `<tool_response>`).
 */
import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { byteChars, chatmlToolsTemplate, writeSafetensors } from "../hf/fixtures.ts"

export const REASONING = "Read the file first."
export const CALL_ARGUMENTS = { path: "a.txt" }
const CALL_JSON = `\n{"name": "read_file", "arguments": ${JSON.stringify(CALL_ARGUMENTS).replace(":", ": ")}}\n`

/** A read_file function tool, as chat, Responses and Messages requests offer it. */
export const readFileSchema = { type: "object", properties: { path: { type: "string" } }, required: ["path"] }

/** A scripted turn: the template, its special tokens, and the tokens the model writes after the prompt's last one. */
export interface Script {
  readonly template: string
  /** Special tokens (the template's markers, bos and eos); the turn's other multi-character pieces are added tokens that are not special. */
  readonly specials: ReadonlyArray<string>
  readonly bos: string
  readonly eos: string
  /**
   * The prompt's last token (the end of the template's generation prompt), then the turn's
   * tokens, each distinct: single characters are byte tokens, longer pieces added tokens.
   */
  readonly turn: ReadonlyArray<string>
}

/** ChatML with Hermes calls: every turn is reasoning, then one read_file call (the default). */
export const hermesScript: Script = {
  template: chatmlToolsTemplate,
  specials: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
  bos: "<|endoftext|>",
  eos: "<|im_end|>",
  turn: ["\n", "<think>", REASONING, "</think>", "<tool_call>", CALL_JSON, "</tool_call>", "<|im_end|>"]
}

export const writeScriptedModel = (dir: string, scripted: Script = hermesScript) => {
  const { specials, turn: script } = scripted
  const chars = byteChars()
  const vocab: Record<string, number> = Object.fromEntries(chars.map((c, i) => [c, i]))
  const utf8 = new TextEncoder()
  const idOf = new Map<string, number>()
  for (const piece of script) if ([...utf8.encode(piece)].length === 1) idOf.set(piece, utf8.encode(piece)[0]!)
  const added = [...new Set([...specials, ...script.filter((piece) => !idOf.has(piece))])]
  const addedTokens = added.map((content, i) => {
    idOf.set(content, 256 + i)
    return { id: 256 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: specials.includes(content) }
  })
  if (new Set(script).size !== script.length) throw new Error("a scripted turn's tokens must be distinct (the model is a bigram)")
  const vocabSize = 256 + addedTokens.length
  const hidden = Math.max(32, Math.ceil(script.length / 8) * 8)
  const config = {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    hidden_act: "silu",
    torch_dtype: "float32",
    vocab_size: vocabSize,
    hidden_size: hidden,
    intermediate_size: hidden,
    num_hidden_layers: 1,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    max_position_embeddings: 8192,
    rms_norm_eps: 1e-5,
    rope_theta: 10000,
    tie_word_embeddings: false,
    bos_token_id: idOf.get(scripted.bos),
    eos_token_id: idOf.get(scripted.eos)
  }
  const zeros = (...shape: Array<number>) => ({ shape, values: new Float32Array(shape.reduce((a, b) => a * b, 1)) })
  const embed = zeros(vocabSize, hidden)
  const head = zeros(vocabSize, hidden)
  script.slice(0, -1).forEach((token, k) => {
    embed.values[idOf.get(token)! * hidden + k] = 1
    head.values[idOf.get(script[k + 1]!)! * hidden + k] = 4
  })
  const ones = { shape: [hidden], values: new Float32Array(hidden).fill(1) }
  const layer = "model.layers.0"
  const tensors = [
    { name: "model.embed_tokens.weight", ...embed },
    { name: `${layer}.input_layernorm.weight`, ...ones },
    { name: `${layer}.self_attn.q_proj.weight`, ...zeros(hidden, hidden) },
    { name: `${layer}.self_attn.k_proj.weight`, ...zeros(hidden / 2, hidden) },
    { name: `${layer}.self_attn.v_proj.weight`, ...zeros(hidden / 2, hidden) },
    { name: `${layer}.self_attn.o_proj.weight`, ...zeros(hidden, hidden) },
    { name: `${layer}.post_attention_layernorm.weight`, ...ones },
    { name: `${layer}.mlp.gate_proj.weight`, ...zeros(hidden, hidden) },
    { name: `${layer}.mlp.up_proj.weight`, ...zeros(hidden, hidden) },
    { name: `${layer}.mlp.down_proj.weight`, ...zeros(hidden, hidden) },
    { name: "model.norm.weight", ...ones },
    { name: "lm_head.weight", ...head }
  ]
  writeSafetensors(dir, [{ file: "model.safetensors", dtype: "F32", tensors }])
  writeFileSync(join(dir, "config.json"), JSON.stringify(config))
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: [...new Set([idOf.get(scripted.eos), idOf.get(scripted.bos)])] }))
  const tokenizer = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] }
  }
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizer))
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: scripted.bos, eos_token: scripted.eos, chat_template: scripted.template }))
  return dir
}
