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
 * | `plans.jsonl` | training step: `step`, `plan` (its `StartStep`), `told` (its `TrainExecution`s, in the order the core got them) |
 * | `manifest.json` | `format`, `run`, the counts of each file |
 *
 * Calls are read back from the trajectory stream through the trainer's own `DeltaDecoder`
 * (`readTrajectories`), so the tokens are exactly the ones the trainer rebuilt.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Schema, Stream } from "effect"
import { readTrajectories, type ExecutionTrajectory } from "../protocols/trajectories.ts"
import { messageOf, type TransportError } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { readEntries } from "./read.ts"
import { stepLogs } from "./trees.ts"

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
  readonly finishReason: string
  readonly startedAt: number
  readonly finishedAt: number
}

/** The calls of one rebuilt execution, in the order the tree holds them. */
export const exportedCalls = (t: ExecutionTrajectory): Array<ExportedCall> => {
  const tree = t.decoder.tree
  return Array.from({ length: tree.callCount }, (_, i) => {
    const call = tree.call(i)
    const end = tree.locate(i, call.length - 1)
    const sequence = tree.callSequence(i)
    const info = t.decoder.callInfo(call.id)
    return {
      execution: t.execution,
      task: t.task,
      callId: call.id,
      role: call.role,
      prompt: Array.from(sequence.subarray(0, call.promptLength)),
      output: Array.from(sequence.subarray(call.promptLength)),
      logprobs: Array.from(tree.pathLogprobs(end).subarray(call.promptLength)),
      versions: Array.from(tree.pathVersions(end).subarray(call.promptLength)),
      finishReason: info?.finishReason ?? "",
      startedAt: info?.startedAt ?? 0,
      finishedAt: info?.finishedAt ?? 0
    }
  })
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

const lines = (values: Iterable<unknown>) => {
  let text = ""
  for (const v of values) text += `${JSON.stringify(v)}\n`
  return text
}

/** Writes the run to `dir` (created; files there are replaced). */
export const exportRun = (log: JournalSource, dir: string): Effect.Effect<ExportCounts, TransportError | ExportFailed> =>
  Effect.gen(function* () {
    const events: Array<unknown> = []
    const actions: Array<unknown> = []
    const steps: Array<unknown> = []
    let config: unknown
    yield* readEntries(log).pipe(
      Stream.runForEach((e) =>
        Effect.sync(() => {
          if (e.via === "event" && e.name === "run-config" && config === undefined) config = e.payload
          if (e.metrics !== undefined) steps.push(e.payload)
          if (e.record === undefined) return
          const { actions: acts, ...record } = e.payload as { actions: ReadonlyArray<unknown> }
          events.push({ seq: e.seq, time: e.time.toISOString(), ...record })
          for (const action of acts) actions.push({ seq: e.seq, index: e.record.index, action })
        })
      )
    )
    const plans = [...(yield* stepLogs(log)).entries()]
      .sort((a, b) => a[0] - b[0])
      .flatMap(([step, s]) => (s.plan === undefined ? [] : [{ step, plan: s.plan, told: s.told }]))
    const trajectories = yield* readTrajectories(log)
    const executions = [...trajectories.executions.values()].sort((a, b) => a.execution.localeCompare(b.execution, "en", { numeric: true }))
    const calls = executions.flatMap(exportedCalls)
    const outcomes = executions.flatMap((t) => (t.outcome === undefined ? [] : [t.outcome]))
    const counts = { events: events.length, actions: actions.length, calls: calls.length, outcomes: outcomes.length, steps: steps.length, plans: plans.length, malformed: trajectories.malformed.length }
    yield* Effect.try({
      try: () => {
        fs.mkdirSync(dir, { recursive: true })
        const write = (name: string, text: string) => fs.writeFileSync(path.join(dir, name), text)
        write("config.json", `${JSON.stringify(config ?? null, null, 2)}\n`)
        write("events.jsonl", lines(events))
        write("actions.jsonl", lines(actions))
        write("calls.jsonl", lines(calls))
        write("outcomes.jsonl", lines(outcomes))
        write("steps.jsonl", lines(steps))
        write("plans.jsonl", lines(plans))
        write("manifest.json", `${JSON.stringify({ format: EXPORT_FORMAT, run: log.run, ...counts }, null, 2)}\n`)
      },
      catch: (e) => new ExportFailed({ dir, message: messageOf(e) })
    })
    return counts
  })
