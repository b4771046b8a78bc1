/**
 * The bookkeeping every policy shares: what it has been told (cells, counters d/p/f, finished
 * tokens per batch, published version, steps done) and what it has itself asked for (dispatched
 * batches, switches in flight, cells in the running step).
 *
 * A policy state holds a `Ledger` beside the policy's own fields. `observe` folds an event in;
 * `decide` runs a policy's decision rules, folding each action back in as it is emitted
 * (`record`), so later rules read the state earlier actions left: decisions are level-triggered,
 * the same ledger always yields the same actions.
 *
 * Ledgers are immutable values. They are copied with `next` (an object literal, not a spread:
 * V8 spreads an object of this size an order of magnitude slower, and a simulated run copies
 * the ledger for every event).
 */
import { Schema } from "effect"
import { PolicyConfig, CellRole, type PolicyAction, type PolicyEvent } from "./vocabulary.ts"

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

/** A cell as the policy sees it. `role` is where it is going when `switching`. */
export const CellView = Schema.Struct({
  cell: Count,
  role: CellRole,
  switching: Schema.Boolean,
  inStep: Schema.Boolean
})
export type CellView = typeof CellView.Type

/** A dispatched batch not yet trained: how many of its executions finished, with how many tokens. */
export const BatchView = Schema.Struct({ finished: Count, tokens: Count })
export type BatchView = typeof BatchView.Type

export const Ledger = Schema.Struct({
  config: PolicyConfig,
  /** Cells in join order; the first is the core. */
  cells: Schema.Array(CellView),
  /** Counts over `cells`, kept with them so rules run in O(1) per execution event. */
  serving: Count, // role rollout, not switching: C_R(t) / C_e
  rolloutBound: Count, // role rollout, switching or not
  trainingReady: Count, // role training, not switching
  trainersIdle: Count, // role training, not switching, not in the running step
  /** d(t), p(t), f(t): executions dispatched, started, finished. */
  dispatched: Count,
  started: Count,
  finished: Count,
  /** Next batch to dispatch. */
  nextBatch: Count,
  /** Newest version on the rollout cells. */
  published: Count,
  /** Steps trained; also the step running or next to run. */
  stepsDone: Count,
  stepRunning: Schema.Boolean,
  /** Core of the running step: it leaves the step last and rejoins it first (-1: no step). */
  stepCore: Schema.Int,
  /** Tokens of the running step trained so far (from `MicroStepDone`). */
  trainedTokens: Count,
  /** Batches `stepsDone .. nextBatch - 1`. */
  batches: Schema.Array(BatchView)
})
export type Ledger = typeof Ledger.Type

export const emptyLedger = (config: PolicyConfig): Ledger => ({
  config,
  cells: [],
  serving: 0,
  rolloutBound: 0,
  trainingReady: 0,
  trainersIdle: 0,
  dispatched: 0,
  started: 0,
  finished: 0,
  nextBatch: 0,
  published: 0,
  stepsDone: 0,
  stepRunning: false,
  stepCore: -1,
  trainedTokens: 0,
  batches: []
})

/** `l` with the fields of `d` replaced. */
const next = (l: Ledger, d: Partial<Ledger>): Ledger => ({
  config: l.config,
  cells: d.cells ?? l.cells,
  serving: d.serving ?? l.serving,
  rolloutBound: d.rolloutBound ?? l.rolloutBound,
  trainingReady: d.trainingReady ?? l.trainingReady,
  trainersIdle: d.trainersIdle ?? l.trainersIdle,
  dispatched: d.dispatched ?? l.dispatched,
  started: d.started ?? l.started,
  finished: d.finished ?? l.finished,
  nextBatch: d.nextBatch ?? l.nextBatch,
  published: d.published ?? l.published,
  stepsDone: d.stepsDone ?? l.stepsDone,
  stepRunning: d.stepRunning ?? l.stepRunning,
  stepCore: d.stepCore ?? l.stepCore,
  trainedTokens: d.trainedTokens ?? l.trainedTokens,
  batches: d.batches ?? l.batches
})

/** What a cell adds to each count. */
const counts = (c: CellView) => {
  const rollout = c.role === "rollout"
  return {
    serving: rollout && !c.switching ? 1 : 0,
    rolloutBound: rollout ? 1 : 0,
    trainingReady: !rollout && !c.switching ? 1 : 0,
    trainersIdle: !rollout && !c.switching && !c.inStep ? 1 : 0
  }
}

