/**
 * Supervision as a value (OTP-style): a `SupervisionPolicy` says how long to wait before each
 * restart (a `Schedule`) and how many restarts are allowed within a period; `supervise` runs a
 * child under it.
 *
 * The child is restarted after every failure (typed error or defect) until more than
 * `maxRestarts` failures fall within `withinMs`; then `supervise` fails with an `Escalation`,
 * which is its parent's business: a nested `supervise` treats it as its own child's failure,
 * and the node's root supervisor stops the actor and reports it (it never stops the node).
 * Interruption is not a failure: it stops the child and the supervisor.
 */
import { Cause, Clock, Duration, Effect, Exit, Pull, Schedule } from "effect"
import { Escalation } from "./errors.ts"

export interface SupervisionPolicy {
  /** Restarts allowed within `withinMs`; one failure more escalates. */
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

/**
 * Runs `child` (given the number of the start, from 0) under `policy` until it succeeds or is
 * interrupted; fails with `Escalation` when the policy gives up. `onRestart` runs before each
 * restart, with the cause of the failure.
 */
export const supervise = <E, R>(
  name: string,
  child: (start: number) => Effect.Effect<void, E, R>,
  policy: SupervisionPolicy,
  onRestart: (start: number, cause: Cause.Cause<E>) => Effect.Effect<void> = () => Effect.void
): Effect.Effect<void, Escalation, R> =>
  Effect.gen(function* () {
    let failures: Array<number> = []
    let backoff = yield* Schedule.toStepWithSleep(policy.backoff)
    for (let start = 0; ; start++) {
      const exit = yield* Effect.exit(child(start))
      if (Exit.isSuccess(exit)) return
      if (Cause.hasInterruptsOnly(exit.cause)) return yield* Effect.interrupt
      const now = yield* Clock.currentTimeMillis
      failures = failures.filter((t) => now - t < policy.withinMs)
      failures.push(now)
      const escalate = new Escalation({
        child: name,
        restarts: failures.length - 1,
        withinMs: policy.withinMs,
        lastFailure: Cause.pretty(exit.cause)
      })
      if (failures.length > policy.maxRestarts) return yield* Effect.fail(escalate)
      if (failures.length === 1) backoff = yield* Schedule.toStepWithSleep(policy.backoff)
      const more = yield* backoff(undefined).pipe(
        Effect.as(true),
        Pull.catchDone(() => Effect.succeed(false))
      )
      if (!more) return yield* Effect.fail(escalate)
      yield* onRestart(start + 1, exit.cause)
    }
  })
