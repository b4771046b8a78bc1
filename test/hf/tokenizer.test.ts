/**
 * tokenizer.json through @huggingface/tokenizers: the two fixture tokenizers (byte-level
 * BPE, BPE with byte fallback) give the encodings their merges imply, round-trip any text,
 * and know their special tokens; the byte-level tokenizer of the presets keeps the interface.
 */
import { Tokenizer as Library } from "@huggingface/tokenizers"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { bpe, numberMerges } from "../../src/engine/bpe.ts"
import { byteLevelEncoder, type LibraryPreTokenizer } from "../../src/engine/bpe-bytelevel.ts"
import { hfTokenizer } from "../../src/engine/hf-tokenizer.ts"
import { byteTokenizer, special } from "../../src/engine/tokenizer.ts"
import { byteFallbackTokenizer, byteLevelTokenizer, mergeCorpus, trainedByteLevelTokenizer } from "./fixtures.ts"

/** The library's own ids for the text (what every fast-path encoding must equal). */
const libraryIds = (library: Library, text: string) => library.encode(text, { add_special_tokens: false }).ids

/** The fast path of a tokenizer.json, or undefined when it falls back to the library. */
const fastPath = (json: object, config: Record<string, unknown> = {}) =>
  byteLevelEncoder(json as Record<string, unknown>, config, new Library(json, config).pre_tokenizer as LibraryPreTokenizer | null)

/** Added tokens of the fast-path fixtures: specials, a prefix of one, lstrip/rstrip, normalized ones. */
const addedTokens = [
  { content: "<|begin_of_text|>" },
  { content: "<|eot", special: false },
  { content: "<|eot_id|>" },
  { content: "<|im_start|>" },
  { content: "<|im_end|>", rstrip: true },
  { content: "<mask>", lstrip: true },
  { content: "<tool_call>", special: false, normalized: true },
  { content: "cafe\u0301", special: false, normalized: true }
]

/** Text that exercises the pre-tokenizers and the merges: words, specials, whitespace, digits, contractions, unicode. */
const fragments = fc.constantFrom(
  ...addedTokens.map((t) => t.content),
  ...mergeCorpus.split(/(?<= )/),
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000",
  "0", "7", "42", "1234", "12345678", "3.14", "-1,000",
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "don't", "I'M",
  "\u00e9", "e\u0301", "caf\u00e9", "\u00df", "\u{1F642}", "\u{1F468}\u200D\u{1F469}", "\u4F60\u597D", "\u0645\u0631\u062D\u0628\u0627", "\uD800", "<|", "|>", "<", "mask>", " xyzzy", "xyzzy", " unreachable"
)
const texts = fc.oneof(
  fc.array(fc.oneof(fragments, fc.string({ unit: "grapheme", maxLength: 6 })), { maxLength: 24 }).map((xs) => xs.join("")),
  fc.string({ unit: "grapheme", maxLength: 40 }),
  fc.string({ unit: "binary", maxLength: 20 })
)

