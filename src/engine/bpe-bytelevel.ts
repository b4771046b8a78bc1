/**
 * The encode fast path of byte-level BPE tokenizer.json files (GPT-2, Llama 3, SmolLM2, Qwen
 * style): text -> ids with the same result as `@huggingface/tokenizers`' `encode(text,
 * {add_special_tokens: false}).ids`, without its per-call pipeline. Added tokens are split
 * out first (longest match, leftmost first, lstrip/rstrip as the library applies them), the
 * rest is normalised (none or NFC), pre-tokenized (the library's own Split and Digits steps,
 * then ByteLevel's regex) and each pre-token's ids are looked up in a cache; a miss runs the
 * merge-rank BPE (`bpe.ts`) over its UTF-8 bytes (as GPT-2's byte characters).
 *
 * Sections (the text between added tokens) of at least `SECTION_CACHE_MIN` characters are
 * remembered with their ids (up to `SECTION_CACHE_CHARS` characters in all, least recently
 * used out first): a chat history is encoded again at every call, and its earlier messages
 * are the same sections each time.
 *
 * `byteLevelEncoder` answers undefined for what it does not cover, and the caller uses the
 * library: other normalizers or pre-tokenizers, byte fallback, dropout, word suffixes, an
 * unknown token outside the vocabulary with fuse_unk, tokenizer_config's remove_space or
 * do_lowercase_and_remove_accent. Post-processors never matter: encoding adds no special tokens.
 */
import { bpe, numberMerges } from "./bpe.ts"

interface AddedTokenJson {
  readonly id: number
  readonly content: string
  readonly lstrip?: boolean
  readonly rstrip?: boolean
  readonly special?: boolean
  readonly normalized?: boolean
}

interface BpeModelJson {
  readonly type?: string
  readonly vocab: Readonly<Record<string, number>>
  readonly merges: ReadonlyArray<string | ReadonlyArray<string>>
  readonly unk_token?: string | null
  readonly byte_fallback?: boolean
  readonly dropout?: number | null
  readonly fuse_unk?: boolean
  readonly ignore_merges?: boolean
  readonly end_of_word_suffix?: string | null
  readonly continuing_subword_suffix?: string | null
}

type StepJson = { readonly type: string } & Record<string, unknown>

/** The library's pre-tokenizer objects (their public fields): a Sequence, a Split or Digits step, a ByteLevel. */
export interface LibraryPreTokenizer {
  readonly pre_tokenize_text: (text: string) => Array<string>
  readonly tokenizers?: ReadonlyArray<LibraryPreTokenizer | null>
  readonly pattern?: RegExp | null
  readonly byte_encoder?: Readonly<Record<number, string>>
  readonly add_prefix_space?: boolean
  readonly use_regex?: boolean
}

interface ByteLevel {
  readonly pattern: RegExp
  readonly byteEncoder: Readonly<Record<number, string>>
  readonly addPrefixSpace: boolean
  readonly useRegex: boolean
}

const CACHE_LIMIT = 1 << 20
const SECTION_CACHE_MIN = 256
const SECTION_CACHE_CHARS = 32 << 20
const utf8 = new TextEncoder()

/** Encodes `text` whole, and in its sections (text between added tokens, each added token). */
export interface ByteLevelEncoder {
  readonly encode: (text: string) => Array<number>
  readonly encodeParts: (text: string) => Iterable<ArrayLike<number>>
}

/** A bounded LRU of long sections' ids (see the module comment). */
const sectionCache = () => {
  const map = new Map<string, Array<number>>()
  let chars = 0
  return (section: string, encode: (s: string) => Array<number>): Array<number> => {
    if (section.length < SECTION_CACHE_MIN) return encode(section)
    let ids = map.get(section)
    if (ids !== undefined) {
      map.delete(section)
      map.set(section, ids)
      return ids
    }
    ids = encode(section)
    if (section.length > SECTION_CACHE_CHARS / 4) return ids
    map.set(section, ids)
    chars += section.length
    for (const key of map.keys()) {
      if (chars <= SECTION_CACHE_CHARS) break
      map.delete(key)
      chars -= key.length
    }
    return ids
  }
}

/**
 * The pre-tokenizer as Split and Digits steps (the library's objects, which split as it does)
 * before a final ByteLevel (its regex and byte characters), read off the JSON and the
 * library's objects built from it side by side; undefined for any other shape.
 */
