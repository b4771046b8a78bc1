/**
 * Reading a run's trajectories back: the `CallRecord`s and `ExecutionOutcome`s the stream
 * `GYRE_<run>_TRAJECTORIES` holds now, rebuilt into one prefix tree per execution with the
 * same `DeltaDecoder` the trainer and replay use. `readTrajectories` reads the whole stream
 * (or some executions of it); `readExecution` reads one execution's call records through a
 * filtered consumer on `gyre.<run>.calls.<execution>` (the core trainer, as each execution
 * of its step finishes). Both decode a message the same way (`applyMessage`).
 *
 * A harness runner marks each start of an execution on its calls subject before the harness
 * runs (`markExecutionStart`: an empty message with header `Gyre-Execution-Start`). An execution
 * run again (its runner died with it, and the scheduler asked for it again) is rebuilt from its
 * last start only: the calls of the attempt that died are not part of what was scored.
 *
 * A record too long for one message arrives in parts (`record-parts.ts`): the reader joins them
 * and applies the record when its last part is read; parts of a record that never completed are
 * reported as malformed.
 */
import { Effect, Schema, Stream } from "effect"
import { headers } from "@nats-io/transport-node"
import { publishBytes } from "../runtime/channel-io.ts"
import type { TransportError } from "../runtime/errors.ts"
import { readStored, type StreamMessage } from "../runtime/stream-reader.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { DeltaDecoder } from "../tree/decoder.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { CallRecordJson, type CallRecordRejected } from "../tree/record.ts"
import { rlLayout } from "./layout.ts"
import { RecordAssembler, partOf } from "./record-parts.ts"
import { Calls } from "./topology.ts"

export interface ExecutionTrajectory {
  readonly execution: string
  task: string
  decoder: DeltaDecoder
  rejected: Array<CallRecordRejected>
  outcome: ExecutionOutcome | undefined
  /** Parts of records not yet whole. */
  readonly parts: RecordAssembler
}

/** A message that was not a valid record or outcome (with its stream sequence). */
export interface MalformedMessage {
  readonly seq: number
  readonly subject: string
  readonly reason: string
}

export interface Trajectories {
  readonly executions: ReadonlyMap<string, ExecutionTrajectory>
  readonly malformed: ReadonlyArray<MalformedMessage>
}

const START_HEADER = "Gyre-Execution-Start"

/** Marks a start of `execution` on its calls subject (see the module comment); `runner` names who starts it. */
export const markExecutionStart = (system: JournalSource, execution: string, runner: string) =>
  Effect.suspend(() => {
    const h = headers()
    h.set(START_HEADER, runner)
    return publishBytes(system, Calls, execution, { data: new Uint8Array(0), headers: h })
  })

const decodeRecord = Schema.decodeUnknownExit(CallRecordJson)
const decodeOutcome = Schema.decodeUnknownExit(Schema.fromJsonString(ExecutionOutcome))

const emptyTrajectory = (execution: string): ExecutionTrajectory => ({
  execution,
  task: "",
  decoder: new DeltaDecoder(execution),
  rejected: [],
  outcome: undefined,
  parts: new RecordAssembler()
})

/** Applies one trajectory-stream message (a call record or an outcome) to its execution's trajectory. */
const applyMessage = (
  names: ReturnType<typeof rlLayout>,
  m: StreamMessage,
  of: (execution: string) => ExecutionTrajectory | undefined,
  malformed: Array<MalformedMessage>
): void => {
  const callsPrefix = names.calls("")
  const isCall = m.subject.startsWith(callsPrefix)
  const execution = m.subject.slice((isCall ? callsPrefix : names.outcomes("")).length)
  const t = of(execution)
  if (t === undefined) return
  const bad = (reason: string) => void malformed.push({ seq: m.seq, subject: m.subject, reason })
  if (isCall && m.headers?.has(START_HEADER) === true) {
    t.decoder = new DeltaDecoder(execution)
    t.rejected = []
    t.parts.clear()
  } else if (isCall) {
    const part = partOf(m.headers)
    if (part !== undefined && "malformed" in part) return bad(part.malformed)
    const whole = part === undefined ? m.data : t.parts.add(part.call, part.index, part.count, m.data, m.seq)
    if (whole === undefined) return
    if (!(whole instanceof Uint8Array)) return bad(whole.malformed)
    const record = decodeRecord(part === undefined ? m.string() : Buffer.from(whole.buffer, whole.byteOffset, whole.byteLength).toString("utf8"))
    if (record._tag === "Failure") return bad(String(record.cause))
    t.task = record.value.task
    t.rejected.push(...t.decoder.add(record.value).rejected)
  } else {
    const outcome = decodeOutcome(m.string())
    if (outcome._tag === "Failure") return bad(String(outcome.cause))
    t.task = outcome.value.task
    t.outcome = outcome.value
  }
}

/** Records of `t` whose parts never all arrived, as malformed messages (at their first part). */
const incompleteRecords = (names: ReturnType<typeof rlLayout>, t: ExecutionTrajectory): Array<MalformedMessage> =>
  t.parts.incomplete().map(({ seq, reason }) => ({ seq, subject: names.calls(t.execution), reason }))

/** Rebuilds the run's executions (or those in `only`) from what the trajectory stream holds now. */
export const readTrajectories = (
  system: JournalSource,
  only?: ReadonlySet<string>
): Effect.Effect<Trajectories, TransportError> =>
  Effect.gen(function* () {
    const names = rlLayout(system.run)
    const executions = new Map<string, ExecutionTrajectory>()
    const malformed: Array<MalformedMessage> = []
    const of = (execution: string) => {
      if (only !== undefined && !only.has(execution)) return undefined
      let t = executions.get(execution)
      if (t === undefined) {
        t = emptyTrajectory(execution)
        executions.set(execution, t)
      }
      return t
    }
    yield* readStored(system.nats, names.trajectoryStream).pipe(
      Stream.runForEach((m) => Effect.sync(() => applyMessage(names, m, of, malformed)))
    )
    for (const t of executions.values()) malformed.push(...incompleteRecords(names, t))
    return { executions, malformed }
  })

/**
 * Rebuilds one execution from its call records on the stream now (its outcome is not read:
 * the caller has it). An execution with no records yet has an empty tree.
 */
export const readExecution = (
  system: JournalSource,
  execution: string
): Effect.Effect<{ readonly trajectory: ExecutionTrajectory; readonly malformed: ReadonlyArray<MalformedMessage> }, TransportError> =>
  Effect.gen(function* () {
    const names = rlLayout(system.run)
    const trajectory = emptyTrajectory(execution)
    const malformed: Array<MalformedMessage> = []
    yield* readStored(system.nats, names.trajectoryStream, { seq: 1 }, names.calls(execution)).pipe(
      Stream.runForEach((m) => Effect.sync(() => applyMessage(names, m, () => trajectory, malformed)))
    )
    malformed.push(...incompleteRecords(names, trajectory))
    return { trajectory, malformed }
  })
