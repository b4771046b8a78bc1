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
import { readJournal, type JournalSource } from "../runtime/journal.ts"
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

/** Reads the run's journal as it is now and counts. */
export const auditRun = (system: JournalSource, executionsPerStep: number): Effect.Effect<RunAudit, TransportError> =>
  Effect.gen(function* () {
    const records = new Map<number, { readonly json: string; readonly record: PolicyRecord }>()
    const conflicting = new Set<number>()
    // One per step, the last journaled: a step started again after its core was lost journals the
    // attempt that counted after any a lost core journaled before it died (its update was discarded).
    const byStep = new Map<number, StepMetrics>()
    const malformed: Array<{ seq: number; reason: string }> = []
    const switches: Array<{ role: string; msgId: string | undefined; reprefill: number; bytes: number; controlMs: number; ms: number }> = []
    yield* readJournal(system, { protocols: { [SCHEDULER_KIND]: SchedulerProtocol } }).pipe(
      Stream.runForEach((entry) =>
        Effect.sync(() => {
          if (entry.via === "event" && entry.name === "policy") {
            const r = decodeRecord(entry.payload)
            if (r._tag === "Failure") return void malformed.push({ seq: entry.seq, reason: `policy record: ${String(r.cause)}` })
            const json = JSON.stringify(entry.payload)
            const seen = records.get(r.value.index)
            if (seen !== undefined && seen.json !== json) conflicting.add(r.value.index)
            if (seen === undefined) records.set(r.value.index, { json, record: r.value })
          } else if (entry.via === "event" && entry.name === "step") {
            const m = decodeMetrics(entry.payload)
            if (m._tag === "Failure") return void malformed.push({ seq: entry.seq, reason: `step metrics: ${String(m.cause)}` })
            byStep.set(m.value.step, m.value)
          } else if (entry.via === "tell" && entry.actor?.kind === SCHEDULER_KIND && entry.name === "SwitchCompleted") {
            if (entry.error !== undefined) return void malformed.push({ seq: entry.seq, reason: entry.error })
            const { role, result } = entry.payload as { readonly role: string; readonly result: { reprefillTokens: number; bytesMoved: number; controlMs: number; ms: number } }
            switches.push({ role, msgId: entry.msgId, reprefill: result.reprefillTokens, bytes: result.bytesMoved, controlMs: result.controlMs, ms: result.ms })
          }
        })
      )
    )
    const steps = [...byStep.values()].sort((a, b) => a.step - b.step)
    const indices = [...records.keys()].sort((a, b) => a - b)
    const gaps: Array<number> = []
    for (let i = 0; i < indices.length - 1; i++) for (let k = indices[i]! + 1; k < indices[i + 1]!; k++) gaps.push(k)
    let dispatched = 0
    let started = 0
    let stepsDone = 0
    const finished = new Map<number, { execution: number; duration_s: number; tokens: number }>()
    const stepDoneAt = new Map<number, number>()
    const weightSyncS: Array<number> = []
    const cells: Array<string> = []
    const coreLeaving = coreLeavingSwitches(indices.map((index) => records.get(index)!.record))
    for (const i of indices) {
      const { event, actions, device } = records.get(i)!.record
      if (event._tag === "CellJoined" && device !== undefined) cells.push(device)
      if (event._tag === "ExecutionStarted") started++
      if (event._tag === "ExecutionFinished") finished.set(event.execution, { execution: event.execution, duration_s: event.duration_s, tokens: event.tokens })
      if (event._tag === "StepDone") {
        stepsDone++
        stepDoneAt.set(event.step + 1, event.at)
      }
      if (event._tag === "WeightsPublished" && stepDoneAt.has(event.version)) weightSyncS.push(event.at - stepDoneAt.get(event.version)!)
      for (const a of actions) if (a._tag === "Dispatch") dispatched++
    }
    let lost = 0
    for (let n = 0; n < stepsDone * executionsPerStep; n++) if (!finished.has(n)) lost++
    const trainedIn = new Map<string, number>()
    for (const s of steps) for (const e of s.trainedExecutions) trainedIn.set(e, (trainedIn.get(e) ?? 0) + 1)
    const sum = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0)
    return {
      records: records.size,
      recordGaps: gaps,
      conflictingRecords: [...conflicting],
      terms: [...new Set(indices.map((i) => records.get(i)!.record.term))],
      cells,
      dispatchedBatches: dispatched,
      executionsStarted: started,
      executionsFinished: finished.size,
      executionsLost: lost,
      stepsDone,
      lastStepDoneS: Math.max(0, ...stepDoneAt.values()),
      switches: switches.length,
      reprefillTokens: sum(switches.map((s) => s.reprefill)),
      kvHandoffBytes: sum(switches.map((s) => s.bytes)),
      switchControlMs: switches.map((s) => s.controlMs),
      switchMs: {
        rollout: switches.filter((s) => s.role === "rollout" && !coreLeaving.has(s.msgId ?? "")).map((s) => s.ms),
        rolloutCore: switches.filter((s) => s.role === "rollout" && coreLeaving.has(s.msgId ?? "")).map((s) => s.ms),
        training: switches.filter((s) => s.role === "training").map((s) => s.ms)
      },
      executions: [...finished.values()].sort((a, b) => a.execution - b.execution),
      weightSyncS,
      staleDropped: sum(steps.map((s) => s.staleTokens)),
      trainedTwice: [...trainedIn.values()].filter((n) => n > 1).length,
      steps,
      malformed
    }
  })
