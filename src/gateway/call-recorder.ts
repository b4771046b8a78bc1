/**
 * Records each answered model call on the trajectory stream: one `CallRecord`, delta-encoded
 * by its execution's `DeltaEncoder`, on `gyre.<run>.calls.<execution>` with the message id
 * `<execution>.<callId>` (a repeated publish is deduplicated by JetStream); a record longer than
 * `RECORD_PART_BYTES` goes out in consecutive parts (`../protocols/record-parts.ts`), published
 * in order without waiting between them, so they lie together on the stream. The gateway writes
 * a response only after every part was acknowledged; a failed publish is a 500 `record_failed`.
 */
import { headers } from "@nats-io/transport-node"
import { Effect, Schema } from "effect"
import { messageOf } from "../runtime/errors.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { CallRecord, type ModelCall } from "../tree/record.ts"
import { apiError } from "../openai/openai.ts"
import { rlLayout } from "../protocols/layout.ts"
import { CALL_HEADER, PART_HEADER, recordParts } from "../protocols/record-parts.ts"
import type { Session } from "./sessions.ts"

const encodeRecord = Schema.encodeSync(CallRecord)

/** Publishes a record's parts in order (all sent before any acknowledgement is awaited). */
const publishParts = async (system: ActorSystemShape, subject: string, id: string, callId: string, bytes: Uint8Array): Promise<void> => {
  const parts = recordParts(bytes)
  if (parts.length === 1) return void (await system.nats.js.publish(subject, bytes, { msgID: id }))
  await Promise.all(
    parts.map((part, i) => {
      const h = headers()
      h.set(PART_HEADER, `${i + 1}/${parts.length}`)
      h.set(CALL_HEADER, callId)
      return system.nats.js.publish(subject, part, { msgID: `${id}.${i + 1}`, headers: h })
    })
  )
}

export const makeCallRecorder = (system: ActorSystemShape) => {
  const layout = rlLayout(system.run)
  let calls = 0
  return {
    /** Calls recorded since the gateway started. */
    get calls() {
      return calls
    },
    record: (session: Session, call: ModelCall) =>
      Effect.suspend(() => {
        const data = Buffer.from(JSON.stringify(encodeRecord(session.encoder.encode(call))))
        return Effect.tryPromise({
          try: () => publishParts(system, layout.calls(session.execution), `${session.execution}.${call.callId}`, call.callId, data),
          catch: (e) => apiError(500, `The call could not be recorded: ${messageOf(e)}`, { code: "record_failed" })
        })
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
