/**
 * The wire form alone (no NATS): ask replies encode and decode as `Rpc.exitSchema` says (the
 * success shortcut gives the same JSON), malformed replies are named, and the trace context
 * header round-trips.
 */
import { Cause, Exit, Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { describe, expect, it } from "vitest"
import { codecsOf, decodeAskReply, encodeExitReply, encodeJson, formatTraceparent, parseTraceparent } from "../../src/runtime/protocol.ts"

class Nope extends Schema.TaggedError<Nope>()("Nope", { why: Schema.String }) {}

const Protocol = RpcGroup.make(
  Rpc.make("Num", { success: Schema.Number, error: Nope }),
  Rpc.make("Void"),
  Rpc.make("When", { success: Schema.Struct({ at: Schema.Date, note: Schema.optional(Schema.String) }) })
)
const rpc = (tag: string) => Protocol.requests.get(tag)!

describe("ask replies", () => {
  it("encode a success as the exit schema does, and decode back", () => {
    const cases: Array<[string, unknown]> = [
      ["Num", 41],
      ["Void", undefined],
      ["When", { at: new Date(86_400_000) }]
    ]
    for (const [tag, value] of cases) {
      const r = rpc(tag)
      const full = Schema.encodeSync(Schema.toCodecJson(Rpc.exitSchema(r as any)) as unknown as Schema.Codec<unknown, unknown>)(Exit.succeed(value))
      expect(codecsOf(r).encodeExit(Exit.succeed(value))).toEqual(full)
      const decoded = decodeAskReply(r, encodeExitReply(r, Exit.succeed(value)))
      expect(decoded._tag).toBe("Exit")
      if (decoded._tag === "Exit") expect(decoded.exit).toEqual(Exit.succeed(value))
    }
  })

  it("carry a typed failure and a defect through the exit schema", () => {
    const failed = decodeAskReply(rpc("Num"), encodeExitReply(rpc("Num"), Exit.fail(new Nope({ why: "because" }))))
    expect(failed._tag).toBe("Exit")
    if (failed._tag === "Exit" && Exit.isFailure(failed.exit)) {
      const error = Cause.findErrorOption(failed.exit.cause)
      expect(error._tag === "Some" && error.value).toMatchObject({ _tag: "Nope", why: "because" })
    } else expect.unreachable()
    const died = decodeAskReply(rpc("Num"), encodeExitReply(rpc("Num"), Exit.die(new Error("boom"))))
    expect(died._tag === "Exit" && Exit.isFailure(died.exit) && Cause.hasDies(died.exit.cause)).toBe(true)
  })

  it("name what is wrong with a malformed reply", () => {
    expect(decodeAskReply(rpc("Num"), new TextEncoder().encode("{nope"))).toMatchObject({ _tag: "Malformed", reason: expect.stringMatching(/malformed JSON/) })
    expect(decodeAskReply(rpc("Num"), encodeJson({ _tag: "Other" }))).toMatchObject({ _tag: "Malformed" })
    expect(decodeAskReply(rpc("Num"), encodeJson({ _tag: "Exit", exit: { _tag: "Success", value: "not a number" } }))._tag).toBe("Malformed")
    expect(decodeAskReply(rpc("Num"), encodeJson({ _tag: "Rejected", reason: "stopping" }))).toEqual({ _tag: "Rejected", reason: "stopping" })
  })
})

describe("traceparent", () => {
  it("round-trips and refuses what is not W3C trace context", () => {
    const span = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", sampled: true }
    expect(formatTraceparent(span)).toBe("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    expect(parseTraceparent(formatTraceparent(span))).toEqual(span)
    expect(parseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")?.sampled).toBe(false)
    expect(parseTraceparent("")).toBeUndefined()
    expect(parseTraceparent("01-xyz")).toBeUndefined()
  })
})
