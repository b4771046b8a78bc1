/**
 * `gyre replay --export DIR`: a run as plain JSON lines any tool can read (format in
 * ARCHITECTURE.md, "Replay"):
 *
 * | file | one line per |
 * | --- | --- |
 * | `config.json` | the run's `RunConfig` (one JSON document) |
 * | `events.jsonl` | policy record: `seq`, `time`, `index`, `term`, `event`, `digest` (+ `device`, `incarnation`) |
 * | `actions.jsonl` | action of a record: `seq`, `index`, `action` |
 * | `calls.jsonl` | model call, decoded: `execution`, `task`, `callId`, `role`, `prompt` and `output` (token ids), `logprobs` and `versions` (per output token), `finishReason`, `startedAt`, `finishedAt` |
 * | `outcomes.jsonl` | `ExecutionOutcome` |
 * | `steps.jsonl` | `StepMetrics` of a step |
 * | `plans.jsonl` | training step: `step`, `plan` (the plan its metrics carry, else its `StartStep`), `told` (its `TrainExecution`s, in the order the core got them) |
 * | `manifest.json` | `format`, `run`, the counts of each file |
 *
 * Calls are read back from the trajectory stream through the trainer's own `DeltaDecoder`
 * (`readExecution`, one execution at a time), so the tokens are exactly the ones the trainer
 * rebuilt. The export writes as it reads: memory holds one execution's tree and one call's
 * line in slices, never a file or the run.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Schema, Stream } from "effect"
import { rlLayout } from "../protocols/layout.ts"
import { Calls, Outcomes } from "../protocols/topology.ts"
import { readExecution, type ExecutionTrajectory } from "../protocols/trajectories.ts"
import { keysOf } from "../runtime/channel-io.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { readLast } from "../runtime/stream-reader.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { LineWriter } from "./lines.ts"
import { readEntries } from "./read.ts"
import { StepCollector, type StepLog } from "./trees.ts"
import type { RecordedFinish } from "../tree/record.ts"

export const EXPORT_FORMAT = 1

/** The export directory could not be written. */
export class ExportFailed extends Schema.TaggedError<ExportFailed>()("ExportFailed", { dir: Schema.String, message: Schema.String }) {}

/** One call of an export's `calls.jsonl`. */
export interface ExportedCall {
  readonly execution: string
  readonly task: string
  readonly callId: string
  readonly role: string
  readonly prompt: ReadonlyArray<number>
  readonly output: ReadonlyArray<number>
  readonly logprobs: ReadonlyArray<number>
  readonly versions: ReadonlyArray<number>
  /** Empty when the call's record is not in the export. */
  readonly finishReason: RecordedFinish | ""
  readonly startedAt: number
  readonly finishedAt: number
}

/** Writes call `i` of a rebuilt execution as one line of `calls.jsonl`, its arrays in slices. */
const writeCall = (out: LineWriter, t: ExecutionTrajectory, i: number): void => {
  const tree = t.decoder.tree
  const call = tree.call(i)
  const end = tree.locate(i, call.length - 1)
  const sequence = tree.callSequence(i)
  const info = t.decoder.callInfo(call.id)
  const text = (key: string, value: unknown, first = false) => out.write(`${first ? "{" : ","}${JSON.stringify(key)}:${JSON.stringify(value)}`)
  const array = (key: string, values: ArrayLike<number>) => {
    out.write(`,${JSON.stringify(key)}:`)
    out.numbers(values)
  }
  text("execution", t.execution, true)
  text("task", t.task)
  text("callId", call.id)
  text("role", call.role)
  array("prompt", sequence.subarray(0, call.promptLength))
  array("output", sequence.subarray(call.promptLength))
  array("logprobs", tree.pathLogprobs(end).subarray(call.promptLength))
  array("versions", tree.pathVersions(end).subarray(call.promptLength))
  text("finishReason", info?.finishReason ?? "")
  text("startedAt", info?.startedAt ?? 0)
  text("finishedAt", info?.finishedAt ?? 0)
  out.write("}")
  out.end()
}

export interface ExportCounts {
  readonly events: number
  readonly actions: number
  readonly calls: number
  readonly outcomes: number
  readonly steps: number
  readonly plans: number
  /** Trajectory messages that did not decode (not exported). */
  readonly malformed: number
}

