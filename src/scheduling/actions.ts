/**
 * The shell: carries out journaled records. Every effect runs in a fiber of its own (keyed, in
 * the scheduler incarnation's scope), retries until it succeeds (every request is idempotent),
 * and reports its completion as a durable tell to the scheduler, which makes it the next input:
 *
 * | record | effect | completion |
 * | --- | --- | --- |
 * | `ExecutionStarted` | `RunExecution` on its runner, its tree read back | `ExecutionEnded` |
 * | `ExecutionFinished` of the running step's batch | `TrainExecution` to the step's core | (the core's `StepProgress`) |
 * | `SwitchRole {cell, role}` | device `SwitchRole` (destinations: serving cells, highest first; joining rollout: the newest version) | `SwitchCompleted` |
 * | `StartStep {step, core, cells}` | core `StartStep` (the batch's plan, attempt = the record's index), then `JoinStep` to the other cells and `TrainExecution` of the batch's finished executions | (the core's `StepDone`) |
 * | `JoinStep {step, cell}` | device `JoinStep`, once the core has started the step | |
 * | `PublishWeights {version}` | `LoadWeights` to every cell in the rollout role | `WeightsLoaded` |
 * | `CellJoined {cell}` after a publish | `LoadWeights` of the newest version to it | |
 * | `CellLost {cell}` | its fibers stop; running executions are asked again (they join); the step's core lost: the policy's next `StartStep` is a new attempt, told every finished execution again | |
 * | the last `StepDone` | `run-done`: the journal's audit (src/scheduling/audit.ts) | |
 *
 * `resume` starts, after a takeover, the effects of everything the book shows without its
 * completion; the receivers deduplicate (execution ids, message ids, idempotent steps).
 */
import { Context, Deferred, Effect, FiberMap, Layer, Schema, type Scope } from "effect"
import type { Rpc, RpcGroup } from "effect/rpc"
import type { ActorRef, ActorSystemShape } from "../runtime/system.ts"
import type { StepPlan } from "../protocols/device.ts"
import { SchedulerProtocol, type PolicyRecord } from "../protocols/scheduler.ts"
import { Device, type DeviceRef } from "../protocols/topology.ts"
import type { PlannedExecution } from "../protocols/run.ts"
import type { CellRole } from "../policy/vocabulary.ts"
import type { ExecutionOutcome } from "../tree/outcome.ts"
import type { Book, Finished, StepView } from "./book.ts"
import { readOutcome, type Ran, type Running } from "./dispatcher.ts"
import { auditRun, switchMessageId } from "./audit.ts"
import { journalRunDone, runDoneJournaled, type RunSummary } from "./records.ts"
import { persistently } from "../common/retry.ts"

type SchedulerRpcs = RpcGroup.Rpcs<typeof SchedulerProtocol>

export interface ShellOptions {
  readonly system: ActorSystemShape
  readonly book: Book
  readonly self: ActorRef<SchedulerRpcs>
  readonly sender: string
  readonly runExecution: (plan: PlannedExecution) => Effect.Effect<Ran>
  /** Ask timeout of device requests (a switch moves KV state: seconds). */
  readonly deviceTimeoutMs: number
  readonly now: () => number
  /** What the run's end says besides the journal's audit. */
  readonly facts: () => Pick<RunSummary, "run" | "policy" | "wallS">
}

export interface ShellShape {
  /** Starts the effects of a journaled record (and its completion's tell). */
  readonly execute: (record: PolicyRecord) => Effect.Effect<void>
  /** After a takeover: starts the effects of everything the book shows without its completion. */
  readonly resume: Effect.Effect<void>
}

/** The shell's state: its action fibers by key, and the signals its actions wait on. */
interface ShellState {
  readonly fibers: FiberMap.FiberMap<string>
  /** Attempts at steps (their record index) whose core has answered `StartStep`. */
  readonly started: Map<number, Deferred.Deferred<void>>
  /** Cells lost: their actions stop. */
  readonly gone: Map<number, Deferred.Deferred<void>>
}

/** What every action reads: the shell's options and state. */
interface ShellContext {
  readonly options: ShellOptions
  readonly state: ShellState
}

