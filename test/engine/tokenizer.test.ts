/** The byte-level tokenizer: exact round trips, special tokens, the chat template. */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { VOCAB_SIZE, decode, encode, special } from "../../src/engine/tokenizer.ts"
import { presets } from "../../src/engine/presets.ts"

describe("byte-level tokenizer", () => {
  it("round-trips any well-formed text exactly", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme" }), (text) => {
        const ids = encode(text)
        expect(ids.every((id) => id >= 0 && id < 256)).toBe(true)
        expect(decode(ids)).toBe(text)
      })
    )
    expect(encode("é€😀")).toEqual([0xc3, 0xa9, 0xe2, 0x82, 0xac, 0xf0, 0x9f, 0x98, 0x80])
  })

  it("writes special tokens by name, or skips them", () => {
    expect(decode([special.bos, 104, 105, special.end, 270])).toBe("<|bos|>hi<|end|><|reserved_270|>")
    expect(decode([special.bos, 104, 105, special.end], { skipSpecial: true })).toBe("hi")
  })

  it("every preset has room for the vocabulary", () => {
    for (const p of Object.values(presets)) expect(p.vocab_size).toBe(VOCAB_SIZE)
  })
})
