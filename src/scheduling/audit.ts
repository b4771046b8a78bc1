/**
 * What a run's journal says happened, counted: the figures `gyre train` prints at the end and a
 * run's integrity checks read from the log alone, so they hold for any run a NATS server keeps
 * (live, finished, or resumed after a crash) and never trust an actor's memory.
 *
 * Sources: the scheduler's `PolicyRecord`s (`gyre.<run>.sys.policy`: events and actions), its
 * `SwitchCompleted` inputs (the devices' `SwitchResult` figures), and the trainer's `StepMetrics`
 * (`gyre.<run>.sys.step`).
 */
import { Effect, Schema, Stream } from "effect"
import type { TransportError } from "../runtime/errors.ts"
import { readJournal, type JournalEntry, type JournalSource } from "../runtime/journal.ts"
import { PolicyRecord, SchedulerProtocol, StepMetrics, SCHEDULER_KIND } from "../protocols/scheduler.ts"

export interface RunAudit {
  readonly records: number
  /** Record indices missing between the first and the last (lost policy records). */
  readonly recordGaps: ReadonlyArray<number>
  /** Record indices written more than once with different content (two writers). */
  readonly conflictingRecords: ReadonlyArray<number>
  readonly terms: ReadonlyArray<number>
  /** Devices that joined as cells, in join order (cell 0 first). */
  readonly cells: ReadonlyArray<string>
  readonly dispatchedBatches: number
  readonly executionsStarted: number
  readonly executionsFinished: number
  /** Executions of trained batches that never finished. */
  readonly executionsLost: number
  readonly stepsDone: number
  /** The policy clock (seconds since the run's start) at the last `StepDone`: the run's makespan. */
  readonly lastStepDoneS: number
  readonly switches: number
  readonly reprefillTokens: number
  readonly kvHandoffBytes: number
  readonly switchControlMs: ReadonlyArray<number>
  /**
   * Whole switches, milliseconds, by the role the cell went to; `rolloutCore`: to rollout by the
   * core of a running step (it serves once its step's update is done), `rollout` the others.
   */
  readonly switchMs: { readonly rollout: ReadonlyArray<number>; readonly rolloutCore: ReadonlyArray<number>; readonly training: ReadonlyArray<number> }
  /** Finished executions in run order: the policy's duration and token count of each. */
  readonly executions: ReadonlyArray<{ readonly execution: number; readonly duration_s: number; readonly tokens: number }>
  /** Per published version: seconds from its `StepDone` to its `WeightsPublished` (policy clock). */
  readonly weightSyncS: ReadonlyArray<number>
  readonly staleDropped: number
  /** Executions trained in more than one step. */
  readonly trainedTwice: number
  readonly steps: ReadonlyArray<StepMetrics>
  /** Journal messages that did not decode as what their subject promises. */
  readonly malformed: ReadonlyArray<{ readonly seq: number; readonly reason: string }>
}

/** Message id of the `SwitchCompleted` of the switch asked for by record `index` (the shell writes it, the audit reads it). */
export const switchMessageId = (index: number, cell: number) => `switch-${index}-${cell}`

/** Message ids of the switches to rollout asked of a running step's core, from the records in index order. */
export const coreLeavingSwitches = (
  records: ReadonlyArray<Pick<PolicyRecord, "index" | "event" | "actions">>
): ReadonlySet<string> => {
  const ids = new Set<string>()
  let runningCore = -1
  for (const { index, event, actions } of records) {
    if (event._tag === "StepDone") runningCore = -1
    for (const a of actions) {
      if (a._tag === "StartStep") runningCore = a.core
      if (a._tag === "SwitchRole" && a.role === "rollout" && a.cell === runningCore) ids.add(switchMessageId(index, a.cell))
    }
  }
  return ids
}

const decodeRecord = Schema.decodeUnknownExit(PolicyRecord)
const decodeMetrics = Schema.decodeUnknownExit(StepMetrics)

/** What the audit keeps of the journal: the policy records by index, the step metrics, the switches and what did not decode. */
interface JournalRead {
  readonly records: Map<number, { readonly json: string; readonly record: PolicyRecord }>
  /** Record indices written more than once with different content. */
  readonly conflicting: Set<number>
  // One per step, the last journaled: a step started again after its core was lost journals the
  // attempt that counted after any a lost core journaled before it died (its update was discarded).
  readonly byStep: Map<number, StepMetrics>
  readonly malformed: Array<{ seq: number; reason: string }>
  readonly switches: Array<Switch>
}

interface Switch {
  readonly role: string
  readonly msgId: string | undefined
  readonly reprefill: number
  readonly bytes: number
  readonly controlMs: number
  readonly ms: number
}

