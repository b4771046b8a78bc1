/**
 * Hugging Face model directories generated for the tests: two small tokenizer.json files
 * (byte-level BPE as GPT-2 / Llama 3 / SmolLM2 build them, and BPE with byte fallback as
 * Llama 2 / TinyLlama do), their tokenizer_config.json with a chat template, and a writer of
 * safetensors weights that shares no code with Gyre's (python3's struct module: F32, F16 by
 * struct's own "e" format, BF16 by rounding to nearest even).
 */
import { spawnSync } from "node:child_process"
import { mkdirSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import { Engine } from "../../src/engine/engine.ts"
import { rng, runEngine } from "../engine/helpers.ts"

/** GPT-2's bytes_to_unicode: the printable character standing for each byte. */
export const byteChars = (): Array<string> => {
  const keep = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)
  let extra = 0
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(keep(b) ? b : 256 + extra++))
}

/** ChatML-style special tokens (SmolLM2) of the byte-level fixture, after its merges. */
export const chatmlSpecials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

const addedTokens = (specials: ReadonlyArray<string>, first: number) =>
  specials.map((content, i) => ({ id: first + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }))

/** Byte-level BPE: ids 0..255 the bytes (GPT-2 order), then the merges' results, then the specials. */
export const byteLevelTokenizer = () => {
  const chars = byteChars()
  const vocab: Record<string, number> = Object.fromEntries(chars.map((c, i) => [c, i]))
  const merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ t", "Ġt o", "Ċ Ċ"]
  for (const m of merges) vocab[m.replace(" ", "")] = Object.keys(vocab).length
  const first = Object.keys(vocab).length
  return {
    json: {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: addedTokens(chatmlSpecials, first),
      normalizer: null,
      pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
      post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges }
    },
    ids: { hello: vocab.hello!, Ġworld: vocab["Ġworld"]!, Ġto: vocab["Ġto"]!, ĊĊ: vocab["ĊĊ"]!, im_start: first + 1, im_end: first + 2, endoftext: first },
    vocabSize: first + chatmlSpecials.length
  }
}

/** Pre-tokenizer regexes of Llama 3 and Qwen2 tokenizer.json files (Split, then ByteLevel without its own regex). */
export const llama3Pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
export const qwen2Pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/** English-like text with digits, contractions, punctuation, accents and newlines, to learn merges from. */
export const mergeCorpus = [
  "The quick brown fox jumps over the lazy dog. It's 2024, and we're still here; they'll say we'd won.",
  "Hello world! Hello, hello... the world's biggest tokenizer test: 12345 + 678 = 13023.",
  "Don't stop. I'm sure you've seen it: caf\u00e9, na\u00efve, r\u00e9sum\u00e9, stra\u00dfe, \u00fcber.",
  "def tokenize(text):\n    return [t for t in text.split()]  # whitespace   runs\n\n",
  "    indented line\n\tTabbed\r\nwindows line\n<html><body>tokens</body></html>"
].join("\n")

/**
 * A byte-level BPE tokenizer.json whose merges are learned from `corpus` (the most frequent
 * adjacent pair of the GPT-2-pre-tokenized words, `count` times), with the pre-tokenizer and
 * normalizer of the given style, three whole words in the vocabulary that no merge spells
 * (" xyzzy", " unreachable", three spaces), and `added` tokens after them.
 */