/** `l` with `cells` replaced, the counts over them recomputed, and the fields of `d` replaced. */
const withCells = (l: Ledger, cells: ReadonlyArray<CellView>, d: Partial<Ledger> = {}): Ledger => {
  let serving = 0
  let rolloutBound = 0
  let trainingReady = 0
  let trainersIdle = 0
  for (const c of cells) {
    const n = counts(c)
    serving += n.serving
    rolloutBound += n.rolloutBound
    trainingReady += n.trainingReady
    trainersIdle += n.trainersIdle
  }
  return next(l, { ...d, cells, serving, rolloutBound, trainingReady, trainersIdle })
}

/** `l` with the execution counters and batches replaced: the per-execution path, kept lean. */
const withProgress = (l: Ledger, started: number, finished: number, batches: ReadonlyArray<BatchView>): Ledger => ({
  config: l.config,
  cells: l.cells,
  serving: l.serving,
  rolloutBound: l.rolloutBound,
  trainingReady: l.trainingReady,
  trainersIdle: l.trainersIdle,
  dispatched: l.dispatched,
  started,
  finished,
  nextBatch: l.nextBatch,
  published: l.published,
  stepsDone: l.stepsDone,
  stepRunning: l.stepRunning,
  stepCore: l.stepCore,
  trainedTokens: l.trainedTokens,
  batches
})

/** Index of cell `cell` in `cells` (cells joined in id order sit at their id). */
const indexOf = (cells: ReadonlyArray<CellView>, cell: number): number =>
  cells[cell]?.cell === cell ? cell : cells.findIndex((c) => c.cell === cell)

/** `l` with cell `cell` replaced by `f` of it, the counts adjusted. */
const updateCell = (l: Ledger, cell: number, f: (c: CellView) => CellView): Ledger => {
  const i = indexOf(l.cells, cell)
  if (i < 0) return l
  const was = counts(l.cells[i]!)
  const now = f(l.cells[i]!)
  const is = counts(now)
  const cells = l.cells.slice()
  cells[i] = now
  return next(l, {
    cells,
    serving: l.serving - was.serving + is.serving,
    rolloutBound: l.rolloutBound - was.rolloutBound + is.rolloutBound,
    trainingReady: l.trainingReady - was.trainingReady + is.trainingReady,
    trainersIdle: l.trainersIdle - was.trainersIdle + is.trainersIdle
  })
}

/** Folds an event into the bookkeeping. */
export const observe = (l: Ledger, event: PolicyEvent): Ledger => {
  switch (event._tag) {
    case "ExecutionStarted":
      return withProgress(l, l.started + 1, l.finished, l.batches)
    case "ExecutionFinished": {
      const i = event.batch - l.stepsDone
      const b = l.batches[i]!
      const batches = l.batches.slice()
      batches[i] = { finished: b.finished + 1, tokens: b.tokens + event.tokens }
      return withProgress(l, l.started, l.finished + 1, batches)
    }
    case "CellJoined":
      return withCells(l, [...l.cells, { cell: event.cell, role: "rollout", switching: false, inStep: false }])
    case "CellLost": {
      const cells = l.cells.filter((c) => c.cell !== event.cell)
      if (!l.stepRunning || l.stepCore !== event.cell) return withCells(l, cells)
      // The step's core is gone with its accumulated gradients: the step starts again (its
      // batch's data is kept) on a core the policy chooses next.
      return withCells(
        l,
        cells.map((c) => (c.inStep ? { ...c, inStep: false } : c)),
        { stepRunning: false, stepCore: -1, trainedTokens: 0 }
      )
    }
    case "SwitchDone":
      return updateCell(l, event.cell, (c) => ({ ...c, role: event.role, switching: false }))
    case "MicroStepDone":
      return event.step === l.stepsDone ? next(l, { trainedTokens: event.trained_tokens }) : l
    case "StepDone":
      return withCells(
        l,
        l.cells.map((c) => (c.inStep ? { ...c, inStep: false } : c)),
        { stepsDone: l.stepsDone + 1, stepRunning: false, stepCore: -1, trainedTokens: 0, batches: l.batches.slice(1) }
      )
    case "WeightsPublished":
      return next(l, { published: Math.max(l.published, event.version) })
  }
}