/** A device request to a cell the book no longer holds (retried until the cell's actions stop). */
class CellGone extends Schema.TaggedError<CellGone>()("CellGone", { cell: Schema.Number }) {}

const lostOutcome = (f: Finished, book: Book): ExecutionOutcome => ({
  run: book.config.run,
  task: `${book.config.suite}/${f.plan.task}`,
  execution: f.plan.execution,
  ended: "finished",
  evaluation: "failed",
  score: null,
  attempts: 0,
  detail: "outcome not found in the trajectory stream"
})

const signal = <K>(map: Map<K, Deferred.Deferred<void>>, key: K) => {
  let d = map.get(key)
  if (d === undefined) map.set(key, (d = Deferred.makeUnsafe<void>()))
  return d
}

/** Runs `effect` as the action `key`. Every action retries its failures, so one that ends otherwise died of a defect: said, not lost. */
const fork = (sc: ShellContext, key: string, effect: Effect.Effect<void>, onlyIfMissing = false) =>
  FiberMap.run(sc.state.fibers, key, effect.pipe(Effect.tapDefect((d) => Effect.logError(`scheduler action ${key} died`, d))), { onlyIfMissing }).pipe(Effect.asVoid)

/** `effect` until cell `cell` is lost. */
const whileCell = (sc: ShellContext, cell: number, effect: Effect.Effect<void>) => Effect.raceFirst(effect, Deferred.await(signal(sc.state.gone, cell)))

/** `effect` if `still()` holds when it starts (each retry asks again): a request the book made moot is dropped. */
const asLongAs = <A, E>(still: () => boolean, effect: Effect.Effect<A, E>) => Effect.suspend(() => (still() ? Effect.asVoid(effect) : Effect.void))

/** A cell's device, or `CellGone` once the book has lost the cell (its actions stop as `gone` is signalled). */
const cellDevice = (sc: ShellContext, cell: number): Effect.Effect<DeviceRef, CellGone> =>
  Effect.suspend(() => {
    const c = sc.options.book.cells.get(cell)
    return c === undefined ? Effect.fail(new CellGone({ cell })) : Effect.succeed(Device.refOfKey(c.device))
  })

/** A device request to cell `cell`'s device. */
const askCell = <A, E>(sc: ShellContext, cell: number, ask: (device: DeviceRef) => Effect.Effect<A, E>) => Effect.flatMap(cellDevice(sc, cell), ask)

/** A durable tell to the scheduler itself (its next input), retried until journaled. */
const tellSelf = <const Tag extends SchedulerRpcs["_tag"]>(
  sc: ShellContext,
  tag: Tag,
  payload: Rpc.Payload<Extract<SchedulerRpcs, { readonly _tag: Tag }>>,
  msgId: string
) => sc.options.system.tell(sc.options.self, tag, payload, { msgId, sender: sc.options.sender }).pipe(persistently(`tell ${tag}`), Effect.asVoid)

const execution = (sc: ShellContext, r: Running) => {
  const { runExecution, now } = sc.options
  return fork(
    sc,
    `x:${r.plan.n}`,
    runExecution(r.plan).pipe(
      Effect.flatMap((ran) =>
        tellSelf(
          sc,
          "ExecutionEnded",
          { execution: r.plan.execution, outcome: ran.outcome, tokens: ran.tokens, durationS: Math.max(0, now() - r.startedAt) },
          `ended-${r.plan.execution}`
        )
      )
    )
  )
}

const switchRole = (sc: ShellContext, cell: number, role: CellRole, index: number) => {
  const { book, system, deviceTimeoutMs } = sc.options
  const payload = role === "training" ? { role, destinations: book.cells.destinations(cell) } : { role, destinations: [], version: book.requested }
  return fork(
    sc,
    `switch:${cell}`,
    whileCell(
      sc,
      cell,
      askCell(sc, cell, (device) => system.ask(device, "SwitchRole", payload, { timeoutMs: deviceTimeoutMs })).pipe(
        persistently(`SwitchRole ${role} of cell ${cell}`),
        Effect.flatMap((result) => tellSelf(sc, "SwitchCompleted", { cell, role, result }, switchMessageId(index, cell)))
      )
    )
  )
}

