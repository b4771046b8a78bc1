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
import { Deferred, Effect, FiberMap, type Scope } from "effect"
import type { Rpc, RpcGroup } from "effect/rpc"
import { parseAddress } from "../runtime/names.ts"
import { refOf, type ActorRef, type ActorSystemShape } from "../runtime/system.ts"
import { DeviceProtocol, type StepPlan } from "../protocols/device.ts"
import { SchedulerProtocol, type PolicyRecord } from "../protocols/scheduler.ts"
import type { PlannedExecution } from "../protocols/run.ts"
import type { Role } from "../policy/vocabulary.ts"
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

export interface Shell {
  readonly execute: (record: PolicyRecord) => Effect.Effect<void>
  readonly resume: Effect.Effect<void>
}

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

export const makeShell = (options: ShellOptions): Effect.Effect<Shell, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { system, book, deviceTimeoutMs } = options
    const fibers = yield* FiberMap.make<string>()
    /** Attempts at steps (their record index) whose core has answered `StartStep`. */
    const started = new Map<number, Deferred.Deferred<void>>()
    const gone = new Map<number, Deferred.Deferred<void>>()
    const signal = <K>(map: Map<K, Deferred.Deferred<void>>, key: K) => {
      let d = map.get(key)
      if (d === undefined) map.set(key, (d = Deferred.makeUnsafe<void>()))
      return d
    }
    // Every action retries its failures, so one that ends otherwise died of a defect: said, not lost.
    const fork = (key: string, effect: Effect.Effect<void>, onlyIfMissing = false) =>
      FiberMap.run(fibers, key, effect.pipe(Effect.tapDefect((d) => Effect.logError(`scheduler action ${key} died`, d))), { onlyIfMissing }).pipe(Effect.asVoid)
    /** `effect` until cell `cell` is lost. */
    const whileCell = (cell: number, effect: Effect.Effect<void>) => Effect.raceFirst(effect, Deferred.await(signal(gone, cell)))
    /** `effect` if `still()` holds when it starts (each retry asks again): a request the book made moot is dropped. */
    const asLongAs = <A, E>(still: () => boolean, effect: Effect.Effect<A, E>) => Effect.suspend(() => (still() ? Effect.asVoid(effect) : Effect.void))
    const device = (cell: number) => refOf(DeviceProtocol, parseAddress(book.cells.get(cell)?.device ?? "device/unknown"))
    const ask = options.system.ask
    const tellSelf = <const Tag extends SchedulerRpcs["_tag"]>(tag: Tag, payload: Rpc.Payload<Extract<SchedulerRpcs, { readonly _tag: Tag }>>, msgId: string) =>
      system.tell(options.self, tag, payload, { msgId, sender: options.sender }).pipe(persistently(`tell ${tag}`), Effect.asVoid)

    const execution = (r: Running) =>
      fork(
        `x:${r.plan.n}`,
        options.runExecution(r.plan).pipe(
          Effect.flatMap((ran) =>
            tellSelf(
              "ExecutionEnded",
              { execution: r.plan.execution, outcome: ran.outcome, tokens: ran.tokens, durationS: Math.max(0, options.now() - r.startedAt) },
              `ended-${r.plan.execution}`
            )
          )
        )
      )

    const switchRole = (cell: number, role: Role, index: number) => {
      const to = device(cell)
      const payload =
        role === "training" ? { role, destinations: book.cells.destinations(cell) } : { role, destinations: [], version: book.requested }
      return fork(
        `switch:${cell}`,
        whileCell(
          cell,
          ask(to, "SwitchRole", payload, { timeoutMs: deviceTimeoutMs }).pipe(
            persistently(`SwitchRole ${role} of cell ${cell}`),
            Effect.flatMap((result) => tellSelf("SwitchCompleted", { cell, role, result }, switchMessageId(index, cell)))
          )
        )
      )
    }

    const train = (view: StepView, f: Finished) => {
      const core = refOf(DeviceProtocol, parseAddress(view.coreDevice))
      const msgId = `train-${f.plan.execution}-a${view.attempt}`
      return fork(
        `train:${view.attempt}:${f.plan.execution}`,
        whileCell(
          view.core,
          Effect.gen(function* () {
            yield* Deferred.await(signal(started, view.attempt))
            const outcome =
              f.outcome ?? (yield* readOutcome(system, f.plan.execution).pipe(persistently(`reading the outcome of ${f.plan.execution}`))) ?? lostOutcome(f, book)
            const ref = { step: view.step, execution: f.plan.execution, task: f.plan.task, group: f.plan.group, tokens: f.tokens, outcome }
            yield* system.tell(core, "TrainExecution", ref, { msgId, sender: options.sender }).pipe(persistently(`TrainExecution ${f.plan.execution}`))
          })
        ),
        true
      )
    }

    const joinStep = (view: StepView, cell: number) =>
      fork(
        `join:${view.attempt}:${cell}`,
        whileCell(
          cell,
          Deferred.await(signal(started, view.attempt)).pipe(
            Effect.andThen(
              asLongAs(
                () => book.step?.attempt === view.attempt && book.step.members.has(cell),
                ask(device(cell), "JoinStep", { step: view.step, attempt: view.attempt, version: view.step, core: view.coreDevice }, { timeoutMs: deviceTimeoutMs })
              )
            ),
            persistently(`JoinStep ${view.step} of cell ${cell}`)
          )
        )
      )

    const startStep = (view: StepView) => {
      const plan = book.plan(view.step)
      const groupSizes: Array<number> = []
      for (const p of plan) groupSizes[p.group] = (groupSizes[p.group] ?? 0) + 1
      const joining = [...view.members].filter(([, how]) => how === "join").map(([cell]) => cell)
      const stepPlan: StepPlan = {
        step: view.step,
        attempt: view.attempt,
        version: view.step,
        executions: plan.length,
        groupSizes,
        cells: joining.map((c) => book.cells.get(c)?.device ?? "")
      }
      const toTell = book.finishedOf(view.step)
      return Effect.gen(function* () {
        yield* fork(
          `step:${view.attempt}`,
          whileCell(
            view.core,
            asLongAs(() => book.step?.attempt === view.attempt, ask(refOf(DeviceProtocol, parseAddress(view.coreDevice)), "StartStep", stepPlan, { timeoutMs: deviceTimeoutMs })).pipe(
              persistently(`StartStep ${view.step}`),
              Effect.andThen(Deferred.succeed(signal(started, view.attempt), undefined)),
              Effect.asVoid
            )
          )
        )
        for (const cell of joining) yield* joinStep(view, cell)
        for (const f of toTell) yield* train(view, f)
      })
    }

    /**
     * Cell `cell` loads `version`: done, the cell lost, or the cell no longer in the rollout role
     * (a device leaving rollout refuses weights; it gets the newest version when it comes back).
     */
    const load = (cell: number, version: number) => {
      const to = device(cell)
      const request = ask(to, "LoadWeights", { version }, { timeoutMs: deviceTimeoutMs })
      // A cell on its way back to rollout refuses weights until its switch ends: expected, retried.
      const returning = () => book.cells.get(cell)?.switching === true
      return whileCell(cell, asLongAs(() => book.cells.get(cell)?.role === "rollout", request).pipe(persistently(`LoadWeights ${version} on cell ${cell}`, returning)))
    }

    const publish = (version: number) => {
      const loads = book.cells.rolloutCells().map((c) => load(c.cell, version))
      return fork(
        `publish:${version}`,
        Effect.all(loads, { concurrency: "unbounded", discard: true }).pipe(Effect.andThen(tellSelf("WeightsLoaded", { version }, `weights-${version}`)))
      )
    }

    const runDone = fork(
      "run-done",
      Effect.gen(function* () {
        if (yield* runDoneJournaled(system)) return
        const audit = yield* auditRun(system, book.config.policyConfig.executions_per_step)
        yield* journalRunDone(system, { ...options.facts(), ...audit })
      }).pipe(persistently("journaling the run's end")),
      true
    )

    const reaskRunning = Effect.suspend(() => Effect.forEach(book.dispatcher.runningNow(), execution, { discard: true }))

    const execute = (record: PolicyRecord) =>
      Effect.gen(function* () {
        const e = record.event
        if (e._tag === "ExecutionStarted") {
          const r = book.dispatcher.runningOf(e.execution)
          if (r !== undefined) yield* execution(r)
        } else if (e._tag === "ExecutionFinished") {
          const f = book.finishedOf(e.batch).find((x) => x.plan.n === e.execution)
          if (f !== undefined && book.step?.step === e.batch) yield* train(book.step, f)
        } else if (e._tag === "CellJoined" && book.requested > 0) {
          // A cell arrives serving rollouts: on the published version, as every rollout cell.
          yield* fork(`load:${e.cell}`, load(e.cell, book.requested))
        } else if (e._tag === "CellLost") {
          yield* Deferred.succeed(signal(gone, e.cell), undefined)
          yield* reaskRunning
        } else if (e._tag === "StepDone" && book.done) yield* runDone
        for (const a of record.actions) {
          if (a._tag === "SwitchRole") yield* switchRole(a.cell, a.role, record.index)
          else if (a._tag === "StartStep" && book.step !== undefined) yield* startStep(book.step)
          else if (a._tag === "JoinStep" && book.step?.step === a.step) yield* joinStep(book.step, a.cell)
          else if (a._tag === "PublishWeights") yield* publish(a.version)
        }
      })

    const resume = Effect.gen(function* () {
      yield* reaskRunning
      for (const c of book.cells.list()) if (c.switching) yield* switchRole(c.cell, c.role, c.switchIndex)
      if (book.requested > book.published) yield* publish(book.requested)
      if (book.step !== undefined) yield* startStep(book.step)
      if (book.done) yield* runDone
    })

    return { execute, resume } satisfies Shell
  })
