/**
 * One run as it stands, read from its log: what `gyre status`, `gyre runs`, the live progress of
 * `gyre train` and `gyre report` show.
 *
 * `readRunLog` reads the run's journal once through `read.ts`'s typed entries (policy records,
 * step metrics, switch results, the run's configuration and end); `RunView` folds policy records in index order into the cells'
 * roles, weights versions and role timeline, and the execution and step counts. `runStatus`
 * adds what only the server knows now: the running step's micro-batch queue, the actors' tell
 * queues, liveness from the registry, and the last held-out score (the outcomes of the
 * `<run>-heldout-after`, else `-before`, evaluation run). `runListings` does the cheap part of
 * this for every run a server holds. Nothing here writes to the run.
 */
import { Effect, Schema, Stream } from "effect"
import { TransportError, messageOf } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import type { NatsShape } from "../runtime/nats.ts"
import { layout } from "../runtime/names.ts"
import { readLast, readStored } from "../runtime/stream-reader.ts"
import { RunConfig } from "../protocols/run.ts"
import { rlLayout } from "../protocols/layout.ts"
import { Events } from "../protocols/topology.ts"
import { type PolicyRecord, StepMetrics, SCHEDULER_KIND } from "../protocols/scheduler.ts"
import type { SwitchResult } from "../protocols/device.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { listRuns, readEntries } from "./read.ts"

/** What a cell is doing: its role, or between roles, or in the training role without a step. */
export type Activity = "rollout" | "training" | "switching" | "idle" | "lost"

export interface Segment {
  readonly activity: Activity
  /** Policy clock, seconds since the run started. */
  readonly from: number
  readonly to: number
}

export interface CellView {
  readonly cell: number
  readonly device: string
  activity: Activity
  /** The weights version the cell holds, as the policy knows it. */
  version: number
  readonly segments: Array<Segment>
  since: number
}

export interface SwitchDoneEntry {
  readonly cell: number
  readonly role: string
  readonly result: SwitchResult
}

/** A step's metrics without what only `--trees` reads (its trees and micro-batch digests), so a run's log stays small. */
export type StepFigures = Omit<StepMetrics, "trees" | "batchDigests">

/** A step's error: an execution it could not train in full, and why. */
export interface TrainingError {
  readonly step: number
  readonly execution: string
  readonly reason: string
}

/** Every training error of the steps, in step order. */
export const trainingErrors = (steps: ReadonlyArray<Pick<StepMetrics, "step" | "errors">>): Array<TrainingError> =>
  steps.flatMap((m) => (m.errors ?? []).map((e) => ({ step: m.step, ...e })))

/** What the journal holds about the run, decoded. */
export interface RunLog {
  readonly run: string
  readonly config: RunConfig | undefined
  readonly records: ReadonlyArray<PolicyRecord>
  readonly steps: ReadonlyArray<StepFigures>
  readonly switches: ReadonlyArray<SwitchDoneEntry>
  readonly ended: boolean
}

const decodeMetrics = Events.step.decode
const decodeConfig = Events.runConfig.decode
const decodeOutcome = Schema.decodeUnknownExit(Schema.fromJsonString(ExecutionOutcome))

/** Reads the run's journal as it is now (one pass). */
export const readRunLog = (system: JournalSource): Effect.Effect<RunLog, TransportError> =>
  Effect.gen(function* () {
    const records = new Map<number, PolicyRecord>()
    const steps: Array<StepFigures> = []
    const switches: Array<SwitchDoneEntry> = []
    let config: RunConfig | undefined
    let ended = false
    yield* readEntries(system).pipe(
      Stream.runForEach((entry) =>
        Effect.sync(() => {
          if (entry.record !== undefined) {
            if (!records.has(entry.record.index)) records.set(entry.record.index, entry.record)
          } else if (entry.metrics !== undefined) {
            const { trees: _trees, batchDigests: _digests, ...figures } = entry.metrics
            steps.push(figures)
          }
          else if (entry.via === "event") {
            if (entry.name === "run-config") {
              const c = decodeConfig(entry.payload)
              if (c._tag === "Success") config = c.value
            } else if (entry.name === "run-done") ended = true
          } else if (entry.via === "tell" && entry.actor?.kind === SCHEDULER_KIND && entry.name === "SwitchCompleted" && entry.error === undefined) {
            switches.push(entry.payload as SwitchDoneEntry)
          }
        })
      )
    )
    const ordered = [...records.keys()].sort((a, b) => a - b).map((i) => records.get(i)!)
    return { run: system.run, config, records: ordered, steps, switches, ended }
  })