/** `TrainExecution` of a finished execution to the step's core, once the core started the step. */
const train = (sc: ShellContext, view: StepView, f: Finished) => {
  const { book, system, sender } = sc.options
  const msgId = `train-${f.plan.execution}-a${view.attempt}`
  const tell = Effect.gen(function* () {
    yield* Deferred.await(signal(sc.state.started, view.attempt))
    const outcome =
      f.outcome ?? (yield* readOutcome(system, f.plan.execution).pipe(persistently(`reading the outcome of ${f.plan.execution}`))) ?? lostOutcome(f, book)
    const ref = { step: view.step, execution: f.plan.execution, task: f.plan.task, group: f.plan.group, tokens: f.tokens, outcome }
    yield* system.tell(Device.refOfKey(view.coreDevice), "TrainExecution", ref, { msgId, sender }).pipe(persistently(`TrainExecution ${f.plan.execution}`))
  })
  return fork(sc, `train:${view.attempt}:${f.plan.execution}`, whileCell(sc, view.core, tell), true)
}

const joinStep = (sc: ShellContext, view: StepView, cell: number) => {
  const { book, system, deviceTimeoutMs } = sc.options
  const plan = { step: view.step, attempt: view.attempt, version: view.step, core: view.coreDevice }
  const join = askCell(sc, cell, (device) => system.ask(device, "JoinStep", plan, { timeoutMs: deviceTimeoutMs }))
  return fork(
    sc,
    `join:${view.attempt}:${cell}`,
    whileCell(
      sc,
      cell,
      Deferred.await(signal(sc.state.started, view.attempt)).pipe(
        Effect.andThen(asLongAs(() => book.step?.attempt === view.attempt && book.step.members.has(cell), join)),
        persistently(`JoinStep ${view.step} of cell ${cell}`)
      )
    )
  )
}

/** The `StepPlan` of the book's running step: its batch's shape and the cells that join it. */
const stepPlanOf = (book: Book, view: StepView, joining: ReadonlyArray<number>): StepPlan => {
  const plan = book.plan(view.step)
  const groupSizes: Array<number> = []
  for (const p of plan) groupSizes[p.group] = (groupSizes[p.group] ?? 0) + 1
  return {
    step: view.step,
    attempt: view.attempt,
    version: view.step,
    executions: plan.length,
    groupSizes,
    cells: joining.flatMap((c) => book.cells.get(c)?.device ?? [])
  }
}

const startStep = (sc: ShellContext, view: StepView) => {
  const { book, system, deviceTimeoutMs } = sc.options
  const joining = [...view.members].filter(([, how]) => how === "join").map(([cell]) => cell)
  const stepPlan = stepPlanOf(book, view, joining)
  const toTell = book.finishedOf(view.step)
  const start = asLongAs(() => book.step?.attempt === view.attempt, system.ask(Device.refOfKey(view.coreDevice), "StartStep", stepPlan, { timeoutMs: deviceTimeoutMs })).pipe(
    persistently(`StartStep ${view.step}`),
    Effect.andThen(Deferred.succeed(signal(sc.state.started, view.attempt), undefined)),
    Effect.asVoid
  )
  return Effect.gen(function* () {
    yield* fork(sc, `step:${view.attempt}`, whileCell(sc, view.core, start))
    for (const cell of joining) yield* joinStep(sc, view, cell)
    for (const f of toTell) yield* train(sc, view, f)
  })
}

/**
 * Cell `cell` loads `version`: done, the cell lost, or the cell no longer in the rollout role
 * (a device leaving rollout refuses weights; it gets the newest version when it comes back).
 */
const load = (sc: ShellContext, cell: number, version: number) => {
  const { book, system, deviceTimeoutMs } = sc.options
  const request = askCell(sc, cell, (device) => system.ask(device, "LoadWeights", { version }, { timeoutMs: deviceTimeoutMs }))
  // A cell on its way back to rollout refuses weights until its switch ends: expected, retried.
  const returning = () => book.cells.get(cell)?.switching === true
  return whileCell(sc, cell, asLongAs(() => book.cells.get(cell)?.role === "rollout", request).pipe(persistently(`LoadWeights ${version} on cell ${cell}`, returning)))
}

