/**
 * Retrying until done, for work that has no one to ask for it again: the scheduler's action
 * fibers and the training role's own fibers (finishing a step, a claimed gradient). What they
 * retry is idempotent (an execution id joins its running execution, a device request is
 * idempotent per step or version, a tell carries its message id, an object put replaces the
 * same bytes), so a failure is retried until it succeeds, with exponential backoff capped at a
 * few seconds, through an outage of NATS of any length, or until the fiber is interrupted (its
 * cell lost, the scheduler or the device's incarnation stopped).
 */
import { Duration, Effect, Schedule } from "effect"

/**
 * The one capped exponential backoff: `first`, doubling, never more than `cap` between tries
 * (every retry of the runtime and the RL parts that backs off uses it).
 */
export const cappedBackoff = (first: Duration.Input, cap: Duration.Input) => Schedule.min([Schedule.exponential(first, 2), Schedule.spaced(cap)])

/** The delay before try `attempt` (1 = the first retry) of `cappedBackoff(firstMs, capMs)`, for waits counted by hand. */
export const cappedDelayMs = (firstMs: number, capMs: number, attempt: number): number => Math.min(capMs, firstMs * 2 ** Math.max(0, attempt - 1))

const backoff = cappedBackoff(Duration.millis(100), Duration.seconds(3))

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

/**
 * A few quick retries for a handler's transport hiccups: what still fails after them is a
 * defect of the incarnation (it crashes, and the request comes back to the next one).
 */
export const transient = { times: 8, schedule: Schedule.exponential(Duration.millis(100)) }