/**
 * The policy records folded, one at a time: cells and their timelines, executions dispatched /
 * started / finished, the running step and its cells, the published version.
 */
export class RunView {
  readonly cells = new Map<number, CellView>()
  dispatched = 0
  started = 0
  finished = 0
  stepsDone = 0
  published = 0
  /** The step being trained and its cells, while one is. */
  running: { step: number; startedAt: number; cells: Set<number> } | undefined
  /** Each finished step's policy-clock span. */
  readonly stepSpans: Array<{ readonly step: number; readonly from: number; readonly to: number }> = []
  at = 0
  index = -1

  constructor(readonly executionsPerStep: number) {}

  private move(cell: number, activity: Activity, at: number) {
    const c = this.cells.get(cell)
    if (c === undefined || c.activity === activity || c.activity === "lost") return
    if (at > c.since) c.segments.push({ activity: c.activity, from: c.since, to: at })
    c.activity = activity
    c.since = at
  }

  apply(record: PolicyRecord): void {
    const e = record.event
    const at = e.at
    this.at = Math.max(this.at, at)
    this.index = record.index
    switch (e._tag) {
      case "CellJoined":
        this.cells.set(e.cell, { cell: e.cell, device: record.device ?? `cell ${e.cell}`, activity: "rollout", version: this.published, segments: [], since: at })
        break
      case "CellLost":
        this.move(e.cell, "lost", at)
        this.running?.cells.delete(e.cell)
        break
      case "ExecutionStarted":
        this.started++
        break
      case "ExecutionFinished":
        this.finished++
        break
      case "SwitchDone":
        this.move(e.cell, e.role === "rollout" ? "rollout" : this.running?.cells.has(e.cell) ? "training" : "idle", at)
        break
      case "StepDone": {
        this.stepsDone++
        const running = this.running
        for (const cell of running?.cells ?? []) {
          this.move(cell, "idle", at)
          this.cells.get(cell)!.version = e.step + 1
        }
        this.stepSpans.push({ step: e.step, from: running?.startedAt ?? at, to: at })
        this.running = undefined
        break
      }
      case "WeightsPublished":
        this.published = Math.max(this.published, e.version)
        for (const c of this.cells.values()) if (c.activity === "rollout") c.version = Math.max(c.version, e.version)
        break
      case "MicroStepDone":
        break
    }
    for (const a of record.actions) {
      if (a._tag === "Dispatch") this.dispatched += this.executionsPerStep
      else if (a._tag === "SwitchRole") this.move(a.cell, "switching", at)
      else if (a._tag === "StartStep") {
        this.running = { step: a.step, startedAt: at, cells: new Set(a.cells) }
        for (const cell of a.cells) this.joinStep(cell, at)
      } else if (a._tag === "JoinStep" && this.running !== undefined) {
        this.running.cells.add(a.cell)
        this.joinStep(a.cell, at)
      }
    }
  }

  private joinStep(cell: number, at: number) {
    if (this.cells.get(cell)?.activity !== "switching") this.move(cell, "training", at)
  }

  /** Every cell's segments up to `end` (the open one closed there). */
  timeline(end: number): Array<{ readonly cell: number; readonly device: string; readonly segments: ReadonlyArray<Segment> }> {
    return [...this.cells.values()]
      .sort((a, b) => a.cell - b.cell)
      .map((c) => ({
        cell: c.cell,
        device: c.device,
        segments: c.activity === "lost" || end <= c.since ? c.segments : [...c.segments, { activity: c.activity, from: c.since, to: end }]
      }))
  }
}

/** Folds a run log's records. */
export const viewOf = (log: RunLog): RunView => {
  const view = new RunView(log.config?.policyConfig.executions_per_step ?? 0)
  for (const r of log.records) view.apply(r)
  return view
}

const tryNats = <A>(operation: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (e) => new TransportError({ operation, message: messageOf(e) }) })

