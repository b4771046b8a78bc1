/**
 * How the scheduler's action fibers retry: every request they make is idempotent (an
 * execution id joins its running execution, a device request is idempotent per step or
 * version, a tell carries its message id), so a failure is retried until it succeeds, with
 * exponential backoff capped at a few seconds, or until the fiber is interrupted (its cell
 * lost, the scheduler stopped).
 */
import { Duration, Effect, Schedule } from "effect"

const backoff = Schedule.min([Schedule.exponential(Duration.millis(100), 2), Schedule.spaced(Duration.seconds(3))])

/**
 * `effect`, retried until it succeeds; each failure is logged with `what`, as a warning unless
 * `expected` says the failure is the normal answer of the moment (then at debug level).
 */
export const persistently =
  <E>(what: string, expected: (e: E) => boolean = () => false) =>
  <A, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, never, R> =>
    effect.pipe(
      Effect.tapError((e) => (expected(e) ? Effect.logDebug : Effect.logWarning)(`${what} failed; retrying: ${describe(e)}`)),
      Effect.retry(backoff)
    ) as Effect.Effect<A, never, R>

const describe = (e: unknown): string =>
  typeof e === "object" && e !== null && "_tag" in e ? `${String((e as { _tag: unknown })._tag)} ${JSON.stringify(e)}` : String(e)
