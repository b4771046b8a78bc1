/**
 * `CallRecord`: the delta-encoded, token-level record of one model call, as the gateway
 * writes it to JetStream (JSON) and tree building and replay read it back.
 *
 * A call's full token sequence is `prompt ++ output`. The record carries it as
 *   sequence = (first `ref.shared` tokens of the referenced call's sequence) ++ `suffix`
 * where `ref` names an earlier call of the same execution (null: no shared prefix), and
 * `promptHash` is the digest (`hash.ts`) of the full prompt, so the decoder verifies the
 * reconstruction. Token arrays travel as base64 little-endian int32/float32 (`wire.ts`).
 * `logprobs` and `versions` hold one value per output token, and `sampling` says which
 * distribution the log-probs are of (the temperature and top-p the tokens were drawn with).
 */
import { Schema } from "effect"
import { AgentRole } from "./role.ts"
import { Float32ArrayFromBase64, Int32ArrayFromBase64 } from "./wire.ts"

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

/** Reference to the earlier call whose first `shared` tokens (prompt + output) this call repeats. */
export const CallReference = Schema.Struct({
  callId: Schema.NonEmptyString,
  shared: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
})
export type CallReference = typeof CallReference.Type

/**
 * The sampling a call's tokens were drawn with, so its log-probs' distribution:
 * softmax(logits / temperature) cut to the top-p set and renormalised; temperature 0 is
 * greedy (argmax), whose log-probs are log-softmax(logits).
 */
export const Sampling = Schema.Struct({
  temperature: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)),
  topP: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true }))
})
export type Sampling = typeof Sampling.Type

/** A run's default sampling, and what a record without `sampling` was drawn with. */
export const untempered: Sampling = { temperature: 1, topP: 1 }

/** The delta-encoded record of one model call (see the module comment). */
/** How a recorded call ended: the OpenAI finish reasons the gateway answers, or `cancelled`. */
export const RecordedFinish = Schema.Literals(["stop", "length", "tool_calls", "cancelled"])
export type RecordedFinish = typeof RecordedFinish.Type

export const CallRecord = Schema.Struct({
  run: Schema.String,
  task: Schema.String,
  execution: Schema.NonEmptyString,
  /** Unique within the execution; records are idempotent by it. */
  callId: Schema.NonEmptyString,
  role: AgentRole,
  ref: Schema.NullOr(CallReference),
  /** The tokens of `prompt ++ output` after the shared prefix. */
  suffix: Int32ArrayFromBase64,
  promptLength: NonNegativeInt,
  outputLength: NonNegativeInt,
  /** `hashDigest` of the full prompt: 16 hex digits. */
  promptHash: Schema.String.check(Schema.isPattern(/^[0-9a-f]{16}$/)),
  /** Behaviour log-probability of each output token. */
  logprobs: Float32ArrayFromBase64,
  /** Policy version that sampled each output token. */
  versions: Int32ArrayFromBase64,
  /** What the output tokens were drawn with (absent: records written before it, `untempered`). */
  sampling: Schema.optional(Sampling),
  /** How the call ended, as the gateway answered it (or `cancelled`: the client went away). */
  finishReason: RecordedFinish,
  /** Milliseconds since the epoch, as the gateway saw the request start and end. */
  startedAt: Schema.Number,
  finishedAt: Schema.Number,
  /** Raw tool-call payloads the model emitted, keyed by tool-call id. */
  toolCalls: Schema.Record(Schema.String, Schema.String)
})
export type CallRecord = typeof CallRecord.Type

/** A record as JSON text (the JetStream payload). */
export const CallRecordJson = Schema.fromJsonString(CallRecord)

/** One model call in full, as the gateway sees it before encoding. */
export interface ModelCall {
  readonly callId: string
  readonly role: AgentRole
  readonly prompt: Int32Array
  readonly output: Int32Array
  readonly logprobs: Float32Array
  readonly versions: Int32Array
  readonly sampling: Sampling
  readonly finishReason: RecordedFinish
  readonly startedAt: number
  readonly finishedAt: number
  readonly toolCalls: Readonly<Record<string, string>>
}

/**
 * A call with nothing but its tokens (behaviour log-probs 0, version 0, untempered, finished "stop"), as
 * demonstrations and tests make them; `extra` overrides any field.
 */
export const plainCall = (
  callId: string,
  role: AgentRole,
  prompt: ArrayLike<number>,
  output: ArrayLike<number>,
  extra: Partial<ModelCall> = {}
): ModelCall => ({
  callId,
  role,
  prompt: Int32Array.from(prompt),
  output: Int32Array.from(output),
  logprobs: new Float32Array(output.length),
  versions: new Int32Array(output.length),
  sampling: untempered,
  finishReason: "stop",
  startedAt: 0,
  finishedAt: 0,
  toolCalls: {},
  ...extra
})

/** A record the decoder refuses, and why. */
export class CallRecordRejected extends Schema.TaggedError<CallRecordRejected>()("CallRecordRejected", {
  execution: Schema.String,
  callId: Schema.String,
  reason: Schema.Literals(["wrong-execution", "malformed", "reference-rejected", "hash-mismatch"]),
  detail: Schema.String
}) {}