export const trainedByteLevelTokenizer = (options: {
  readonly style: "gpt2" | "llama3" | "qwen2" | "smollm2"
  readonly addPrefixSpace?: boolean
  readonly count?: number
  readonly corpus?: string
  readonly added?: ReadonlyArray<{ readonly content: string; readonly special?: boolean; readonly normalized?: boolean; readonly lstrip?: boolean; readonly rstrip?: boolean }>
}) => {
  const chars = byteChars()
  const utf8 = new TextEncoder()
  const words = (options.corpus ?? mergeCorpus).match(/'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu) ?? []
  let symbols = words.map((w) => Array.from(utf8.encode(w), (b) => chars[b]!))
  const vocab: Record<string, number> = Object.fromEntries(chars.map((c, i) => [c, i]))
  let size = chars.length
  const merges: Array<string> = []
  for (let m = 0; m < (options.count ?? 300); m++) {
    const counts = new Map<string, number>()
    for (const w of symbols) for (let i = 0; i + 1 < w.length; i++) counts.set(`${w[i]} ${w[i + 1]}`, (counts.get(`${w[i]} ${w[i + 1]}`) ?? 0) + 1)
    const best = [...counts].reduce<[string, number] | undefined>((a, b) => (a === undefined || b[1] > a[1] ? b : a), undefined)
    if (best === undefined) break
    const [left, right] = best[0].split(" ") as [string, string]
    merges.push(best[0])
    if (vocab[left + right] === undefined) vocab[left + right] = size++
    symbols = symbols.map((w) => {
      const out: Array<string> = []
      for (let i = 0; i < w.length; i++) {
        if (w[i] === left && w[i + 1] === right) out.push(left + right), i++
        else out.push(w[i]!)
      }
      return out
    })
  }
  // whole words no merge spells (Llama 3 has such): what ignore_merges takes as they are
  for (const word of [" xyzzy", " unreachable", "   "]) vocab[Array.from(utf8.encode(word), (b) => chars[b]!).join("")] ??= size++
  const added = (options.added ?? []).map((t, i) => ({ id: size + i, content: t.content, single_word: false, lstrip: t.lstrip ?? false, rstrip: t.rstrip ?? false, normalized: t.normalized ?? false, special: t.special ?? true }))
  const split = (pattern: string) => ({ type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false })
  const byteLevel = (useRegex: boolean) => ({ type: "ByteLevel", add_prefix_space: options.addPrefixSpace ?? false, trim_offsets: true, use_regex: useRegex })
  const pre = {
    gpt2: byteLevel(true),
    llama3: { type: "Sequence", pretokenizers: [split(llama3Pattern), byteLevel(false)] },
    qwen2: { type: "Sequence", pretokenizers: [split(qwen2Pattern), byteLevel(false)] },
    smollm2: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true }, byteLevel(true)] }
  }[options.style]
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: options.style === "qwen2" ? { type: "NFC" } : null,
    pre_tokenizer: pre,
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: options.style === "llama3", vocab, merges }
  }
}

/** BPE with byte fallback (sentencepiece-converted, Llama 2 style): <unk> <s> </s>, <0x00>..<0xFF>, pieces. */
export const byteFallbackTokenizer = () => {
  const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2 }
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b
  for (const piece of ["▁", "h", "e", "l", "o", "w", "r", "d", "[", "]", "/", "I", "N", "S", "T"]) vocab[piece] = Object.keys(vocab).length
  const merges = ["h e", "l l", "he ll", "hell o", "▁ hello", "w o", "wo r", "wor l", "worl d", "▁ world", "I N", "IN S", "INS T", "[ INST", "[INST ]", "/ INST", "[ /INST", "[/INST ]"]
  for (const m of merges) vocab[m.replace(" ", "")] = Object.keys(vocab).length
  const special = (id: number, content: string) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })
  return {
    json: {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
      normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
      pre_tokenizer: null,
      post_processor: null,
      decoder: {
        type: "Sequence",
        decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }]
      },
      model: { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges }
    },
    ids: { "▁hello": vocab["▁hello"]!, "▁world": vocab["▁world"]!, "▁": vocab["▁"]!, byte: (b: number) => 3 + b, bos: 1, eos: 2 },
    vocabSize: Object.keys(vocab).length
  }
}

/** SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json carries it. */
export const smollm2Template =
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

/** A ChatML template with tools in the style of Qwen2.5's (tools listed in the system turn, calls as <tool_call> blocks). */
export const chatmlToolsTemplate = [
  "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}",
  "{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
  "{{- '\\n</tools>\\n\\nCall a function as <tool_call>\\n{\"name\": <name>, \"arguments\": <args>}\\n</tool_call><|im_end|>\\n' }}",
  "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}",
  "{%- for message in messages %}",
  "{%- if message.role == 'system' %}",
  "{%- elif message.role == 'assistant' and message.tool_calls %}{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}",
  "{%- for tc in message.tool_calls %}{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}",
  "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}",
  "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}",
  "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
].join("")

