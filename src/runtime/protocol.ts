/**
 * The wire form of actor messages, shared by sender (`system.ts`) and receiver (`host.ts`).
 *
 * An actor protocol is an effect `RpcGroup` of `Rpc.make` definitions (payload, success and
 * error schemas). On the wire:
 * - a request's payload is the JSON of `Schema.toCodecJson(rpc.payloadSchema)`; the header
 *   `Gyre-Request` names the request's tag and `Nats-Msg-Id` identifies the message (dedup);
 *   an actor's sends carry `Gyre-Sender` and `Gyre-Incarnation` (`isCurrent` in claim.ts);
 * - an ask's reply is an `AskReply`: `{"_tag":"Exit","exit":...}` with the JSON of
 *   `Rpc.exitSchema(rpc)` (success, typed failure or defect), `{"_tag":"Rejected","reason"}`
 *   when the request was dead-lettered or the handler crashed, or `{"_tag":"Overloaded","reason"}`
 *   when the actor's ask queue is full (nothing was handled).
 */
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node"
import { Exit, Schema, Tracer } from "effect"
import type { Rpc, RpcGroup } from "effect/rpc"
import { Rpc as RpcModule } from "effect/rpc"

export const Headers = {
  request: "Gyre-Request",
  msgId: "Nats-Msg-Id",
  sender: "Gyre-Sender",
  incarnation: "Gyre-Incarnation",
  deadReason: "Gyre-Dead-Reason",
  deadSubject: "Gyre-Dead-Subject",
  deadSeq: "Gyre-Dead-Seq",
  deadActor: "Gyre-Dead-Actor",
  /** A dead letter whose body was cut to fit: the original's length and `sha256:<hex>`. */
  deadOriginalLength: "Gyre-Dead-Original-Length",
  deadOriginalDigest: "Gyre-Dead-Original-Digest",
  askReply: "Gyre-Ask-Reply",
  /** W3C trace context of the sender's span: `00-<trace id>-<span id>-<flags>`. */
  traceparent: "traceparent"
} as const

export const AskReply = Schema.Union([
  Schema.Struct({ _tag: Schema.Literal("Exit"), exit: Schema.Unknown }),
  Schema.Struct({ _tag: Schema.Literal("Rejected"), reason: Schema.String }),
  Schema.Struct({ _tag: Schema.Literal("Overloaded"), reason: Schema.String })
])
export type AskReply = typeof AskReply.Type

interface RpcCodecs {
  readonly payload: Schema.Codec<any, any>
  readonly exit: Schema.Codec<Exit.Exit<any, any>, any>
  readonly encodePayload: (payload: unknown) => unknown
  readonly decodePayload: (json: unknown) => Exit.Exit<unknown, Schema.SchemaError>
  /** The JSON of `Rpc.exitSchema(rpc)`; a success is `{_tag: "Success", value}` (encoded by the success schema alone). */
  readonly encodeExit: (exit: Exit.Exit<unknown, unknown>) => unknown
  readonly decodeExit: (json: unknown) => Exit.Exit<Exit.Exit<unknown, unknown>, Schema.SchemaError>
}

/**
 * A success skips the exit schema (a union of a success and a cause) for the success schema
 * itself: the same JSON, `{"_tag":"Success","value":...}`, for a fraction of the work on the
 * path of every answered ask. Failures go through the exit schema.
 */
const exitCodec = (rpc: Rpc.AnyWithProps, exit: Schema.Codec<Exit.Exit<any, any>, any>) => {
  const success = Schema.toCodecJson(rpc.successSchema) as unknown as Schema.Codec<any, any>
  const encodeSuccess = Schema.encodeSync(success)
  const decodeSuccess = Schema.decodeUnknownExit(success)
  const encodeAny = Schema.encodeSync(exit)
  const decodeAny = Schema.decodeUnknownExit(exit)
  return {
    encodeExit: (e: Exit.Exit<unknown, unknown>): unknown => (Exit.isSuccess(e) ? { _tag: "Success", value: encodeSuccess(e.value) } : encodeAny(e)),
    decodeExit: (json: unknown): Exit.Exit<Exit.Exit<unknown, unknown>, Schema.SchemaError> => {
      const j = json as { readonly _tag?: unknown; readonly value?: unknown } | null
      return j?._tag === "Success" ? Exit.map(decodeSuccess(j.value), Exit.succeed) : decodeAny(json)
    }
  }
}

const codecCache = new WeakMap<Rpc.Any, RpcCodecs>()

/** JSON codecs of one request definition (cached). */
export const codecsOf = (rpc: Rpc.Any): RpcCodecs => {
  let codecs = codecCache.get(rpc)
  if (codecs === undefined) {
    const r = rpc as Rpc.AnyWithProps
    const payload = Schema.toCodecJson(r.payloadSchema) as unknown as Schema.Codec<any, any>
    const exit = Schema.toCodecJson(RpcModule.exitSchema(r as any)) as unknown as Schema.Codec<Exit.Exit<any, any>, any>
    codecs = {
      payload,
      exit,
      encodePayload: Schema.encodeSync(payload),
      decodePayload: Schema.decodeUnknownExit(payload),
      ...exitCodec(r, exit)
    }
    codecCache.set(rpc, codecs)
  }
  return codecs
}

