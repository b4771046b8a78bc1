/**
 * The dispatcher: the executions the policy dispatched (`Dispatch {batch}` queues the batch's
 * plan, src/protocols/run.ts), started in run order only while the rollout slots (serving
 * cells x `slots_per_cell`) are not all taken, and each started execution run on its harness
 * runner.
 *
 * The bookkeeping (`Dispatcher`) changes only by folding records in: `ExecutionStarted` takes
 * the head of the queue, `ExecutionFinished` frees its slot. Which execution starts next is the
 * driver's question (`next`); its answer becomes a journaled `ExecutionStarted` before the
 * runner is asked, so a standby knows every start. `runOnRunner` asks the runner and reads the
 * execution's tree back; asking again with the same execution id joins the running execution
 * or returns its outcome, which is what makes a re-dispatch (takeover, a lost cell) safe.
 *
 * The reply to an ask is core NATS, at most once, and an execution may run for hours: a reply
 * lost in transport (a reconnect) must not cost the run. So one ask waits at most `reaskMs`;
 * then the outcome the runner publishes before it answers is looked up on the trajectory
 * stream, and failing that the runner is asked again with the same message id, which it
 * answers with its recorded answer or joins to the one being worked out (a 16-execution run
 * once sat idle behind an answered `RunExecution` whose reply never came).
 */
import { Effect, Schema } from "effect"
import type { ActorUnavailable, AskTimeout, TransportError } from "../runtime/errors.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { HarnessRunnerRef } from "../protocols/topology.ts"
import type { PlannedExecution, RunConfig } from "../protocols/run.ts"
import { rlLayout } from "../protocols/layout.ts"
import { readExecution } from "../protocols/trajectories.ts"
import { readLast } from "../runtime/stream-reader.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { persistently } from "../common/retry.ts"

export interface Running {
  readonly plan: PlannedExecution
  /** Seconds since the run started (the record's `at`). */
  readonly startedAt: number
}

export class Dispatcher {
  /** Dispatched executions not yet started, by number, in run order. */
  private readonly waiting = new Map<number, PlannedExecution>()
  private readonly running = new Map<number, Running>()
  dispatched = 0
  finished = 0

  get started(): number {
    return this.dispatched - this.waiting.size
  }

  queue(plans: ReadonlyArray<PlannedExecution>): void {
    for (const p of plans) this.waiting.set(p.n, p)
    this.dispatched += plans.length
  }

  /** The next execution to start, when fewer than `slots` run. */
  next(slots: number): PlannedExecution | undefined {
    return this.running.size < slots ? this.waiting.values().next().value : undefined
  }

  /** Execution `n` started; false when it was not waiting. */
  start(n: number, at: number): boolean {
    const plan = this.waiting.get(n)
    if (plan === undefined) return false
    this.waiting.delete(n)
    this.running.set(n, { plan, startedAt: at })
    return true
  }

  /** Running execution `n` finished; undefined when it was not running. */
  finish(n: number): Running | undefined {
    const r = this.running.get(n)
    if (r === undefined) return undefined
    this.running.delete(n)
    this.finished++
    return r
  }

  runningOf(n: number): Running | undefined {
    return this.running.get(n)
  }

  runningNow(): ReadonlyArray<Running> {
    return [...this.running.values()]
  }
}

export interface RunnerOptions {
  readonly system: ActorSystemShape
  readonly config: RunConfig
  /** Harness runners; execution `n` goes to runner `n mod count`. */
  readonly runners: ReadonlyArray<HarnessRunnerRef>
  /** How long one `RunExecution` ask waits before the outcome is looked up and the runner asked again. */
  readonly reaskMs: number
}

export interface Ran {
  readonly outcome: ExecutionOutcome
  /** Unique tokens of the execution's tree. */
  readonly tokens: number
}

/** The outcome of an execution that could not run (its task is unknown): dropped from training. */
const notRun = (config: RunConfig, plan: PlannedExecution, reason: string): ExecutionOutcome => ({
  run: config.run,
  task: `${config.suite}/${plan.task}`,
  execution: plan.execution,
  ended: "finished",
  evaluation: "failed",
  score: null,
  attempts: 0,
  detail: `not run: ${reason}`
})

/** Runs planned executions on the harness runners: the outcome and the unique tokens of its tree. */
export const runOnRunner = (options: RunnerOptions) => {
  const runners = options.runners
  const { system, config } = options
  return Effect.fn("Scheduler.runExecution")(function* (plan: PlannedExecution) {
    const runner = runners[plan.n % runners.length]!
    const request = {
      task: { suite: config.suite, task: plan.task },
      execution: plan.execution,
      timeoutMs: null,
      keepWorkspace: "never" as const,
      env: config.env,
      seed: config.seed
    }
    const published = (e: AskTimeout | ActorUnavailable) =>
      readOutcome(system, plan.execution).pipe(Effect.flatMap((o) => (o === undefined ? Effect.fail(e) : Effect.succeed(o))))
    const outcome = yield* system.ask(runner, "RunExecution", request, { timeoutMs: options.reaskMs, msgId: `run-${plan.execution}` }).pipe(
      Effect.catchTag("UnknownTask", (e) => Effect.succeed(notRun(config, plan, e.reason))),
      Effect.catchTags({ AskTimeout: published, ActorUnavailable: published }),
      persistently(`RunExecution ${plan.execution}`, (e) => e._tag === "AskTimeout")
    )
    const { trajectory } = yield* readExecution(system, plan.execution).pipe(persistently(`reading the calls of ${plan.execution}`))
    return { outcome, tokens: trajectory.decoder.tree.uniqueTokens } satisfies Ran
  })
}

const decodeOutcome = Schema.decodeUnknownOption(Schema.fromJsonString(ExecutionOutcome))

/** The outcome the runner published for `execution` (`gyre.<run>.outcomes.<execution>`), if any. */
export const readOutcome = (system: ActorSystemShape, execution: string): Effect.Effect<ExecutionOutcome | undefined, TransportError> => {
  const names = rlLayout(system.run)
  return readLast(system.nats, names.trajectoryStream, names.outcomes(execution)).pipe(
    Effect.map((m) => {
      const decoded = m === undefined ? undefined : decodeOutcome(m.string())
      return decoded?._tag === "Some" ? decoded.value : undefined
    })
  )
}