/** Llama 2's chat template (as TinyLlama's tokenizer_config.json carries it, shortened). */
export const llama2Template =
  "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"

export interface Tensor {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly values: ArrayLike<number>
}

const writer = `
import json, struct, sys
spec = json.load(open(sys.argv[1]))
def bf16(x):
    b = struct.unpack('<I', struct.pack('<f', x))[0]
    return (b + 0x7fff + ((b >> 16) & 1)) >> 16
for shard in spec['shards']:
    header, blobs, off = {'__metadata__': {'format': 'pt'}}, [], 0
    for t in shard['tensors']:
        d = shard['dtype']
        if d == 'F32': blob = struct.pack('<%df' % len(t['values']), *t['values'])
        elif d == 'F16': blob = struct.pack('<%de' % len(t['values']), *t['values'])
        else: blob = struct.pack('<%dH' % len(t['values']), *[bf16(v) for v in t['values']])
        header[t['name']] = {'dtype': d, 'shape': t['shape'], 'data_offsets': [off, off + len(blob)]}
        blobs.append(blob); off += len(blob)
    h = json.dumps(header).encode()
    with open(shard['path'], 'wb') as f:
        f.write(struct.pack('<Q', len(h))); f.write(h); f.write(b''.join(blobs))
`

/** Writes safetensors files with python3 (one dtype per file); returns nothing, throws on failure. */
export const writeSafetensors = (dir: string, shards: ReadonlyArray<{ readonly file: string; readonly dtype: "F32" | "F16" | "BF16"; readonly tensors: ReadonlyArray<Tensor> }>) => {
  mkdirSync(dir, { recursive: true })
  const spec = { shards: shards.map((s) => ({ path: join(dir, s.file), dtype: s.dtype, tensors: s.tensors.map((t) => ({ ...t, values: Array.from(t.values) })) })) }
  const specPath = join(dir, ".spec.json")
  writeFileSync(specPath, JSON.stringify(spec))
  const run = spawnSync("python3", ["-c", writer, specPath], { encoding: "utf8" })
  if (run.status !== 0) throw new Error(`python3 safetensors writer: ${run.stderr}`)
}

export const smolConfig = {
  vocab_size: byteLevelTokenizer().vocabSize,
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  max_position_embeddings: 1024,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  tie_word_embeddings: true
}

/** A SmolLM2-shaped model directory (tied embeddings) with random BF16 weights in two shards and an index, tokenizer files, generation_config. */
export const writeSmolModel = async (dir: string) => {
  const tok = byteLevelTokenizer()
  const layout = await runEngine(Effect.gen(function* () { return yield* (yield* Engine).layout(smolConfig) }))
  const next = rng(11)
  const tensors = layout.map((t) => ({
    name: t.name,
    shape: t.shape,
    values: Float32Array.from({ length: t.shape.reduce((a, b) => a * b, 1) }, () => (t.name.endsWith("norm.weight") ? 1 : (next() - 0.5) * 0.4))
  }))
  const half = Math.ceil(tensors.length / 2)
  const shards = [
    { file: "model-00001-of-00002.safetensors", dtype: "BF16" as const, tensors: tensors.slice(0, half) },
    { file: "model-00002-of-00002.safetensors", dtype: "BF16" as const, tensors: tensors.slice(half) }
  ]
  writeSafetensors(dir, shards)
  const weight_map = Object.fromEntries(shards.flatMap((s) => s.tensors.map((t) => [t.name, s.file])))
  writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map }))
  writeFileSync(join(dir, "config.json"), JSON.stringify({ architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_act: "silu", torch_dtype: "bfloat16", bos_token_id: tok.ids.endoftext, eos_token_id: tok.ids.endoftext, ...smolConfig }))
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: [tok.ids.im_end, tok.ids.endoftext] }))
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tok.json))
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: "<|endoftext|>", eos_token: "<|im_end|>", chat_template: smollm2Template }))
  return dir
}

