/** `errorLine`: a message when there is one, a tagged error's tag and fields when not. */
import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { errorLine } from "../../src/common/error-line.ts"

class UnknownThing extends Schema.TaggedError<UnknownThing>()("UnknownThing", { name: Schema.String, reason: Schema.String }) {}

describe("errorLine", () => {
  it("gives a tagged error's tag and fields, a plain error's message, anything else as text", () => {
    expect(errorLine(new UnknownThing({ name: "x", reason: "no x here" }))).toBe('UnknownThing {"_tag":"UnknownThing","name":"x","reason":"no x here"}')
    expect(errorLine(new Error("disk full"))).toBe("disk full")
    expect(errorLine(new TypeError(""))).toBe("TypeError")
    expect(errorLine("plain")).toBe("plain")
  })
})