/** Keeps one journal entry: a policy record, a step's metrics or a `SwitchCompleted`; one that does not decode is `malformed`. */
const take = (read: JournalRead, entry: JournalEntry): void => {
  if (entry.via === "event" && entry.name === "policy") {
    const r = decodeRecord(entry.payload)
    if (r._tag === "Failure") return void read.malformed.push({ seq: entry.seq, reason: `policy record: ${String(r.cause)}` })
    const json = JSON.stringify(entry.payload)
    const seen = read.records.get(r.value.index)
    if (seen !== undefined && seen.json !== json) read.conflicting.add(r.value.index)
    if (seen === undefined) read.records.set(r.value.index, { json, record: r.value })
  } else if (entry.via === "event" && entry.name === "step") {
    const m = decodeMetrics(entry.payload)
    if (m._tag === "Failure") return void read.malformed.push({ seq: entry.seq, reason: `step metrics: ${String(m.cause)}` })
    read.byStep.set(m.value.step, m.value)
  } else if (entry.via === "tell" && entry.actor?.kind === SCHEDULER_KIND && entry.name === "SwitchCompleted") {
    if (entry.error !== undefined) return void read.malformed.push({ seq: entry.seq, reason: entry.error })
    const { role, result } = entry.payload as { readonly role: string; readonly result: { reprefillTokens: number; bytesMoved: number; controlMs: number; ms: number } }
    read.switches.push({ role, msgId: entry.msgId, reprefill: result.reprefillTokens, bytes: result.bytesMoved, controlMs: result.controlMs, ms: result.ms })
  }
}

const readRunJournal = (system: JournalSource) =>
  Effect.gen(function* () {
    const read: JournalRead = { records: new Map(), conflicting: new Set(), byStep: new Map(), malformed: [], switches: [] }
    yield* readJournal(system, { protocols: { [SCHEDULER_KIND]: SchedulerProtocol } }).pipe(Stream.runForEach((entry) => Effect.sync(() => take(read, entry))))
    return read
  })

/** Missing indices between the first and the last of `indices` (sorted). */
const gapsOf = (indices: ReadonlyArray<number>) => {
  const gaps: Array<number> = []
  for (let i = 0; i < indices.length - 1; i++) for (let k = indices[i]! + 1; k < indices[i + 1]!; k++) gaps.push(k)
  return gaps
}

/** The policy records' counts, in index order. */
const countRecords = (records: ReadonlyArray<PolicyRecord>) => {
  const c = {
    dispatched: 0,
    started: 0,
    stepsDone: 0,
    finished: new Map<number, { execution: number; duration_s: number; tokens: number }>(),
    stepDoneAt: new Map<number, number>(),
    weightSyncS: new Array<number>(),
    cells: new Array<string>()
  }
  for (const { event, actions, device } of records) {
    if (event._tag === "CellJoined" && device !== undefined) c.cells.push(device)
    if (event._tag === "ExecutionStarted") c.started++
    if (event._tag === "ExecutionFinished") c.finished.set(event.execution, { execution: event.execution, duration_s: event.duration_s, tokens: event.tokens })
    if (event._tag === "StepDone") {
      c.stepsDone++
      c.stepDoneAt.set(event.step + 1, event.at)
    }
    if (event._tag === "WeightsPublished" && c.stepDoneAt.has(event.version)) c.weightSyncS.push(event.at - c.stepDoneAt.get(event.version)!)
    for (const a of actions) if (a._tag === "Dispatch") c.dispatched++
  }
  return c
}

const sum = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0)

/** The switches' figures; a switch to rollout by a running step's core is `rolloutCore`. */
const switchFigures = (switches: ReadonlyArray<Switch>, coreLeaving: ReadonlySet<string>) => ({
  switches: switches.length,
  reprefillTokens: sum(switches.map((s) => s.reprefill)),
  kvHandoffBytes: sum(switches.map((s) => s.bytes)),
  switchControlMs: switches.map((s) => s.controlMs),
  switchMs: {
    rollout: switches.filter((s) => s.role === "rollout" && !coreLeaving.has(s.msgId ?? "")).map((s) => s.ms),
    rolloutCore: switches.filter((s) => s.role === "rollout" && coreLeaving.has(s.msgId ?? "")).map((s) => s.ms),
    training: switches.filter((s) => s.role === "training").map((s) => s.ms)
  }
})

/** Reads the run's journal as it is now and counts. */
export const auditRun = (system: JournalSource, executionsPerStep: number): Effect.Effect<RunAudit, TransportError> =>
  Effect.gen(function* () {
    const { records, conflicting, byStep, malformed, switches } = yield* readRunJournal(system)
    const steps = [...byStep.values()].sort((a, b) => a.step - b.step)
    const indices = [...records.keys()].sort((a, b) => a - b)
    const inOrder = indices.map((index) => records.get(index)!.record)
    const c = countRecords(inOrder)
    let lost = 0
    for (let n = 0; n < c.stepsDone * executionsPerStep; n++) if (!c.finished.has(n)) lost++
    const trainedIn = new Map<string, number>()
    for (const s of steps) for (const e of s.trainedExecutions) trainedIn.set(e, (trainedIn.get(e) ?? 0) + 1)
    return {
      records: records.size,
      recordGaps: gapsOf(indices),
      conflictingRecords: [...conflicting],
      terms: [...new Set(inOrder.map((r) => r.term))],
      cells: c.cells,
      dispatchedBatches: c.dispatched,
      executionsStarted: c.started,
      executionsFinished: c.finished.size,
      executionsLost: lost,
      stepsDone: c.stepsDone,
      lastStepDoneS: Math.max(0, ...c.stepDoneAt.values()),
      ...switchFigures(switches, coreLeavingSwitches(inOrder)),
      executions: [...c.finished.values()].sort((a, b) => a.execution - b.execution),
      weightSyncS: c.weightSyncS,
      staleDropped: sum(steps.map((s) => s.staleTokens)),
      trainedTwice: [...trainedIn.values()].filter((n) => n > 1).length,
      steps,
      malformed
    }
  })
