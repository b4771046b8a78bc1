/**
 * A model's own tokenizer: `tokenizer.json` (with `tokenizer_config.json`) through
 * `@huggingface/tokenizers`, Hugging Face's pure JS/TS implementation (byte-level BPE as in
 * GPT-2 / Llama 3 / SmolLM2, BPE with byte fallback as in Llama 2 / TinyLlama, and the added
 * and special tokens). Encoding adds no special tokens (the chat template writes them as
 * text, and their strings encode to their ids). Byte-level BPE encodes through the fast path
 * of `bpe-bytelevel.ts` (the library's ids, without its per-call pipeline); anything else
 * through the library, its BPE memoised per pre-token (in one part: `encodeParts`). Decoding is
 * the library's (no ids: "").
 *
 * Also the model's generation settings that concern tokens: the special tokens of
 * `tokenizer_config.json` (`bos_token`, `eos_token`, as strings or AddedToken objects) and
 * the eos ids of `generation_config.json` (else `config.json`), which stop generation.
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers"
import { byteLevelEncoder, type LibraryPreTokenizer } from "./bpe-bytelevel.ts"
import { tokenIdList } from "./config.ts"
import type { Tokenizer } from "./tokenizer.ts"

export const TOKENIZER_JSON = "tokenizer.json"
export const TOKENIZER_CONFIG = "tokenizer_config.json"
export const GENERATION_CONFIG = "generation_config.json"

/** A JSON file of the directory, or undefined when absent; bad JSON throws naming the file. */
export const readJsonFile = async (path: string): Promise<Record<string, unknown> | undefined> => {
  let text: string
  try {
    text = await readFile(path, "utf8")
  } catch (e) {
    if ((e as { code?: string }).code === "ENOENT") return undefined
    throw e
  }
  try {
    return JSON.parse(text) as Record<string, unknown>
  } catch (e) {
    throw new Error(`${path}: ${e instanceof Error ? e.message : String(e)}`)
  }
}

/** The text of a special token entry of tokenizer_config.json (a string or `{content}`). */
export const tokenString = (value: unknown): string | undefined =>
  typeof value === "string" ? value : typeof value === "object" && value !== null && typeof (value as { content?: unknown }).content === "string" ? (value as { content: string }).content : undefined

/**
 * Memoises the library's BPE model per pre-token (a plain map instead of its LRU cache, which
 * reorders on every hit): the model's output for one pre-token is a pure function of it.
 */
const memoiseBpe = (model: { constructor?: { name?: string }; encode?: (tokens: Array<string>) => Array<string> } | null): void => {
  const encode = model?.encode?.bind(model)
  if (model === null || encode === undefined || model.constructor?.name !== "BPE") return
  const cache = new Map<string, Array<string>>()
  model.encode = (tokens) =>
    tokens.flatMap((token) => {
      let out = cache.get(token)
      if (out === undefined) {
        out = encode([token])
        if (cache.size < 1 << 20) cache.set(token, out)
      }
      return out
    })
}

/**
 * An upper bound of the bytes of any token's text: a byte-level vocabulary spells each byte
 * with one character (its keys' lengths), other vocabularies' keys are at least as long in
 * UTF-8 as what they stand for ("▁" for a space, "<0x41>" for a byte); added tokens are their
 * content.
 */
const maxTokenBytes = (keys: Iterable<unknown>, added: ReadonlyArray<string>, byteLevel: boolean): number => {
  const utf8 = new TextEncoder()
  let max = 1
  for (const key of keys) {
    const text = String(key) // the library's vocabulary may key a number-like token by a number
    max = Math.max(max, byteLevel ? [...text].length : utf8.encode(text).length)
  }
  for (const content of added) max = Math.max(max, utf8.encode(content).length)
  return max
}

/** A `Tokenizer` over a parsed tokenizer.json and tokenizer_config.json. */
export const hfTokenizer = (tokenizerJson: object, tokenizerConfig: object): Tokenizer => {
  const tok = new HfTokenizer(tokenizerJson, tokenizerConfig)
  const fast = byteLevelEncoder(tokenizerJson as Record<string, unknown>, tokenizerConfig as Record<string, unknown>, tok.pre_tokenizer as LibraryPreTokenizer | null)
  if (fast === undefined) memoiseBpe(tok.model as Parameters<typeof memoiseBpe>[0])
  const added = tok.get_added_tokens_decoder()
  const special = new Set([...added].filter(([, t]) => t.special).map(([id]) => id))
  const vocab = tok.get_vocab(true)
  const vocabSize = Math.max(...vocab.values()) + 1
  const utf8 = new TextEncoder()
  const encode = fast?.encode ?? ((text: string) => tok.encode(text, { add_special_tokens: false }).ids)
  return {
    vocabSize,
    encode,
    encodeParts: fast?.encodeParts ?? ((text) => [encode(text)]),
    maxTokenBytes: maxTokenBytes(vocab.keys(), [...added.values()].map((t) => t.content), fast !== undefined),
    decode: (ids, options) => (ids.length === 0 ? "" : tok.decode(Array.from(ids), { skip_special_tokens: options?.skipSpecial === true, clean_up_tokenization_spaces: false })),
    isSpecial: (id) => special.has(id),
    tokenBytes: (id) => (special.has(id) ? [] : Array.from(utf8.encode(tok.decode([id], { clean_up_tokenization_spaces: false }))))
  }
}

/** What a checkpoint directory says of its tokens: tokenizer, special token strings, stop ids. */
export interface HfTokens {
  readonly tokenizer: Tokenizer
  readonly tokenizerConfig: Record<string, unknown>
  readonly bosToken: string
  readonly eosToken: string
  /** Ids that end generation: generation_config.json's eos_token_id, else config.json's, else eos_token's. */
  readonly eosIds: ReadonlyArray<number>
}

/** Reads the tokenizer files of `dir`, or undefined when it has no tokenizer.json. */
export const readHfTokens = async (dir: string): Promise<HfTokens | undefined> => {
  const tokenizerJson = await readJsonFile(join(dir, TOKENIZER_JSON))
  if (tokenizerJson === undefined) return undefined
  const tokenizerConfig = (await readJsonFile(join(dir, TOKENIZER_CONFIG))) ?? {}
  const tokenizer = hfTokenizer(tokenizerJson, tokenizerConfig)
  const generation = (await readJsonFile(join(dir, GENERATION_CONFIG))) ?? {}
  const config = (await readJsonFile(join(dir, "config.json"))) ?? {}
  const bosToken = tokenString(tokenizerConfig.bos_token) ?? ""
  const eosToken = tokenString(tokenizerConfig.eos_token) ?? ""
  const fromToken = eosToken === "" ? [] : tokenizer.encode(eosToken).filter((id) => tokenizer.isSpecial(id))
  const eosIds = [generation.eos_token_id, config.eos_token_id].map(tokenIdList).find((ids) => ids.length > 0) ?? fromToken
  return { tokenizer, tokenizerConfig, bosToken, eosToken, eosIds }
}
