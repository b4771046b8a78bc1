/**
 * tokenizer.json through @huggingface/tokenizers: the two fixture tokenizers (byte-level
 * BPE, BPE with byte fallback) give the encodings their merges imply, round-trip any text,
 * and know their special tokens; the byte-level tokenizer of the presets keeps the interface.
 */
import { Tokenizer as Library } from "@huggingface/tokenizers"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { hfTokenizer } from "../../src/engine/hf-tokenizer.ts"
import { byteTokenizer, special } from "../../src/engine/tokenizer.ts"
import { byteFallbackTokenizer, byteLevelTokenizer } from "./fixtures.ts"

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
    // the memoised pre-tokenizer encodes exactly as the library does, in any order of texts
    const library = new Library(f.json, {})
    const texts = fc.array(fc.oneof(fc.string({ unit: "grapheme", maxLength: 30 }), fc.constantFrom("hello world", " to  hello\n\n", "<|im_end|>hello")), { maxLength: 6 })
    fc.assert(fc.property(texts, (ts) => ts.every((t) => JSON.stringify(tok.encode(t)) === JSON.stringify(library.encode(t, { add_special_tokens: false }).ids))), { numRuns: 200 })
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
