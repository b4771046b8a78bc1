/**
 * The live scheduler, `scheduler/main`: runs a `src/policy` policy unchanged over the real
 * actors of a run. Exactly one is live: `standBy` waits for the run's lease and hosts the
 * actor on its node only while it holds it; any number of candidates may stand by.
 *
 * The story of one incarnation:
 * 1. Take over: the run configuration is read from the journal (written by the first leader),
 *    the policy records are replayed through the policy with every digest checked, and the
 *    book (cells, dispatcher, steps, versions) is rebuilt from them (`src/scheduling/takeover.ts`).
 * 2. Resume: what the records asked for and no completion answered is asked again, idempotently
 *    (`Shell.resume`), and dispatched executions start while rollout slots are free.
 * 3. Serve: every input (a durable tell, in order) is checked against the book, becomes one
 *    `PolicyEvent`, is journaled with the policy's actions (`PolicyRecord` on
 *    `gyre.<run>.sys.policy`) and then carried out by fibers whose completions come back as
 *    tells (`src/scheduling/actions.ts`). The registry watch turns a device that is declared
 *    dead, stopped or failed into `DeviceLost`.
 * 4. After the last `StepDone`, `gyre.<run>.sys.run-done` holds the run's summary.
 *
 * No scheduling decision is made here: the policy decides which batch, which cell, which step;
 * the shell only chooses what the policy leaves open (hand-off destinations in the order the
 * design fixes, runner `n mod runners` for execution `n`).
 */
import { Cause, Duration, Effect, FiberSet, Schedule, Schema } from "effect"
import { cappedDelayMs } from "../common/retry.ts"
import type * as Actor from "../runtime/actor.ts"
import { formatAddress } from "../runtime/names.ts"
import type { NodeHandle } from "../runtime/node.ts"
import * as Lease from "../runtime/lease.ts"
import { watchRegistry } from "../runtime/registry.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { SCHEDULER_KIND } from "../protocols/scheduler.ts"
import { Scheduler, type HarnessRunnerRef } from "../protocols/topology.ts"
import type { RunConfig } from "../protocols/run.ts"
import { Book } from "../scheduling/book.ts"
import { makeDriver, policyOf, runClock } from "../scheduling/driver.ts"
import { Shell } from "../scheduling/actions.ts"
import { inputHandlers } from "../scheduling/inputs.ts"
import { runOnRunner } from "../scheduling/dispatcher.ts"
import { journalRunConfig, readRecords, recordWriter } from "../scheduling/records.ts"
import { replayRecords } from "../scheduling/takeover.ts"

export const SCHEDULER_ID = "main"
export const schedulerAddress = Scheduler.address(SCHEDULER_ID)
export const schedulerRef = Scheduler.ref(SCHEDULER_ID)

export interface SchedulerOptions {
  /** The run as asked for; a run configuration already in the journal wins (a standby, a resume). */
  readonly config: RunConfig
  /** The suite's `train` split, in suite order (the plan draws tasks from it). */
  readonly trainTasks: ReadonlyArray<string>
  /** Harness runners; execution `n` runs on runner `n mod count`. */
  readonly runners: ReadonlyArray<HarnessRunnerRef>
  /** Lease time to live: a dead leader's standby takes over after it (default 5 s). */
  readonly leaseTtlMs?: number
  /** How long one `RunExecution` ask waits before the outcome is looked up and the runner asked again (default 60 s). */
  readonly reaskMs?: number
  /** Ask timeout of device requests (default 120 s). */
  readonly deviceTimeoutMs?: number
}

/** Ends of the scheduler while one candidate led it, within `ENDINGS_WINDOW_MS`, at which the candidate gives up. */
const ENDINGS_GIVEN_UP = 6
const ENDINGS_WINDOW_MS = 120_000

/** The scheduler was started without holding the run's lease. */
export class NotLeader extends Schema.TaggedError<NotLeader>()("NotLeader", { actor: Schema.String }) {}

/** The scheduler actor ended again and again while this candidate led (`standBy`): it stopped standing by. */
export class SchedulerStopped extends Schema.TaggedError<SchedulerStopped>()("SchedulerStopped", { node: Schema.String, term: Schema.Number }) {}

const lostStatuses = new Set(["dead", "stopped", "failed"])

/** Scheduler options that cannot run a plan. */
export class InvalidSchedulerOptions extends Schema.TaggedError<InvalidSchedulerOptions>()("InvalidSchedulerOptions", { reason: Schema.String }) {}

/** One candidate's options and the lease it holds while it hosts the scheduler (read by the incarnation it starts). */
interface Candidate {
  readonly options: SchedulerOptions
  leadership: Lease.Lease | undefined
}

/** One incarnation: take over from the journal, resume, then serve (the module comment). */
const takeOver = (c: Candidate, ctx: Pick<Actor.ActorContext<unknown>, "address" | "system" | "node">) =>
  Effect.gen(function* () {
    const { options } = c
    const lead = c.leadership
    if (lead === undefined) return yield* Effect.die(new NotLeader({ actor: formatAddress(ctx.address) }))
    const system = ctx.system
    // 1. Take over from the journal.
    const config = yield* journalRunConfig(system, options.config)
    const policy = yield* policyOf(config)
    const book = new Book(config, options.trainTasks)
    const replayed = yield* replayRecords(policy, config, book, yield* readRecords(system), lead.term)
    const now = runClock(config.startedAt, replayed.at)
    const shell = yield* Shell.make({
      system,
      book,
      self: schedulerRef,
      sender: formatAddress(ctx.address),
      runExecution: runOnRunner({ system, config, runners: options.runners, reaskMs: options.reaskMs ?? 60_000 }),
      deviceTimeoutMs: options.deviceTimeoutMs ?? 120_000,
      now,
      facts: () => ({ run: config.run, policy: config.policy, wallS: now() })
    })
    const driver = makeDriver({ policy, book, term: lead.term, now, from: replayed, write: recordWriter(system, replayed.lastSeq), execute: shell.execute })
    // 2. Resume what has no completion, start what the slots allow.
    yield* shell.resume
    yield* driver.settle.pipe(Effect.orDie)
    // 3. Serve: devices the registry gives up on become inputs too.
    yield* watchDevices(system, book, formatAddress(ctx.address))
    return inputHandlers({ book, driver, now, leader: `${ctx.node}#${lead.term}` })
  })

