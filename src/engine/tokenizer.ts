/**
 * The `Tokenizer` interface every chat format encodes and decodes through, and Gyre's own
 * byte-level tokenizer and its special tokens, used by the presets (the chat template over
 * them is `src/openai/chat.ts`; a model's own `tokenizer.json` is `hf-tokenizer.ts`).
 *
 * Ids 0..255 are the bytes of the UTF-8 text, so text -> ids -> text round-trips exactly
 * (for any well-formed string). Ids 256..271 are special tokens, never produced by
 * `encode`; the first eight have names:
 *
 *   256 <|bos|>  257 <|eos|>  258 <|pad|>  259 <|system|>  260 <|user|>  261 <|assistant|>
 *   262 <|tool|>  263 <|end|>   (264..271 reserved)
 *
 * The chat template brackets each message with `<|role|>` ... `<|end|>`; the model's turn ends
 * at `<|end|>`.
 */

export const BYTE_TOKENS = 256
export const VOCAB_SIZE = 272

export const special = {
  bos: 256,
  eos: 257,
  pad: 258,
  system: 259,
  user: 260,
  assistant: 261,
  tool: 262,
  end: 263
} as const

const specialNames: ReadonlyMap<number, string> = new Map(
  Object.entries(special).map(([name, id]) => [id, `<|${name}|>`])
)

const utf8 = new TextEncoder()

/** UTF-8 bytes of the text as token ids. */
export const encode = (text: string): Array<number> => Array.from(utf8.encode(text))

/**
 * Text of the ids: byte runs decoded as UTF-8 (malformed bytes become U+FFFD), special
 * tokens written as their names (`<|end|>`), or dropped with `skipSpecial`.
 */
export const decode = (ids: ReadonlyArray<number>, options: { readonly skipSpecial?: boolean } = {}): string => {
  const decoder = new TextDecoder("utf-8")
  let out = ""
  let bytes: Array<number> = []
  const flush = () => {
    if (bytes.length > 0) out += decoder.decode(Uint8Array.from(bytes))
    bytes = []
  }
  for (const id of ids) {
    if (id >= 0 && id < BYTE_TOKENS) {
      bytes.push(id)
      continue
    }
    flush()
    if (!options.skipSpecial) out += specialNames.get(id) ?? `<|reserved_${id}|>`
  }
  flush()
  return out
}

/** Text <-> token ids of one model's vocabulary. */
export interface Tokenizer {
  readonly vocabSize: number
  /** Ids of the text; special-token strings in it become their ids, nothing is added around it. */
  readonly encode: (text: string) => Array<number>
  /** Text of the ids; special tokens written out, or dropped with `skipSpecial`. */
  readonly decode: (ids: ArrayLike<number>, options?: { readonly skipSpecial?: boolean }) => string
  /** Whether the id is a special (control) token. */
  readonly isSpecial: (id: number) => boolean
  /** The UTF-8 bytes one token stands for, for log-prob listings (empty for special tokens). */
  readonly tokenBytes: (id: number) => Array<number>
  /**
   * At least as many UTF-8 bytes as any token's text has (special tokens' included), so a text
   * of b bytes has at least b / maxTokenBytes tokens: a bound known before encoding.
   */
  readonly maxTokenBytes: number
  /**
   * `encode(text)` in consecutive parts, whose ids concatenate to it: a caller can stop early
   * or let other work run between parts. Parts are as the tokenizer splits text anyway (at
   * added tokens; the byte tokenizer every 64 Ki characters).
   */
  readonly encodeParts: (text: string) => Iterable<ArrayLike<number>>
}

/** Characters per part of the byte tokenizer's `encodeParts`. */
const BYTE_PART_CHARS = 1 << 16

/** The byte tokenizer's parts: slices of the text (never inside a surrogate pair), as bytes. */
function* byteParts(text: string): Iterable<Array<number>> {
  for (let at = 0; at < text.length; ) {
    let end = Math.min(text.length, at + BYTE_PART_CHARS)
    if (end < text.length && /[\uD800-\uDBFF]/.test(text[end - 1]!)) end--
    yield encode(text.slice(at, end))
    at = end
  }
}

const specialIds: ReadonlySet<number> = new Set(Array.from({ length: VOCAB_SIZE - BYTE_TOKENS }, (_, i) => BYTE_TOKENS + i))

/** The byte-level tokenizer as a `Tokenizer` (special-token names in text stay bytes). */
export const byteTokenizer: Tokenizer = {
  vocabSize: VOCAB_SIZE,
  encode,
  decode: (ids, options) => decode(Array.from(ids), options),
  isSpecial: (id) => specialIds.has(id),
  tokenBytes: (id) => (id >= 0 && id < BYTE_TOKENS ? [id] : []),
  maxTokenBytes: 1,
  encodeParts: byteParts
}