/** Looks up a request definition of a protocol by tag. */
export const requestOf = (protocol: RpcGroup.RpcGroup<any>, tag: string): Rpc.AnyWithProps | undefined =>
  protocol.requests.get(tag) as Rpc.AnyWithProps | undefined

const decoder = new TextDecoder("utf-8", { fatal: true })

/** UTF-8 JSON bytes (`Buffer.from` is several times cheaper than `TextEncoder` for small values). */
export const encodeJson = (value: unknown): Uint8Array => Buffer.from(JSON.stringify(value), "utf8")

/** Parses UTF-8 JSON bytes; `undefined` plus a reason when they are not JSON. */
export const parseJson = (bytes: Uint8Array): { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly reason: string } => {
  try {
    return { ok: true, value: bytes.length === 0 ? undefined : JSON.parse(decoder.decode(bytes)) }
  } catch (e) {
    return { ok: false, reason: `malformed JSON: ${e instanceof Error ? e.message : String(e)}` }
  }
}

/** Who sends a request: an actor's address and incarnation (`Gyre-Sender`, `Gyre-Incarnation`). */
export interface RequestSender {
  readonly sender?: string | undefined
  readonly incarnation?: number | undefined
}

/** The headers of a request: its tag, and an id, sender (with incarnation) and trace context when given. */
export const requestHeaders = (tag: string, msgId: string | undefined, from: RequestSender | undefined, traceparent: string | undefined): MsgHdrs => {
  const h = natsHeaders()
  h.set(Headers.request, tag)
  if (msgId !== undefined) h.set(Headers.msgId, msgId)
  if (from?.sender !== undefined) h.set(Headers.sender, from.sender)
  if (from?.incarnation !== undefined) h.set(Headers.incarnation, String(from.incarnation))
  if (traceparent !== undefined) h.set(Headers.traceparent, traceparent)
  return h
}

/** Encodes a request's payload for the wire. */
export const encodePayload = (rpc: Rpc.Any, payload: unknown): Uint8Array => encodeJson(codecsOf(rpc).encodePayload(payload))

/** Encodes the reply of an ask from the handler's exit. */
export const encodeExitReply = (rpc: Rpc.Any, exit: Exit.Exit<unknown, unknown>): Uint8Array =>
  encodeJson({ _tag: "Exit", exit: codecsOf(rpc).encodeExit(exit) } satisfies AskReply)

export const encodeRejectedReply = (reason: string): Uint8Array =>
  encodeJson({ _tag: "Rejected", reason } satisfies AskReply)

export const encodeOverloadedReply = (reason: string): Uint8Array =>
  encodeJson({ _tag: "Overloaded", reason } satisfies AskReply)

/**
 * Decodes an ask's reply to `rpc`: the handler's exit, a rejection, or why the bytes are not an
 * `AskReply` (checked by hand: the reply is on every ask's path, and its shape is three tags).
 */
export const decodeAskReply = (
  rpc: Rpc.Any,
  bytes: Uint8Array
):
  | { readonly _tag: "Exit"; readonly exit: Exit.Exit<unknown, unknown> }
  | { readonly _tag: "Rejected" | "Overloaded"; readonly reason: string }
  | { readonly _tag: "Malformed"; readonly reason: string } => {
  const parsed = parseJson(bytes)
  if (!parsed.ok) return { _tag: "Malformed", reason: parsed.reason }
  const reply = parsed.value as { readonly _tag?: unknown; readonly reason?: unknown; readonly exit?: unknown } | null
  if ((reply?._tag === "Rejected" || reply?._tag === "Overloaded") && typeof reply.reason === "string") return { _tag: reply._tag, reason: reply.reason }
  if (reply?._tag !== "Exit") return { _tag: "Malformed", reason: "neither Exit nor Rejected" }
  const exit = codecsOf(rpc).decodeExit(reply.exit)
  return Exit.isSuccess(exit) ? { _tag: "Exit", exit: exit.value } : { _tag: "Malformed", reason: String(exit.cause) }
}

/**
 * Whether spans made under `tracer` reach anyone. Effect's default in-memory `nativeTracer`
 * hands them to no exporter, so the ask path makes none under it (as OpenTelemetry's API
 * without an SDK makes no-op spans), and sends no `traceparent`: a span, its random ids and
 * its end cost ~0.1 of an ask's ratio to a raw request (bench:runtime). With an OTLP exporter
 * or any other tracer installed, every span is made.
 */
export const tracing = (tracer: Tracer.Tracer): boolean => tracer !== Tracer.nativeTracer

/** The parts of a W3C `traceparent` header. */
export interface TraceParent {
  readonly traceId: string
  readonly spanId: string
  readonly sampled: boolean
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

export const formatTraceparent = (span: TraceParent): string => `00-${span.traceId}-${span.spanId}-${span.sampled ? "01" : "00"}`

/** Parses a `traceparent` header; `undefined` when absent or malformed. */
export const parseTraceparent = (header: string): TraceParent | undefined => {
  if (header === "") return undefined
  const m = TRACEPARENT.exec(header)
  return m === null ? undefined : { traceId: m[1]!, spanId: m[2]!, sampled: (parseInt(m[3]!, 16) & 1) === 1 }
}