/**
 * One term on `node`: waits for the lease, hosts the scheduler while holding it, stops it when
 * the lease is lost. Its term when the scheduler ended while this candidate led, else undefined.
 */
const leadOnce = (c: Candidate, node: NodeHandle, system: ActorSystemShape) =>
  Effect.scoped(
    Effect.gen(function* () {
      const hosted = () => node.hosted().some((h) => h.kind === SCHEDULER_KIND && h.id === SCHEDULER_ID)
      const lead = yield* Lease.acquire(system, SCHEDULER_KIND, node.name, { ttlMs: c.options.leaseTtlMs ?? 5000 })
      c.leadership = lead
      const spawned = node.spawn(SCHEDULER_KIND, SCHEDULER_ID).pipe(
        Effect.tapError((e) => Effect.logWarning(`scheduler not hosted yet on ${node.name}: ${e._tag}`)),
        Effect.retry({ schedule: Schedule.spaced(Duration.millis(250)), while: (e) => e._tag === "AddressClaimed" || e._tag === "TransportError" }),
        Effect.orDie
      )
      const gaveUp = Effect.sleep(Duration.millis(250)).pipe(Effect.repeat({ until: () => !hosted() }))
      const ended = yield* Effect.raceFirst(lead.lost.pipe(Effect.as(false)), spawned.pipe(Effect.andThen(gaveUp), Effect.as(true)))
      c.leadership = undefined
      yield* node.stop(SCHEDULER_KIND, SCHEDULER_ID)
      return ended ? lead.term : undefined
    }).pipe(Effect.ensuring(Effect.sync(() => (c.leadership = undefined))))
  )

/**
 * Stands by on `node` for the lifetime of the scope: waits for the run's scheduler lease
 * (`src/runtime/lease.ts`), hosts the scheduler while holding it (claiming its address may
 * wait for a killed leader's activation to fall silent), stops it when the lease is lost,
 * and waits again. A scheduler that ends while this candidate leads (its incarnation crashed:
 * a journal write failed in an outage of NATS; the type is `temporary`, so nothing restarts
 * it) gives the lease back, and after a backoff the candidate stands by again: the next term,
 * here or on another candidate, takes over from the journal. The `ENDINGS_GIVEN_UP`-th such
 * end within `ENDINGS_WINDOW_MS` fails with `SchedulerStopped`; any end but an interruption is
 * logged as an error (callers fork it).
 */
const standBy = (c: Candidate) => (node: NodeHandle, system: ActorSystemShape) =>
  Effect.gen(function* () {
    let endings: Array<number> = []
    while (true) {
      const term = yield* leadOnce(c, node, system)
      if (term === undefined) continue
      const now = Date.now()
      endings = [...endings.filter((t) => now - t < ENDINGS_WINDOW_MS), now]
      if (endings.length >= ENDINGS_GIVEN_UP) return yield* new SchedulerStopped({ node: node.name, term })
      const backoffMs = cappedDelayMs(1000, 10_000, endings.length)
      yield* Effect.logWarning(`scheduler/main ended while ${node.name} led it (term ${term}); standing by again in ${backoffMs} ms`)
      yield* Effect.sleep(Duration.millis(backoffMs))
    }
  }).pipe(Effect.tapCause((cause) => (Cause.hasInterruptsOnly(cause) ? Effect.void : Effect.logError(`scheduler candidate on ${node.name} stopped`, cause))))

/**
 * The scheduler actor type and the stand-by loop that hosts it while it leads. Throws
 * `InvalidSchedulerOptions` when there is no train task or no runner to plan with, and
 * `InvalidAddress` for a runner that is not `kind/id`.
 */
export const makeScheduler = (options: SchedulerOptions) => {
  if (options.trainTasks.length === 0) throw new InvalidSchedulerOptions({ reason: "the suite has no train task" })
  if (options.runners.length === 0) throw new InvalidSchedulerOptions({ reason: "no harness runner" })
  const c: Candidate = { options, leadership: undefined }
  const type = Scheduler.implement({
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    // The lease, not re-placement, decides where the scheduler runs.
    restart: "temporary",
    behaviour: (ctx) => takeOver(c, ctx)
  })
  return { type, standBy: standBy(c) }
}

/** Tells the scheduler `DeviceLost` for every cell's device the registry shows dead, stopped or failed. */
const watchDevices = (system: ActorSystemShape, book: Book, sender: string) =>
  Effect.gen(function* () {
    const fork = yield* FiberSet.makeRuntime<never, unknown, never>()
    yield* watchRegistry(system, ({ key, entry }) => {
      if (entry === undefined || !lostStatuses.has(entry.status) || book.cells.cellOf(key) === undefined) return
      fork(system.tell(schedulerRef, "DeviceLost", { device: key }, { msgId: `lost-${key}-${entry.incarnation}`, sender }).pipe(Effect.ignore))
    })
  })