describe("tokenizer.json", () => {
  it("byte-level BPE: merges, bytes for the rest, specials from text, round trips", () => {
    const f = byteLevelTokenizer()
    const tok = hfTokenizer(f.json, {})
    expect(tok.vocabSize).toBe(f.vocabSize)
    expect(tok.encode("hello world to")).toEqual([f.ids.hello, f.ids.Ġworld, f.ids.Ġto])
    // é is two bytes (195 169): each byte is its own token id in GPT-2 byte order ('Ã' = 195 -> id 195 ...)
    expect(tok.encode("hé")).toEqual([104, 195, 169])
    expect(tok.encode("<|im_start|>user\nhello<|im_end|>")).toEqual([f.ids.im_start, 117, 115, 101, 114, 10, f.ids.hello, f.ids.im_end])
    expect(tok.isSpecial(f.ids.im_end)).toBe(true)
    expect(tok.isSpecial(f.ids.hello)).toBe(false)
    expect(tok.decode([f.ids.im_start, f.ids.hello, f.ids.im_end], { skipSpecial: true })).toBe("hello")
    expect(tok.tokenBytes(f.ids.Ġworld)).toEqual(Array.from(Buffer.from(" world")))
    fc.assert(fc.property(fc.string({ unit: "grapheme", maxLength: 40 }), (s) => tok.decode(tok.encode(s)) === s), { numRuns: 300 })
    // the fast path encodes exactly as the library does, in any order of texts
    expect(fastPath(f.json)).toBeDefined()
    const library = new Library(f.json, {})
    const some = fc.array(fc.oneof(fc.string({ unit: "grapheme", maxLength: 30 }), fc.constantFrom("hello world", " to  hello\n\n", "<|im_end|>hello")), { maxLength: 6 })
    fc.assert(fc.property(some, (ts) => ts.every((t) => JSON.stringify(tok.encode(t)) === JSON.stringify(libraryIds(library, t)))), { numRuns: 200 })
  })

  const styles = [{ style: "gpt2" }, { style: "gpt2", addPrefixSpace: true }, { style: "llama3" }, { style: "qwen2" }, { style: "smollm2" }] as const
  for (const { style, ...options } of styles) {
    it(`byte-level fast path (${style}${"addPrefixSpace" in options ? ", prefix space" : ""}): the library's ids for any text`, () => {
      const json = trainedByteLevelTokenizer({ style, ...options, added: addedTokens })
      expect(json.model.merges.length).toBeGreaterThan(150)
      const fast = fastPath(json)
      expect(fast).toBeDefined()
      const tok = hfTokenizer(json, {})
      const library = new Library(json, {})
      // merges learned from the corpus do apply: its text takes far fewer tokens than bytes
      expect(libraryIds(library, mergeCorpus).length).toBeLessThan(Buffer.byteLength(mergeCorpus) / 2)
      fc.assert(
        fc.property(fc.array(texts, { minLength: 1, maxLength: 4 }), (ts) => {
          for (const t of ts) {
            const expected = libraryIds(library, t)
            expect(fast!.encode(t)).toEqual(expected)
            expect([...fast!.encodeParts(t)].flatMap((part) => Array.from(part))).toEqual(expected)
            expect(tok.encode(t)).toEqual(expected)
          }
        }),
        { numRuns: 400 }
      )
      for (const t of [mergeCorpus, mergeCorpus.repeat(3), addedTokens.map((a) => a.content).join(" x "), " <mask> <|im_end|>  \n hi", "\n".repeat(50) + "9".repeat(40)]) {
        expect(tok.encode(t)).toEqual(libraryIds(library, t))
        expect(tok.encode(t)).toEqual(libraryIds(library, t)) // long sections again: from the section cache
      }
    })
  }

  it("merge-rank BPE: lowest rank first, leftmost of equal ranks, long words", () => {
    const tokens = (word: string, merges: ReadonlyArray<string | ReadonlyArray<string>>) => {
      const numbered = numberMerges([..."abcdxyz"], merges)
      return bpe(Int32Array.from(word, (c) => numbered.symbol.get(c)!), numbered).map((s) => numbered.strings[s])
    }
    const merges = ["a a", "b c", "aa aa", "a b", "c d"]
    expect(tokens("aaa", merges)).toEqual(["aa", "a"]) // the leftmost pair of equal rank merges first
    expect(tokens("abc", merges)).toEqual(["a", "bc"]) // "b c" (rank 1) before "a b" (rank 3)
    expect(tokens("aaaaa", merges)).toEqual(["aaaa", "a"])
    expect(tokens("abcd", [["a", "b"], ["c", "d"], ["ab", "cd"]])).toEqual(["abcd"]) // merges as pairs
    expect(tokens("", merges)).toEqual([])
    expect(tokens("xyz", ["x y", "y z", "x y"])).toEqual(["x", "yz"]) // a repeated merge keeps its last rank, as in the library
    // a long run merges in O(n log n) and as the library does
    const json = trainedByteLevelTokenizer({ style: "gpt2", corpus: "aaaa ".repeat(20) + "ab".repeat(40), count: 12 })
    const long = "a".repeat(30_001) + "ab".repeat(10_000)
    expect(hfTokenizer(json, {}).encode(long)).toEqual(libraryIds(new Library(json, {}), long))
  })

  it("byte-level fast path: a merge outside the vocabulary becomes the unknown token, or nothing without one", () => {
    const base = trainedByteLevelTokenizer({ style: "gpt2", added: addedTokens })
    const merges = [...base.model.merges, "x y", "Ġ xy"] // "xy" and "Ġxy" are not in the vocabulary
    const unk = { ...base, model: { ...base.model, merges, unk_token: "<unk>", vocab: { ...base.model.vocab, "<unk>": 100_000 } } }
    const none = { ...base, model: { ...base.model, merges } }
    // an added token whose normalised content ("Ã±", NFC of "A\u0303±": the byte characters of "ñ") a merge outside the vocabulary spells
    const qwen = trainedByteLevelTokenizer({ style: "qwen2", added: [...addedTokens, { content: "A\u0303±", special: false, normalized: true }] })
    const normalizedOnly = { ...qwen, model: { ...qwen.model, merges: ["Ã ±", ...qwen.model.merges] } }
    expect(normalizedOnly.model.vocab["Ã±"]).toBeUndefined()
    for (const t of ["ñ", "a\u00f1o A\u0303± ñ"]) expect(hfTokenizer(normalizedOnly, {}).encode(t)).toEqual(libraryIds(new Library(normalizedOnly, {}), t))
    for (const json of [unk, none]) {
      const tok = hfTokenizer(json, {})
      const library = new Library(json, {})
      expect(fastPath(json)).toBeDefined()
      for (const t of ["xy", " xyz xy", "axyb <mask>xy"]) expect(tok.encode(t)).toEqual(libraryIds(library, t))
    }
    expect(hfTokenizer(unk, {}).encode(" xy")).toEqual([100_000])
    expect(hfTokenizer(none, {}).encode("a xy")).toEqual([97])
  })

  it("falls back to the library for what the fast path does not cover", () => {
    const base = trainedByteLevelTokenizer({ style: "gpt2", added: addedTokens })
    const others = [
      { ...base, normalizer: { type: "Lowercase" } },
      { ...base, normalizer: { type: "NFKC" } },
      { ...base, pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Punctuation", behavior: "Isolated" }, base.pre_tokenizer] } },
      { ...base, pre_tokenizer: { type: "Whitespace" } },
      { ...base, model: { ...base.model, dropout: 0.1 } },
      { ...base, model: { ...base.model, end_of_word_suffix: "</w>" } },
      byteFallbackTokenizer().json
    ]
    for (const json of others) {
      expect(fastPath(json)).toBeUndefined()
      const tok = hfTokenizer(json, {})
      const library = new Library(json, {})
      fc.assert(fc.property(texts, (t) => { expect(tok.encode(t)).toEqual(libraryIds(library, t)) }), { numRuns: 50 })
    }
    expect(fastPath(base, { remove_space: true })).toBeUndefined()
  })

  it("BPE with byte fallback: the ▁ prefix, bytes for unknown characters, round trips", () => {
    const f = byteFallbackTokenizer()
    const tok = hfTokenizer(f.json, {})
    expect(tok.encode("hello world")).toEqual([f.ids["▁hello"], f.ids["▁world"]])
    expect(tok.encode("hello é")).toEqual([f.ids["▁hello"], f.ids["▁"], f.ids.byte(0xc3), f.ids.byte(0xa9)])
    expect(tok.encode("<s>hello</s>")).toEqual([f.ids.bos, f.ids["▁hello"], f.ids.eos])
    expect(tok.decode([f.ids.bos, f.ids["▁hello"], f.ids.byte(0xf0), f.ids.byte(0x9f), f.ids.byte(0x99), f.ids.byte(0x82)], { skipSpecial: true })).toBe("hello🙂")
    const words = fc.array(fc.constantFrom("hello", "world", "é", "🙂", "dr", "x"), { minLength: 1, maxLength: 8 })
    fc.assert(fc.property(words, (ws) => tok.decode(tok.encode(ws.join(" "))) === ws.join(" ")), { numRuns: 200 })
  })

  it("the presets' byte-level tokenizer behind the same interface", () => {
    const ids = byteTokenizer.encode("hé")
    expect(ids).toEqual([104, 0xc3, 0xa9])
    expect(byteTokenizer.decode([special.bos, ...ids, special.end], { skipSpecial: true })).toBe("hé")
    expect(byteTokenizer.isSpecial(special.end)).toBe(true)
    expect(byteTokenizer.tokenBytes(0xc3)).toEqual([0xc3])
  })
})