const preTokenizer = (json: StepJson | null | undefined, built: LibraryPreTokenizer | null): { readonly steps: Array<LibraryPreTokenizer>; readonly byteLevel: ByteLevel } | undefined => {
  const sequence = json?.type === "Sequence"
  const all = sequence ? ((json.pretokenizers ?? []) as ReadonlyArray<StepJson | null>) : [json]
  const objects = sequence ? (built?.tokenizers ?? []) : [built]
  const last = objects.at(-1)
  if (all.length !== objects.length || all.at(-1)?.type !== "ByteLevel" || !last?.pattern || last.byte_encoder === undefined) return undefined
  const steps = objects.slice(0, -1)
  if (steps.some((s, i) => s === null || (all[i]?.type !== "Split" && all[i]?.type !== "Digits"))) return undefined
  const byteLevel = { pattern: last.pattern, byteEncoder: last.byte_encoder, addPrefixSpace: last.add_prefix_space === true, useRegex: last.use_regex !== false }
  return { steps: steps as Array<LibraryPreTokenizer>, byteLevel }
}

/** Whether the model is a BPE this path encodes exactly as the library does. */
const plainBpe = (model: BpeModelJson, config: Readonly<Record<string, unknown>>): boolean =>
  (model.type === "BPE" || model.type === undefined) &&
  typeof model.vocab === "object" &&
  !Array.isArray(model.vocab) &&
  Array.isArray(model.merges) &&
  model.byte_fallback !== true &&
  !model.dropout &&
  !model.end_of_word_suffix &&
  !model.continuing_subword_suffix &&
  (model.unk_token == null || (Object.hasOwn(model.vocab, model.unk_token) && model.fuse_unk !== true)) &&
  !config.remove_space &&
  !config.do_lowercase_and_remove_accent

/** Splits text on the contents (longest first at the leftmost position; UTF-16 code units, as the library's trie). */
const splitter = (contents: ReadonlyArray<string>): ((text: string) => Array<string>) => {
  const words = [...new Set(contents.filter((c) => c.length > 0))].sort((a, b) => b.length - a.length)
  if (words.length === 0) return (text) => [text]
  const pattern = new RegExp(words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "g")
  return (text) => {
    const out: Array<string> = []
    let at = 0
    for (const m of text.matchAll(pattern)) {
      if (m.index > at) out.push(text.slice(at, m.index))
      out.push(m[0])
      at = m.index + m[0].length
    }
    if (at < text.length) out.push(text.slice(at))
    return out
  }
}

/** The library's lstrip/rstrip: an added token trims the whitespace of its neighbours, in order. */
const stripAround = (sections: Array<string>, added: ReadonlyMap<string, AddedTokenJson>): Array<string> => {
  for (let i = 0; i < sections.length; i++) {
    const token = added.get(sections[i]!)
    if (token === undefined) continue
    if (token.lstrip === true && i > 0) sections[i - 1] = sections[i - 1]!.trimEnd()
    if (token.rstrip === true && i < sections.length - 1) sections[i + 1] = sections[i + 1]!.trimStart()
  }
  return sections
}

