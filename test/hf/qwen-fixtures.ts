/**
 * Qwen model directories generated for the tests: the chat templates of Qwen2.5-Instruct and
 * Qwen3 as their published tokenizer_config.json files carry them (tools in the system turn,
 * calls as `<tool_call>` blocks, results as `<tool_response>` user turns; Qwen3's `<think>`
 * blocks and `enable_thinking`), a Qwen2-style tokenizer.json (NFC, Qwen2's split pattern,
 * the ChatML and tool-call added tokens), and config.json + random weights of
 * `Qwen2ForCausalLM` or `Qwen3ForCausalLM` written by the independent writer of fixtures.ts.
 */
import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import { type LlamaConfig, architectures } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { rng, runEngine } from "../engine/helpers.ts"
import { type Tensor, trainedByteLevelTokenizer, writeSafetensors } from "./fixtures.ts"

/** Qwen2.5-Instruct's chat_template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct). */
export const qwen25Template = [
  "{%- if tools %}",
  "    {{- '<|im_start|>system\\n' }}",
  "    {%- if messages[0]['role'] == 'system' %}",
  "        {{- messages[0]['content'] }}",
  "    {%- else %}",
  "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}",
  "    {%- endif %}",
  '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}',
  "    {%- for tool in tools %}",
  '        {{- "\\n" }}',
  "        {{- tool | tojson }}",
  "    {%- endfor %}",
  '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}',
  "{%- else %}",
  "    {%- if messages[0]['role'] == 'system' %}",
  "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}",
  "    {%- else %}",
  "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}",
  "    {%- endif %}",
  "{%- endif %}",
  "{%- for message in messages %}",
  '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}',
  "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
  '    {%- elif message.role == "assistant" %}',
  "        {{- '<|im_start|>' + message.role }}",
  "        {%- if message.content %}",
  "            {{- '\\n' + message.content }}",
  "        {%- endif %}",
  "        {%- for tool_call in message.tool_calls %}",
  "            {%- if tool_call.function is defined %}",
  "                {%- set tool_call = tool_call.function %}",
  "            {%- endif %}",
  "            {{- '\\n<tool_call>\\n{\"name\": \"' }}",
  "            {{- tool_call.name }}",
  "            {{- '\", \"arguments\": ' }}",
  "            {{- tool_call.arguments | tojson }}",
  "            {{- '}\\n</tool_call>' }}",
  "        {%- endfor %}",
  "        {{- '<|im_end|>\\n' }}",
  '    {%- elif message.role == "tool" %}',
  '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}',
  "            {{- '<|im_start|>user' }}",
  "        {%- endif %}",
  "        {{- '\\n<tool_response>\\n' }}",
  "        {{- message.content }}",
  "        {{- '\\n</tool_response>' }}",
  '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}',
  "            {{- '<|im_end|>\\n' }}",
  "        {%- endif %}",
  "    {%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}",
  "    {{- '<|im_start|>assistant\\n' }}",
  "{%- endif %}",
  ""
].join("\n")