const publish = (sc: ShellContext, version: number) => {
  const loads = sc.options.book.cells.rolloutCells().map((c) => load(sc, c.cell, version))
  return fork(
    sc,
    `publish:${version}`,
    Effect.all(loads, { concurrency: "unbounded", discard: true }).pipe(Effect.andThen(tellSelf(sc, "WeightsLoaded", { version }, `weights-${version}`)))
  )
}

/** The run's end, journaled once (with the journal's audit). */
const runDone = (sc: ShellContext) => {
  const { book, system, facts } = sc.options
  const journal = Effect.gen(function* () {
    if (yield* runDoneJournaled(system)) return
    const audit = yield* auditRun(system, book.config.policyConfig.executions_per_step)
    yield* journalRunDone(system, { ...facts(), ...audit })
  })
  return fork(sc, "run-done", journal.pipe(persistently("journaling the run's end")), true)
}

const reaskRunning = (sc: ShellContext) => Effect.suspend(() => Effect.forEach(sc.options.book.dispatcher.runningNow(), (r) => execution(sc, r), { discard: true }))

/** The effects of a record's event. */
const onEvent = (sc: ShellContext, e: PolicyRecord["event"]) =>
  Effect.gen(function* () {
    const { book } = sc.options
    if (e._tag === "ExecutionStarted") {
      const r = book.dispatcher.runningOf(e.execution)
      if (r !== undefined) yield* execution(sc, r)
    } else if (e._tag === "ExecutionFinished") {
      const f = book.finishedOf(e.batch).find((x) => x.plan.n === e.execution)
      if (f !== undefined && book.step?.step === e.batch) yield* train(sc, book.step, f)
    } else if (e._tag === "CellJoined" && book.requested > 0) {
      // A cell arrives serving rollouts: on the published version, as every rollout cell.
      yield* fork(sc, `load:${e.cell}`, load(sc, e.cell, book.requested))
    } else if (e._tag === "CellLost") {
      yield* Deferred.succeed(signal(sc.state.gone, e.cell), undefined)
      yield* reaskRunning(sc)
    } else if (e._tag === "StepDone" && book.done) yield* runDone(sc)
  })

/** The effects of a record's actions. */
const onActions = (sc: ShellContext, record: PolicyRecord) =>
  Effect.gen(function* () {
    const { book } = sc.options
    for (const a of record.actions) {
      if (a._tag === "SwitchRole") yield* switchRole(sc, a.cell, a.role, record.index)
      else if (a._tag === "StartStep" && book.step !== undefined) yield* startStep(sc, book.step)
      else if (a._tag === "JoinStep" && book.step?.step === a.step) yield* joinStep(sc, book.step, a.cell)
      else if (a._tag === "PublishWeights") yield* publish(sc, a.version)
    }
  })

const resume = (sc: ShellContext) =>
  Effect.gen(function* () {
    const { book } = sc.options
    yield* reaskRunning(sc)
    for (const c of book.cells.list()) if (c.switching) yield* switchRole(sc, c.cell, c.role, c.switchIndex)
    if (book.requested > book.published) yield* publish(sc, book.requested)
    if (book.step !== undefined) yield* startStep(sc, book.step)
    if (book.done) yield* runDone(sc)
  })

/** The shell of one scheduler incarnation: its action fibers live in the scope. */
const makeShell = Effect.fn("Shell.make")(function* (options: ShellOptions) {
  const sc: ShellContext = { options, state: { fibers: yield* FiberMap.make<string>(), started: new Map(), gone: new Map() } }
  const execute = Effect.fn("Shell.execute")(function* (record: PolicyRecord) {
    yield* onEvent(sc, record.event)
    yield* onActions(sc, record)
  })
  return { execute, resume: resume(sc) } satisfies ShellShape
})

/** The shell: carries out the scheduler's journaled records (the module comment). */
export class Shell extends Context.Service<Shell, ShellShape>()("gyre/scheduling/Shell") {
  /** A shell whose action fibers live in the scope (one scheduler incarnation's). */
  static readonly make: (options: ShellOptions) => Effect.Effect<ShellShape, never, Scope.Scope> = makeShell
  static readonly layer = (options: ShellOptions) => Layer.effect(Shell, makeShell(options))
}
