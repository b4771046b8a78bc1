/**
 * How a long-running command (`gyre serve`, `gyre node`) ends: on SIGTERM or SIGINT it drains
 * within `GYRE_DRAIN_MS` (default 10 s; a drain that cannot finish, e.g. with NATS gone, is cut
 * short); when NATS has been unreachable for `GYRE_NATS_GONE_MS` it fails with the reason
 * (`gyre: NATS at ... unreachable for ... ms`, exit 1) instead of half-serving. Either way, if
 * the scope's finalizers still hang 5 s later the process exits anyway: a stopping command
 * never lingers.
 */
import { Deferred, Duration, Effect } from "effect"
import type { NatsShape } from "../runtime/nats.ts"

const drainMs = () => {
  const n = Number(process.env.GYRE_DRAIN_MS ?? "10000")
  return Number.isFinite(n) && n > 0 ? n : 10_000
}

/** Exits the process `ms` after now unless it has exited by itself, saying `reason` first (the command's own report never came). */
const exitAfter = (ms: number, code: number, reason?: string) =>
  Effect.sync(
    () =>
      void setTimeout(() => {
        if (reason !== undefined) process.stderr.write(`gyre: ${reason}\n`)
        process.exit(code)
      }, ms).unref()
  )

/** Waits for a stop signal, then runs `drain` (bounded); fails when NATS is lost first. */
export const serveUntilStopped = <E>(nats: NatsShape, drain: Effect.Effect<void, E>) =>
  Effect.gen(function* () {
    const stop = yield* Deferred.make<void>()
    const onSignal = () => Effect.runFork(Deferred.succeed(stop, undefined))
    process.once("SIGTERM", onSignal)
    process.once("SIGINT", onSignal)
    yield* Effect.raceFirst(Deferred.await(stop), nats.lost).pipe(Effect.tapError((e) => exitAfter(5000, 1, e.message)))
    yield* exitAfter(drainMs() + 5000, 0)
    yield* drain.pipe(
      Effect.timeout(Duration.millis(drainMs())),
      Effect.catchCause((cause) => Effect.logWarning("drain cut short", cause))
    )
  })