/** `kind__id` consumer names back to `kind/id` (names.ts escapes bytes outside [A-Za-z0-9-] as `_xx`). */
const addressOfConsumer = (name: string): string => {
  const unescape = (s: string) => s.replace(/_([0-9a-f]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16)))
  const cut = name.indexOf("__")
  return cut < 0 ? name : `${unescape(name.slice(0, cut))}/${unescape(name.slice(cut + 2))}`
}

export interface QueueDepth {
  /** The actor whose tells wait (its durable consumer on the journal). */
  readonly actor: string
  /** Tells stored and not yet delivered. */
  readonly pending: number
  /** Delivered and not yet acknowledged (being handled). */
  readonly handling: number
}

/** The actors' tell queues on the journal stream. */
export const queueDepths = (nats: NatsShape, run: string): Effect.Effect<Array<QueueDepth>, TransportError> =>
  tryNats(`consumers of ${layout(run).journalStream}`, async () => {
    const out: Array<QueueDepth> = []
    for await (const c of nats.jsm.consumers.list(layout(run).journalStream)) {
      if (c.config.durable_name === undefined) continue
      out.push({ actor: addressOfConsumer(c.name), pending: c.num_pending, handling: c.num_ack_pending })
    }
    return out.sort((a, b) => a.actor.localeCompare(b.actor))
  })

export interface MicroBatchCounts {
  readonly step: number
  /** Not claimed yet. */
  readonly pending: number
  /** Claimed by a device, not done. */
  readonly claimed: number
  /** Done (acknowledged: the work queue removed them). */
  readonly done: number
}

/** The running step's micro-batch queue (its shared consumer `mb-<step>`), if it exists. */
export const microBatchCounts = (nats: NatsShape, run: string, step: number): Effect.Effect<MicroBatchCounts | undefined> => {
  const names = rlLayout(run)
  return tryNats("micro-batch queue", () => nats.jsm.consumers.info(names.microBatchStream, names.microBatchConsumer(step))).pipe(
    Effect.map((c) => ({ step, pending: c.num_pending, claimed: c.num_ack_pending, done: Math.max(0, c.delivered.consumer_seq - c.num_ack_pending - c.num_redelivered) })),
    Effect.orElseSucceed(() => undefined)
  )
}

export interface HeldOutScore {
  /** The evaluation run (`<run>-heldout-after` or `-before`). */
  readonly run: string
  readonly meanScore: number
  readonly tasks: number
}

/** The mean score of an evaluation run's outcomes, undefined when it has none. */
export const evaluationScore = (nats: NatsShape, evalRun: string): Effect.Effect<HeldOutScore | undefined> => {
  const names = rlLayout(evalRun)
  return readStored(nats, names.trajectoryStream, { seq: 1 }, names.allOutcomes).pipe(
    Stream.runFold(
      () => new Map<string, number>(),
      (scores, m) => {
        const o = decodeOutcome(m.string())
        if (o._tag === "Success") scores.set(o.value.execution, o.value.score ?? 0)
        return scores
      }
    ),
    Effect.map((scores) =>
      scores.size === 0 ? undefined : { run: evalRun, meanScore: [...scores.values()].reduce((a, b) => a + b, 0) / scores.size, tasks: scores.size }
    ),
    Effect.orElseSucceed(() => undefined)
  )
}

/** The last held-out score of a `gyre train` run: after training if scored, else before. */
export const lastHeldOut = (nats: NatsShape, run: string) =>
  Effect.gen(function* () {
    const after = yield* evaluationScore(nats, `${run}-heldout-after`)
    return after ?? (yield* evaluationScore(nats, `${run}-heldout-before`))
  })

/** Live: some node of the run heartbeat within `freshMs` (registry entries `node/...`, writer's wall clock). */
export const isLive = (nats: NatsShape, run: string, freshMs = 30_000): Effect.Effect<boolean> =>
  tryNats("registry", async () => {
    const kv = await nats.kvm.open(layout(run).registryBucket)
    for await (const key of await kv.keys()) {
      if (!key.startsWith("node/")) continue
      const e = await kv.get(key)
      const entry = e?.operation === "PUT" ? (e.json() as { status?: string; heartbeatAt?: number }) : undefined
      if (entry?.status === "running" && Date.now() - (entry.heartbeatAt ?? 0) < freshMs) return true
    }
    return false
  }).pipe(Effect.orElseSucceed(() => false))

export type RunState = "live" | "ended" | "stopped"