/** Folds the policy's own action into the bookkeeping. */
export const record = (l: Ledger, action: PolicyAction): Ledger => {
  switch (action._tag) {
    case "Dispatch":
      return next(l, {
        nextBatch: action.batch + 1,
        dispatched: l.dispatched + l.config.executions_per_step,
        batches: [...l.batches, { finished: 0, tokens: 0 }]
      })
    case "SwitchRole":
      return updateCell(l, action.cell, (c) => ({ ...c, role: action.role, switching: true, inStep: false }))
    case "StartStep": {
      const members = new Set(action.cells)
      return withCells(
        l,
        l.cells.map((c) => (members.has(c.cell) ? { ...c, inStep: true } : c)),
        { stepRunning: true, stepCore: action.core, trainedTokens: 0 }
      )
    }
    case "JoinStep":
      return updateCell(l, action.cell, (c) => ({ ...c, inStep: true }))
    case "PublishWeights":
      return l
  }
}

/** One decision in progress: the ledger as the actions so far left it, and those actions. */
export class Decision {
  actions: Array<PolicyAction> = noActions
  constructor(public ledger: Ledger) {}

  act(action: PolicyAction): void {
    if (this.actions === noActions) this.actions = []
    this.actions.push(action)
    this.ledger = record(this.ledger, action)
  }
}

const noActions: Array<PolicyAction> = []
Object.freeze(noActions)

/** Observes `event`, then runs `rules`, which emit actions through the `Decision`. */
export const decide = (ledger: Ledger, event: PolicyEvent, rules: (d: Decision, event: PolicyEvent) => void): Decision => {
  const d = new Decision(observe(ledger, event))
  rules(d, event)
  return d
}

// ---- rules and views shared by the policies -----------------------------------------------

/** The batch step `step` trains, if dispatched and not yet trained. */
export const batchOf = (l: Ledger, step: number): BatchView | undefined => l.batches[step - l.stepsDone]

/** Whether every execution of the batch of step `step` has finished. */
export const batchComplete = (l: Ledger, step: number): boolean =>
  batchOf(l, step)?.finished === l.config.executions_per_step

/** Whether the staleness bound lets the next batch be dispatched now. */
export const mayDispatch = (l: Ledger): boolean =>
  l.nextBatch < l.config.steps && l.published >= l.nextBatch - l.config.max_staleness

/** Dispatches every batch the staleness bound allows. */
export const dispatchAllowed = (d: Decision): void => {
  while (mayDispatch(d.ledger)) d.act({ _tag: "Dispatch", batch: d.ledger.nextBatch })
}

/** Publishes the version a `StepDone` event just produced. */
export const publishOnStepDone = (d: Decision, event: PolicyEvent): void => {
  if (event._tag === "StepDone") d.act({ _tag: "PublishWeights", version: event.step + 1 })
}

/** Training-role cells ready to work (arrived, not switching) that are not in the running step. */
const idleTrainers = (l: Ledger): Array<number> =>
  l.trainersIdle === 0 ? [] : l.cells.filter((c) => c.role === "training" && !c.switching && !c.inStep).map((c) => c.cell)

/** Whether the running step's core is in it (a satellite may join only then). */
const coreIn = (l: Ledger): boolean => l.cells[indexOf(l.cells, l.stepCore)]?.inStep === true

/** Lets every idle training cell join the running step, its core first. */
export const joinRunningStep = (d: Decision): void => {
  const l = d.ledger
  if (!l.stepRunning || l.trainersIdle === 0) return
  const cells = idleTrainers(l)
  const core = cells.indexOf(l.stepCore)
  if (core >= 0) d.act({ _tag: "JoinStep", step: l.stepsDone, cell: l.stepCore })
  else if (!coreIn(l)) return
  for (const cell of cells) if (cell !== l.stepCore) d.act({ _tag: "JoinStep", step: l.stepsDone, cell })
}

/** Starts the next step on every idle training cell (the first is the core). */
export const startStep = (d: Decision): void => {
  const cells = idleTrainers(d.ledger)
  if (cells.length > 0) d.act({ _tag: "StartStep", step: d.ledger.stepsDone, core: cells[0]!, cells })
}

/** Whether an event can change a cell's role or readiness (rules that scan cells run on these). */
export const touchesCells = (event: PolicyEvent): boolean =>
  event._tag === "CellJoined" || event._tag === "CellLost" || event._tag === "SwitchDone" || event._tag === "StepDone"
