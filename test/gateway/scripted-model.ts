/**
 * A Hugging Face model directory whose weights are set by hand so that the real engine
 * generates one fixed turn whatever the prompt: reasoning, then a tool call.
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

const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
const added = ["<think>", "</think>", "<tool_call>", "</tool_call>", REASONING, CALL_JSON]

/** The generated turn's tokens, after the generation prompt's `\n` (byte 10). */
const script = ["\n", "<think>", REASONING, "</think>", "<tool_call>", CALL_JSON, "</tool_call>", "<|im_end|>"]

/** A read_file function tool, as chat, Responses and Messages requests offer it. */
export const readFileSchema = { type: "object", properties: { path: { type: "string" } }, required: ["path"] }

export const writeScriptedModel = (dir: string) => {
  const chars = byteChars()
  const vocab: Record<string, number> = Object.fromEntries(chars.map((c, i) => [c, i]))
  const idOf = new Map<string, number>([["\n", 10]])
  const addedTokens = [...specials, ...added].map((content, i) => {
    idOf.set(content, 256 + i)
    return { id: 256 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: specials.includes(content) }
  })
  const vocabSize = 256 + addedTokens.length
  const hidden = 32
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
    bos_token_id: idOf.get("<|endoftext|>"),
    eos_token_id: idOf.get("<|im_end|>")
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
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: [idOf.get("<|im_end|>"), idOf.get("<|endoftext|>")] }))
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
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: "<|endoftext|>", eos_token: "<|im_end|>", chat_template: chatmlToolsTemplate }))
  return dir
}