const stateOf = (ended: boolean, live: boolean): RunState => (ended ? "ended" : live ? "live" : "stopped")

export interface RunStatus {
  readonly run: string
  readonly policy: string | undefined
  readonly state: RunState
  readonly startedAt: string | undefined
  /** Policy clock of the last record, seconds. */
  readonly elapsedS: number
  readonly records: number
  readonly devices: ReadonlyArray<{ readonly cell: number; readonly device: string; readonly activity: Activity; readonly version: number; readonly sinceS: number }>
  readonly executions: { readonly planned: number; readonly dispatched: number; readonly running: number; readonly finished: number }
  readonly steps: { readonly done: number; readonly planned: number; readonly running: number | undefined; readonly microBatches: MicroBatchCounts | undefined }
  readonly weightsPublished: number
  readonly lastTrainScore: number | undefined
  readonly heldOut: HeldOutScore | undefined
  readonly queues: ReadonlyArray<QueueDepth>
  /** Executions the steps could not train in full: how many, and the last `STATUS_ERRORS` of them. */
  readonly trainingErrors: { readonly count: number; readonly last: ReadonlyArray<TrainingError> }
}

/** Training errors `gyre status` lists (the count covers all). */
export const STATUS_ERRORS = 10

/** The run's status now. */
export const runStatus = (system: JournalSource): Effect.Effect<RunStatus, TransportError> =>
  Effect.gen(function* () {
    const log = yield* readRunLog(system)
    const view = viewOf(log)
    const nats = system.nats
    const running = view.running?.step
    const pc = log.config?.policyConfig
    const errors = trainingErrors(log.steps)
    return {
      run: system.run,
      policy: log.config?.policy,
      state: stateOf(log.ended, yield* isLive(nats, system.run)),
      startedAt: log.config === undefined ? undefined : new Date(log.config.startedAt).toISOString(),
      elapsedS: view.at,
      records: log.records.length,
      devices: view.timeline(view.at).map((t) => {
        const c = view.cells.get(t.cell)!
        return { cell: c.cell, device: c.device, activity: c.activity, version: c.version, sinceS: c.since }
      }),
      executions: { planned: (pc?.steps ?? 0) * (pc?.executions_per_step ?? 0), dispatched: view.dispatched, running: view.started - view.finished, finished: view.finished },
      steps: {
        done: view.stepsDone,
        planned: pc?.steps ?? 0,
        running,
        microBatches: running === undefined ? undefined : yield* microBatchCounts(nats, system.run, running)
      },
      weightsPublished: view.published,
      lastTrainScore: log.steps.at(-1)?.meanScore,
      heldOut: yield* lastHeldOut(nats, system.run),
      queues: yield* queueDepths(nats, system.run),
      trainingErrors: { count: errors.length, last: errors.slice(-STATUS_ERRORS) }
    }
  })

export interface RunListing {
  readonly run: string
  readonly policy: string | undefined
  readonly startedAt: string | undefined
  readonly stepsDone: number
  readonly stepsPlanned: number | undefined
  readonly state: RunState
}

/** Every run whose journal the server holds (evaluation runs included: they have no policy). */
export const runListings = (nats: NatsShape): Effect.Effect<Array<RunListing>, TransportError> =>
  Effect.gen(function* () {
    const runs = yield* listRuns(nats)
    return yield* Effect.forEach(runs, (run) =>
      Effect.gen(function* () {
        const names = layout(run)
        const configMsg = yield* readLast(nats, names.journalStream, Events.runConfig.subject(run))
        const c = configMsg === undefined ? undefined : decodeConfig(configMsg.json())
        const config = c?._tag === "Success" ? c.value : undefined
        const lastStep = yield* readLast(nats, names.journalStream, Events.step.subject(run))
        const m = lastStep === undefined ? undefined : decodeMetrics(lastStep.json())
        const ended = (yield* readLast(nats, names.journalStream, Events.runDone.subject(run))) !== undefined
        return {
          run,
          policy: config?.policy,
          startedAt: config === undefined ? undefined : new Date(config.startedAt).toISOString(),
          stepsDone: m?._tag === "Success" ? m.value.step + 1 : 0,
          stepsPlanned: config?.policyConfig.steps,
          state: stateOf(ended, yield* isLive(nats, run))
        }
      })
    )
  })
