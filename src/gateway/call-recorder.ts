/**
 * Records each answered model call on the trajectory stream: one `CallRecord`, delta-encoded
 * by its execution's `DeltaEncoder`, on `gyre.<run>.calls.<execution>` with the message id
 * `<execution>.<callId>` (a repeated publish is deduplicated by JetStream); a record longer than
 * `RECORD_PART_BYTES` goes out in consecutive parts (`../protocols/record-parts.ts`), published
 * in order without waiting between them, so they lie together on the stream. The gateway writes
 * a response only after every part was acknowledged; a failed publish is a 500 `record_failed`.
 */
import { headers } from "@nats-io/transport-node"
import { Effect } from "effect"
import { publishAll } from "../runtime/channel-io.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { ModelCall } from "../tree/record.ts"
import { apiError } from "../openai/openai.ts"
import { CALL_HEADER, PART_HEADER, recordParts } from "../protocols/record-parts.ts"
import { Calls } from "../protocols/topology.ts"
import type { Session } from "./sessions.ts"

/** A record's messages: itself, or its parts with their headers (`record-parts.ts`). */
const messagesOf = (id: string, callId: string, bytes: Uint8Array) => {
  const parts = recordParts(bytes)
  if (parts.length === 1) return [{ data: bytes, msgId: id }]
  return parts.map((part, i) => {
    const h = headers()
    h.set(PART_HEADER, `${i + 1}/${parts.length}`)
    h.set(CALL_HEADER, callId)
    return { data: part, msgId: `${id}.${i + 1}`, headers: h }
  })
}

export const makeCallRecorder = (system: ActorSystemShape) => {
  let calls = 0
  return {
    /** Calls recorded since the gateway started. */
    get calls() {
      return calls
    },
    record: (session: Session, call: ModelCall) =>
      Effect.suspend(() => {
        const data = Calls.encode(session.encoder.encode(call))
        return publishAll(system, Calls, session.execution, messagesOf(`${session.execution}.${call.callId}`, call.callId, data)).pipe(
          Effect.mapError((e) => apiError(500, `The call could not be recorded: ${e.message}`, { code: "record_failed" }))
        )
      }).pipe(
        Effect.tap(() =>
          Effect.sync(() => {
            session.calls++
            calls++
          })
        )
      )
  }
}
