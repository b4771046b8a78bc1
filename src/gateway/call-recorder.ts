/**
 * Records each answered model call on the trajectory stream: one `CallRecord`, delta-encoded
 * by its execution's `DeltaEncoder`, on `gyre.<run>.calls.<execution>` with the message id
 * `<execution>.<callId>` (a repeated publish is deduplicated by JetStream). The gateway writes
 * a response only after this publish was acknowledged; a failed publish is a 500 `record_failed`.
 */
import { Effect, Schema } from "effect"
import { messageOf } from "../runtime/errors.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { CallRecord, type ModelCall } from "../tree/record.ts"
import { apiError } from "../openai/openai.ts"
import { rlLayout } from "../protocols/layout.ts"
import type { Session } from "./sessions.ts"

const encodeRecord = Schema.encodeSync(CallRecord)

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
        const data = JSON.stringify(encodeRecord(session.encoder.encode(call)))
        return Effect.tryPromise({
          try: () => system.nats.js.publish(layout.calls(session.execution), data, { msgID: `${session.execution}.${call.callId}` }),
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