/** Qwen3's chat_template (tokenizer_config.json of Qwen/Qwen3-*): reasoning in <think> blocks, kept only after the last user query. */
export const qwen3Template = [
  "{%- if tools %}",
  "    {{- '<|im_start|>system\\n' }}",
  "    {%- if messages[0].role == 'system' %}",
  "        {{- messages[0].content + '\\n\\n' }}",
  "    {%- endif %}",
  '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}',
  "    {%- for tool in tools %}",
  '        {{- "\\n" }}',
  "        {{- tool | tojson }}",
  "    {%- endfor %}",
  '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}',
  "{%- else %}",
  "    {%- if messages[0].role == 'system' %}",
  "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
  "    {%- endif %}",
  "{%- endif %}",
  "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}",
  "{%- for message in messages[::-1] %}",
  "    {%- set index = (messages|length - 1) - loop.index0 %}",
  "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}",
  "        {%- set ns.multi_step_tool = false %}",
  "        {%- set ns.last_query_index = index %}",
  "    {%- endif %}",
  "{%- endfor %}",
  "{%- for message in messages %}",
  "    {%- if message.content is string %}",
  "        {%- set content = message.content %}",
  "    {%- else %}",
  "        {%- set content = '' %}",
  "    {%- endif %}",
  '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}',
  "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}",
  '    {%- elif message.role == "assistant" %}',
  "        {%- set reasoning_content = '' %}",
  "        {%- if message.reasoning_content is string %}",
  "            {%- set reasoning_content = message.reasoning_content %}",
  "        {%- else %}",
  "            {%- if '</think>' in content %}",
  "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}",
  "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}",
  "            {%- endif %}",
  "        {%- endif %}",
  "        {%- if loop.index0 > ns.last_query_index %}",
  "            {%- if loop.last or (not loop.last and reasoning_content) %}",
  "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}",
  "            {%- else %}",
  "                {{- '<|im_start|>' + message.role + '\\n' + content }}",
  "            {%- endif %}",
  "        {%- else %}",
  "            {{- '<|im_start|>' + message.role + '\\n' + content }}",
  "        {%- endif %}",
  "        {%- if message.tool_calls %}",
  "            {%- for tool_call in message.tool_calls %}",
  "                {%- if (loop.first and content) or (not loop.first) %}",
  "                    {{- '\\n' }}",
  "                {%- endif %}",
  "                {%- if tool_call.function %}",
  "                    {%- set tool_call = tool_call.function %}",
  "                {%- endif %}",
  "                {{- '<tool_call>\\n{\"name\": \"' }}",
  "                {{- tool_call.name }}",
  "                {{- '\", \"arguments\": ' }}",
  "                {%- if tool_call.arguments is string %}",
  "                    {{- tool_call.arguments }}",
  "                {%- else %}",
  "                    {{- tool_call.arguments | tojson }}",
  "                {%- endif %}",
  "                {{- '}\\n</tool_call>' }}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {{- '<|im_end|>\\n' }}",
  '    {%- elif message.role == "tool" %}',
  '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}',
  "            {{- '<|im_start|>user' }}",
  "        {%- endif %}",
  "        {{- '\\n<tool_response>\\n' }}",
  "        {{- content }}",
  "        {{- '\\n</tool_response>' }}",
  '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}',
  "            {{- '<|im_end|>\\n' }}",
  "        {%- endif %}",
  "    {%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}",
  "    {{- '<|im_start|>assistant\\n' }}",
  "    {%- if enable_thinking is defined and enable_thinking is false %}",
  "        {{- '<think>\\n\\n</think>\\n\\n' }}",
  "    {%- endif %}",
  "{%- endif %}"
].join("\n")

/** The added tokens of Qwen2.5's and Qwen3's tokenizers that the templates write (special as there). */
export const qwenAdded = (type: "qwen2" | "qwen3") => [
  { content: "<|endoftext|>" },
  { content: "<|im_start|>" },
  { content: "<|im_end|>" },
  { content: "<tool_call>", special: false },
  { content: "</tool_call>", special: false },
  ...(type === "qwen3"
    ? [{ content: "<tool_response>", special: false }, { content: "</tool_response>", special: false }, { content: "<think>", special: false }, { content: "</think>", special: false }]
    : [])
]

/** A Qwen2-style tokenizer.json (merges learned from the tests' corpus and the templates' text) with Qwen's added tokens. */
export const qwenTokenizer = (type: "qwen2" | "qwen3") => {
  const made = tokenizers.get(type) ?? trainedByteLevelTokenizer({ style: "qwen2", count: 200, corpus: `${qwen25Template}\n${qwen3Template}\nread_file path a.txt hello world`, added: qwenAdded(type) })
  tokenizers.set(type, made)
  return made
}
const tokenizers = new Map<string, ReturnType<typeof trainedByteLevelTokenizer>>()

/** Ids of the tokenizer's added tokens by content, and its vocabulary size. */
export const qwenIds = (type: "qwen2" | "qwen3") => {
  const added = qwenTokenizer(type).added_tokens
  const id = (content: string) => added.find((t) => t.content === content)!.id
  return { endoftext: id("<|endoftext|>"), imStart: id("<|im_start|>"), imEnd: id("<|im_end|>"), vocabSize: added[added.length - 1]!.id + 1 }
}