const decodeOutcome = Schema.decodeUnknownExit(Schema.fromJsonString(ExecutionOutcome))

/** The executions with call records or an outcome on the trajectory stream, in execution order. */
const executionsOf = (log: JournalSource) =>
  Effect.all([keysOf(log, Calls), keysOf(log, Outcomes)]).pipe(
    Effect.map(([calls, outcomes]) => [...new Set([...calls, ...outcomes])].sort((a, b) => a.localeCompare(b, "en", { numeric: true })))
  )

/** Exports one execution: its calls (rebuilt from its records) and its last outcome; returns the messages that did not decode. */
const exportExecution = (log: JournalSource, execution: string, calls: LineWriter, outcomes: LineWriter) =>
  Effect.gen(function* () {
    const { trajectory, malformed } = yield* readExecution(log, execution)
    const last = yield* readLast(log.nats, rlLayout(log.run).trajectoryStream, rlLayout(log.run).outcomes(execution))
    const outcome = last === undefined ? undefined : decodeOutcome(last.string())
    if (outcome?._tag === "Success" && trajectory.task === "") trajectory.task = outcome.value.task
    for (let i = 0; i < trajectory.decoder.tree.callCount; i++) writeCall(calls, trajectory, i)
    if (outcome?._tag === "Success") outcomes.json(outcome.value)
    return malformed.length + (outcome?._tag === "Failure" ? 1 : 0)
  })

const FILES = ["events", "actions", "calls", "outcomes", "steps", "plans"] as const

/**
 * Writes the run to `dir` (created; files there are replaced) as it reads it: the journal once
 * (events, actions, steps; each step's plan line when its metrics come, `StepCollector`), then
 * each execution's records and outcome, one execution at a time.
 */
export const exportRun = (log: JournalSource, dir: string): Effect.Effect<ExportCounts, TransportError | ExportFailed> =>
  Effect.gen(function* () {
    const files = yield* Effect.try({
      try: () => {
        fs.mkdirSync(dir, { recursive: true })
        return Object.fromEntries(FILES.map((f) => [f, new LineWriter(path.join(dir, `${f}.jsonl`))])) as Record<(typeof FILES)[number], LineWriter>
      },
      catch: (e) => new ExportFailed({ dir, message: messageOf(e) })
    })
    const write = (f: () => void) => Effect.try({ try: f, catch: (e) => new ExportFailed({ dir, message: messageOf(e) }) })
    // The plan the step's metrics carry (its last attempt's, journaled durably), else its first StartStep's journal copy.
    const planLine = (s: StepLog) => {
      const plan = s.metrics?.plan ?? s.plan
      if (plan !== undefined) files.plans.json({ step: s.step, plan, told: s.told })
    }
    let config: unknown
    let malformed = 0
    const steps = new StepCollector()
    const body = Effect.gen(function* () {
      yield* readEntries(log).pipe(
        Stream.runForEach((e) =>
          write(() => {
            if (e.via === "event" && e.name === "run-config" && config === undefined) config = e.payload
            if (e.metrics !== undefined) files.steps.json(e.payload)
            const done = steps.add(e)
            if (done !== undefined) planLine(done)
            if (e.record === undefined) return
            const { actions: acts, ...record } = e.payload as { actions: ReadonlyArray<unknown> }
            files.events.json({ seq: e.seq, time: e.time.toISOString(), ...record })
            for (const action of acts) files.actions.json({ seq: e.seq, index: e.record.index, action })
          })
        )
      )
      yield* write(() => steps.rest().forEach(planLine))
      for (const execution of yield* executionsOf(log)) malformed += yield* exportExecution(log, execution, files.calls, files.outcomes)
    })
    yield* body.pipe(Effect.ensuring(Effect.sync(() => FILES.forEach((f) => files[f].close()))))
    const counts = { ...Object.fromEntries(FILES.map((f) => [f, files[f].lines])), malformed } as unknown as ExportCounts
    yield* write(() => {
      fs.writeFileSync(path.join(dir, "config.json"), `${JSON.stringify(config ?? null, null, 2)}\n`)
      fs.writeFileSync(path.join(dir, "manifest.json"), `${JSON.stringify({ format: EXPORT_FORMAT, run: log.run, ...counts }, null, 2)}\n`)
    })
    return counts
  })
