/**
 * Reading a run's trajectories back: the `CallRecord`s and `ExecutionOutcome`s the stream
 * `GYRE_<run>_TRAJECTORIES` holds now, rebuilt into one prefix tree per execution with the
 * same `DeltaDecoder` the trainer and replay use.
 */
import { Effect, Schema, Stream } from "effect"
import type { TransportError } from "../runtime/errors.ts"
import { readLast, readStored } from "../runtime/stream-reader.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { DeltaDecoder } from "../tree/decoder.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { CallRecordJson, CallRecordRejected } from "../tree/record.ts"
import { rlLayout } from "./layout.ts"

export interface ExecutionTrajectory {
  readonly execution: string
  task: string
  readonly decoder: DeltaDecoder
  readonly rejected: Array<CallRecordRejected>
  outcome: ExecutionOutcome | undefined
}

export interface Trajectories {
  readonly executions: ReadonlyMap<string, ExecutionTrajectory>
  /** Messages that were not a valid record or outcome (with their stream sequence). */
  readonly malformed: ReadonlyArray<{ readonly seq: number; readonly subject: string; readonly reason: string }>
}

const decodeRecord = Schema.decodeUnknownExit(CallRecordJson)
const decodeOutcome = Schema.decodeUnknownExit(Schema.fromJsonString(ExecutionOutcome))

/** Rebuilds the run's executions (or those in `only`) from what the trajectory stream holds now. */
export const readTrajectories = (
  system: ActorSystemShape,
  only?: ReadonlySet<string>
): Effect.Effect<Trajectories, TransportError> =>
  Effect.gen(function* () {
    const names = rlLayout(system.run)
    const executions = new Map<string, ExecutionTrajectory>()
    const malformed: Array<{ seq: number; subject: string; reason: string }> = []
    const of = (execution: string) => {
      let t = executions.get(execution)
      if (t === undefined) {
        t = { execution, task: "", decoder: new DeltaDecoder(execution), rejected: [], outcome: undefined }
        executions.set(execution, t)
      }
      return t
    }
    const callsPrefix = names.calls("")
    const outcomesPrefix = names.outcomes("")
    yield* readStored(system.nats, names.trajectoryStream).pipe(
      Stream.runForEach((m) =>
        Effect.sync(() => {
          const isCall = m.subject.startsWith(callsPrefix)
          const execution = m.subject.slice((isCall ? callsPrefix : outcomesPrefix).length)
          if (only !== undefined && !only.has(execution)) return
          if (isCall) {
            const record = decodeRecord(m.string())
            if (record._tag === "Failure") return void malformed.push({ seq: m.seq, subject: m.subject, reason: String(record.cause) })
            const t = of(execution)
            t.task = record.value.task
            t.rejected.push(...t.decoder.add(record.value).rejected)
          } else {
            const outcome = decodeOutcome(m.string())
            if (outcome._tag === "Failure") return void malformed.push({ seq: m.seq, subject: m.subject, reason: String(outcome.cause) })
            const t = of(execution)
            t.task = outcome.value.task
            t.outcome = outcome.value
          }
        })
      )
    )
    return { executions, malformed }
  })

/**
 * One execution's trajectory from what the stream holds now: a filtered read of its call
 * records (`gyre.<run>.calls.<execution>`), then its outcome, if published. A call record
 * that is not valid JSON of a record is kept as a `malformed` rejection.
 */
export const readExecution = (system: ActorSystemShape, execution: string): Effect.Effect<ExecutionTrajectory, TransportError> =>
  Effect.gen(function* () {
    const names = rlLayout(system.run)
    const t: ExecutionTrajectory = { execution, task: "", decoder: new DeltaDecoder(execution), rejected: [], outcome: undefined }
    yield* readStored(system.nats, names.trajectoryStream, undefined, names.calls(execution)).pipe(
      Stream.runForEach((m) =>
        Effect.sync(() => {
          const record = decodeRecord(m.string())
          if (record._tag === "Failure") {
            t.rejected.push(new CallRecordRejected({ execution, callId: `seq:${m.seq}`, reason: "malformed", detail: String(record.cause) }))
            return
          }
          t.task = record.value.task
          t.rejected.push(...t.decoder.add(record.value).rejected)
        })
      )
    )
    const last = yield* readLast(system.nats, names.trajectoryStream, names.outcomes(execution))
    const outcome = last === undefined ? undefined : decodeOutcome(last.string())
    if (outcome?._tag === "Success") {
      t.outcome = outcome.value
      t.task = outcome.value.task
    }
    return t
  })