/** A small Qwen2 (q/k/v biases) or Qwen3 (q/k norms, head_dim 16 with 4 heads over hidden 32) config. */
export const qwenConfig = (type: "qwen2" | "qwen3", vocab: number, extra: Partial<LlamaConfig> = {}): LlamaConfig => ({
  vocab_size: vocab,
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  max_position_embeddings: 256,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  tie_word_embeddings: type === "qwen2",
  model_type: type,
  ...(type === "qwen3" ? { head_dim: 16 } : {}),
  ...extra
})

/** config.json as the hub writes it for the architecture (HF field set, Qwen's window fields). */
export const qwenConfigJson = (c: LlamaConfig, extra: Record<string, unknown> = {}) => {
  const { model_type, rope_scaling, ...fields } = c
  const type = model_type ?? "llama"
  return {
    architectures: [architectures[type]],
    model_type: type,
    hidden_act: "silu",
    torch_dtype: "bfloat16",
    ...(type === "llama" ? {} : { use_sliding_window: false, sliding_window: 131072, max_window_layers: c.num_hidden_layers }),
    ...(type !== "qwen2" ? { attention_bias: false } : {}),
    ...fields,
    head_dim: fields.head_dim ?? fields.hidden_size / fields.num_attention_heads,
    rope_scaling: rope_scaling ?? null,
    ...extra
  }
}

/** Random values for every tensor of the layout (norm weights near 1, biases and weights around 0), by name. */
export const randomTensors = async (c: LlamaConfig, seed: number): Promise<Array<Tensor>> => {
  const layout = await runEngine(Effect.gen(function* () { return yield* (yield* Engine).layout(c) }))
  const next = rng(seed)
  return layout.map((t) => {
    const n = t.shape.reduce((a, b) => a * b, 1)
    const norm = t.name.endsWith("norm.weight")
    return { name: t.name, shape: t.shape, values: Float32Array.from({ length: n }, () => (norm ? 1 + (next() - 0.5) * 0.4 : (next() - 0.5) * 0.5)) }
  })
}

/**
 * A Qwen (or, without model_type, Llama) model directory: config.json, the weights in `dtype` (in two shards with an index when
 * `sharded`), tokenizer.json, tokenizer_config.json with the architecture's chat template, and
 * generation_config.json. Returns the tensors written.
 */
export const writeQwenModel = async (
  dir: string,
  c: LlamaConfig,
  options: { readonly dtype: "F32" | "BF16" | "F16"; readonly sharded: boolean; readonly seed: number; readonly configExtra?: Record<string, unknown> }
) => {
  const type = c.model_type === "qwen3" ? "qwen3" : "qwen2"
  const ids = qwenIds(type)
  const tensors = await randomTensors(c, options.seed)
  const half = Math.ceil(tensors.length / 2)
  const shards = options.sharded
    ? [
        { file: "model-00001-of-00002.safetensors", dtype: options.dtype, tensors: tensors.slice(0, half) },
        { file: "model-00002-of-00002.safetensors", dtype: options.dtype, tensors: tensors.slice(half) }
      ]
    : [{ file: "model.safetensors", dtype: options.dtype, tensors }]
  writeSafetensors(dir, shards)
  if (options.sharded) {
    const weight_map = Object.fromEntries(shards.flatMap((s) => s.tensors.map((t) => [t.name, s.file])))
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: { total_size: 0 }, weight_map }))
  }
  const torchDtype = { F32: "float32", BF16: "bfloat16", F16: "float16" }[options.dtype]
  const tokenIds = { bos_token_id: ids.endoftext, eos_token_id: ids.imEnd }
  writeFileSync(join(dir, "config.json"), JSON.stringify(qwenConfigJson(c, { torch_dtype: torchDtype, ...tokenIds, ...options.configExtra })))
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(qwenTokenizer(type)))
  const template = type === "qwen3" ? qwen3Template : qwen25Template
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: null, eos_token: "<|im_end|>", pad_token: "<|endoftext|>", chat_template: template }))
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ bos_token_id: ids.endoftext, eos_token_id: [ids.imEnd, ids.endoftext] }))
  return tensors
}