/** The encoder of a tokenizer.json (with its tokenizer_config.json), or undefined when the library must encode. */
export const byteLevelEncoder = (
  json: Readonly<Record<string, unknown>>,
  config: Readonly<Record<string, unknown>>,
  built: LibraryPreTokenizer | null
): ByteLevelEncoder | undefined => {
  const model = json.model as BpeModelJson | undefined
  const normalizer = json.normalizer as StepJson | null | undefined
  const nfc = normalizer?.type === "NFC"
  if (model === undefined || model === null || !plainBpe(model, config) || (normalizer != null && !nfc)) return undefined
  const pre = preTokenizer(json.pre_tokenizer as StepJson | null | undefined, built)
  if (pre === undefined) return undefined
  const pieceIds = pieceEncoder(model, (json.added_tokens ?? []) as ReadonlyArray<AddedTokenJson>, nfc, pre.byteLevel)
  const { steps, byteLevel } = pre
  const { pattern, addPrefixSpace: prefix, useRegex: regex } = byteLevel
  const { added, raw, normalized } = pieceIds
  /** ByteLevel's split of one piece (the library adds the prefix space to every piece). */
  const byteLevelPieces = (piece: string, out: Array<number>) => {
    const text = prefix && !piece.startsWith(" ") ? ` ${piece}` : piece
    if (!regex) return pieceIds.push(text, out)
    for (const p of text.match(pattern) ?? []) pieceIds.push(p, out)
  }
  const preTokenized = (text: string, out: Array<number>) => {
    if (steps.length === 0) return byteLevelPieces(text, out)
    let pieces = [text]
    for (const step of steps) pieces = pieces.flatMap((p) => step.pre_tokenize_text(p))
    for (const p of pieces) byteLevelPieces(p, out)
  }
  /** The ids of one section that is not an added token. */
  const sectionIds = (section: string): Array<number> => {
    const out: Array<number> = []
    const norm = nfc ? section.normalize("NFC") : section
    for (const sub of normalized === undefined ? [norm] : stripAround(normalized(norm), added)) {
      if (sub.length === 0) continue
      const inner = added.get(sub)
      if (inner !== undefined) out.push(inner.id)
      else preTokenized(sub, out)
    }
    return out
  }
  const cached = sectionCache()
  function* encodeParts(text: string): Iterable<ArrayLike<number>> {
    for (const section of stripAround(raw(text), added)) {
      if (section.length === 0) continue
      const token = added.get(section)
      yield token !== undefined ? [token.id] : cached(section, sectionIds)
    }
  }
  const encode = (text: string): Array<number> => {
    const out: Array<number> = []
    for (const part of encodeParts(text)) for (let i = 0; i < part.length; i++) out.push(part[i]!)
    return out
  }
  return { encode, encodeParts }
}

/** The added tokens (by content), their splitters, and the cached ids of one pre-token. */
const pieceEncoder = (model: BpeModelJson, addedTokens: ReadonlyArray<AddedTokenJson>, nfc: boolean, byteLevel: ByteLevel) => {
  const vocab = new Map(Object.entries(model.vocab))
  const added = new Map<string, AddedTokenJson>()
  const rawContents: Array<string> = [], normalizedContents: Array<string> = []
  for (const token of addedTokens) {
    vocab.set(token.content, token.id)
    added.set(token.content, token)
    if ((token.normalized ?? token.special !== true) && nfc) {
      const content = token.content.normalize("NFC")
      normalizedContents.push(content)
      added.set(content, token)
    } else rawContents.push(token.content)
  }
  const chars = Array.from({ length: 256 }, (_, b) => byteLevel.byteEncoder[b]!)
  const merges = numberMerges([...chars, ...vocab.keys()], model.merges)
  const byteSymbol = Int32Array.from(chars, (c) => merges.symbol.get(c)!)
  // the library's id of a token in the vocabulary: an added token's (also by normalised content) first
  const idOf = (token: string) => added.get(token)?.id ?? vocab.get(token)!
  const output = Int32Array.from(merges.strings, (s) => (vocab.has(s) ? idOf(s) : -1)) // -1: not in the vocabulary
  const unk = model.unk_token == null ? -1 : idOf(model.unk_token)
  const ignoreMerges = model.ignore_merges === true
  const encodePiece = (piece: string): Array<number> => {
    const bytes = utf8.encode(piece)
    if (ignoreMerges) {
      let word = ""
      for (const b of bytes) word += chars[b]!
      if (vocab.has(word)) return [idOf(word)]
    }
    const ids: Array<number> = []
    for (const s of bpe(Int32Array.from(bytes, (b) => byteSymbol[b]!), merges)) {
      const id = output[s]!
      if (id >= 0) ids.push(id)
      else if (unk >= 0) ids.push(unk)
    }
    return ids
  }
  const cache = new Map<string, number | Array<number>>() // one id (most pre-tokens) or several
  return {
    added,
    raw: splitter(rawContents),
    normalized: normalizedContents.length > 0 ? splitter(normalizedContents) : undefined,
    /** Appends the ids of one pre-token (before the byte mapping) to `out`. */
    push: (piece: string, out: Array<number>): void => {
      let ids = cache.get(piece)
      if (ids === undefined) {
        const all = encodePiece(piece)
        ids = all.length === 1 ? all[0]! : all
        if (cache.size < CACHE_LIMIT) cache.set(piece, ids)
      }
      if (typeof ids === "number") out.push(ids)
      else for (let i = 0; i < ids.length; i++) out.push(ids[i]!)
    }
  }
}
