/**
 * Supervision as a value (OTP-style).
 *
 * - A `SupervisionPolicy` is the intensity (`maxRestarts` within `withinMs`; one restart more
 *   escalates) and the delay before each restart (a `Schedule`, started over after a quiet
 *   period).
 * - A child has a `RestartType`: `permanent` (started again whenever it ends, unless it was
 *   asked to stop), `transient` (started again only after a failure), `temporary` (never).
 *   The same type says whether an actor of a dead node is placed again (placement.ts): a
 *   node's death is a failure, so `permanent` and `transient` actors are, `temporary` never.
 * - A child's run ends in a `ChildEnd` or fails: `exited` = it ended on its own, normally;
 *   `stopped` = it was asked to stop; `fenced` = it lost its address to another incarnation.
 *   Only `exited` can lead to a restart (of a permanent child); failure leads to one unless
 *   the child is temporary. Interruption is not a failure: it stops the child and the
 *   supervisor.
 * - A strategy says what a restart takes along: `one-for-one` (`supervise`, one child each)
 *   restarts only the child that ended; `one-for-all` (`superviseGroup`: a group started
 *   together, such as a device's rollout and training halves) stops the other children and
 *   starts them all again together. A child that ends for good leaves its group without
 *   disturbing the others.
 *
 * When the intensity is exceeded `supervise` fails with an `Escalation`, which is its parent's
 * business: a nested supervisor treats it as its own child's failure, and the node's root
 * stops the actors and reports them (it never stops the node).
 */
import { Cause, Clock, Duration, Effect, Exit, Pull, Queue, Schedule } from "effect"
import { Escalation } from "./errors.ts"

export interface SupervisionPolicy {
  /** Restarts allowed within `withinMs`; one more escalates. */
  readonly maxRestarts: number
  readonly withinMs: number
  /** Delay before each restart; the schedule starts over after a quiet period. */
  readonly backoff: Schedule.Schedule<unknown>
}

export const defaultSupervision: SupervisionPolicy = {
  maxRestarts: 5,
  withinMs: 60_000,
  backoff: Schedule.exponential(Duration.millis(100), 2).pipe(Schedule.jittered)
}

export type RestartType = "permanent" | "transient" | "temporary"
export type Strategy = "one-for-one" | "one-for-all"
export type ChildEnd = "exited" | "stopped" | "fenced"

export interface ChildSpec<E, R> {
  readonly name: string
  readonly restart: RestartType
  /** One run of the child, given the number of the start (0 first). */
  readonly run: (start: number) => Effect.Effect<ChildEnd, E, R>
}

/** Whether a child of `restart` type that ended with `exit` is started again. */
export const restartsAfter = (restart: RestartType, exit: Exit.Exit<ChildEnd, unknown>): boolean =>
  Exit.isSuccess(exit)
    ? exit.value === "exited" && restart === "permanent"
    : !Cause.hasInterruptsOnly(exit.cause) && restart !== "temporary"

/** Called before each restart with the child that ended and how. */
export type OnRestart = (child: string, start: number, exit: Exit.Exit<ChildEnd, unknown>) => Effect.Effect<void>

/**
 * The restart intensity of one supervisor: `admit` records a restart and waits the backoff
 * delay, or fails with `Escalation` when the policy gives up.
 */
const makeIntensity = (name: string, policy: SupervisionPolicy) =>
  Effect.gen(function* () {
    let restarts: Array<number> = []
    let backoff = yield* Schedule.toStepWithSleep(policy.backoff)
    return (exit: Exit.Exit<ChildEnd, unknown>) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        restarts = restarts.filter((t) => now - t < policy.withinMs)
        restarts.push(now)
        const escalate = new Escalation({
          child: name,
          restarts: restarts.length - 1,
          withinMs: policy.withinMs,
          lastFailure: Exit.isFailure(exit) ? Cause.pretty(exit.cause) : `ended: ${exit.value}`
        })
        if (restarts.length > policy.maxRestarts) return yield* Effect.fail(escalate)
        if (restarts.length === 1) backoff = yield* Schedule.toStepWithSleep(policy.backoff)
        const more = yield* backoff(undefined).pipe(Effect.as(true), Pull.catchDone(() => Effect.succeed(false)))
        if (!more) return yield* Effect.fail(escalate)
      })
  })

/**
 * Runs one child under `policy` until it ends for good; returns how it ended, or fails with
 * the failure of a temporary child, or with `Escalation`.
 */
export const supervise = <E, R>(
  child: ChildSpec<E, R>,
  policy: SupervisionPolicy,
  onRestart: OnRestart = () => Effect.void
): Effect.Effect<ChildEnd, E | Escalation, R> =>
  Effect.gen(function* () {
    const admit = yield* makeIntensity(child.name, policy)
    for (let start = 0; ; start++) {
      const exit = yield* Effect.exit(child.run(start))
      if (Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)) return yield* Effect.interrupt
      if (!restartsAfter(child.restart, exit)) return yield* exit
      yield* admit(exit)
      yield* onRestart(child.name, start + 1, exit)
    }
  })

/**
 * Runs `children` as one-for-all group until every one has ended for good: a child that is to
 * be restarted first interrupts its siblings (their scopes close: what they held goes back),
 * then all that remain start again together. `onEnded` hears of each child that leaves the
 * group for good, with how it ended.
 */
export const superviseGroup = <E, R>(
  name: string,
  children: ReadonlyArray<ChildSpec<E, R>>,
  policy: SupervisionPolicy,
  onRestart: OnRestart = () => Effect.void,
  onEnded: (child: string, exit: Exit.Exit<ChildEnd, E>) => Effect.Effect<void> = () => Effect.void
): Effect.Effect<void, Escalation, R> =>
  Effect.gen(function* () {
    const admit = yield* makeIntensity(name, policy)
    let live = [...children]
    for (let start = 0; live.length > 0; start++) {
      const round = yield* runTogether(live, start, onEnded)
      live = live.filter((_, i) => !round.ended.has(i))
      if (round.restart === undefined) return
      yield* admit(round.restart.exit)
      yield* onRestart(round.restart.child, start + 1, round.restart.exit)
    }
  })

/** Starts every child; returns when one is to be restarted (the others are then interrupted) or all ended for good. */
const runTogether = <E, R>(
  children: ReadonlyArray<ChildSpec<E, R>>,
  start: number,
  onEnded: (child: string, exit: Exit.Exit<ChildEnd, E>) => Effect.Effect<void>
) =>
  Effect.scoped(
    Effect.gen(function* () {
      const ends = yield* Queue.unbounded<readonly [number, Exit.Exit<ChildEnd, E>]>()
      for (const [i, c] of children.entries()) {
        yield* Effect.forkScoped(Effect.exit(c.run(start)).pipe(Effect.flatMap((exit) => Queue.offer(ends, [i, exit] as const))))
      }
      const ended = new Set<number>()
      while (ended.size < children.length) {
        const [i, exit] = yield* Queue.take(ends)
        if (restartsAfter(children[i]!.restart, exit)) return { ended, restart: { child: children[i]!.name, exit } }
        ended.add(i)
        yield* onEnded(children[i]!.name, exit)
      }
      return { ended, restart: undefined }
    })
  )
