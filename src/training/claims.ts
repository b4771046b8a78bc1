/**
 * A training device's claiming of micro-batches: one claim loop at a time (`claimLoop` over the
 * step's work queue, `microbatch-queue.ts`), each claim handled by `deliver` while it is held.
 *
 * - `start(at)` claims micro-batches of an attempt at a step; a loop of another attempt is
 *   stopped first (its micro-batch in hand finished), the same attempt's running loop is kept.
 * - `leave` stops claiming once the micro-batch in hand (if any) is done, without waiting out
 *   the loop's pending pull (up to 1 s): what that pull still brings is handed back.
 * - `step()` is the step being claimed, -1 when none.
 * A loop that fails (NATS unreachable) is retried every 500 ms until it is stopped; it ends on
 * its own when the core deletes the step's consumer (the step is done).
 */
import { Cause, Duration, Effect, Fiber, Schedule, Semaphore, type Scope } from "effect"
import { Device } from "../protocols/topology.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { StepAttempt } from "./gradients.ts"
import { claimLoop, type Claim } from "./microbatch-queue.ts"

export interface ClaimsOptions {
  readonly system: ActorSystemShape
  /** This device's key, for the log. */
  readonly me: string
  readonly ackWaitMs: number
  /** The incarnation's scope: the claim loop lives there. */
  readonly scope: Scope.Scope
  /** Computes a claimed micro-batch and hands its gradient on (then the claim is acknowledged). */
  readonly deliver: (claim: Claim) => Effect.Effect<void, unknown>
}

interface Claiming {
  readonly step: number
  readonly attempt: number
  stop: boolean
  fiber: Fiber.Fiber<void, unknown> | undefined
  /** Held while a claim is handled: a claim that finds `stop` set under it is handed back. */
  readonly handling: Semaphore.Semaphore
}

export const makeClaims = Effect.fn("makeClaims")(function* (options: ClaimsOptions) {
  const { system, me } = options
  const claimLock = yield* Semaphore.make(1)
  let claiming: Claiming | undefined

  const runClaims = (c: Claiming) =>
    claimLoop(system, { step: c.step, ackWaitMs: options.ackWaitMs, device: Device.refOfKey(me).address, stop: () => c.stop }, (claim) =>
      c.handling.withPermit(Effect.suspend(() => (c.stop ? claim.handBack : options.deliver(claim))))
    ).pipe(
      Effect.tapError((e) => Effect.logWarning(`${me}: claiming step ${c.step} failed, retrying: ${String(e)}`)),
      Effect.retry({ while: () => !c.stop, schedule: Schedule.spaced(Duration.millis(500)) }),
      // Stopped while waiting to retry: the loop ends as asked (a claim in hand was handed back).
      Effect.catch((e) => (c.stop ? Effect.void : Effect.fail(e))),
      Effect.tapCause((cause) => (Cause.hasInterruptsOnly(cause) ? Effect.void : Effect.logError(`${me}: claim loop of step ${c.step} stopped`, cause))),
      Effect.ensuring(
        Effect.sync(() => {
          c.stop = true
        })
      )
    )

  /** Stops the loop and waits for it to end. */
  const stop = Effect.suspend(() => {
    const c = claiming
    if (c === undefined) return Effect.void
    c.stop = true
    return c.fiber === undefined ? Effect.void : Fiber.await(c.fiber).pipe(Effect.asVoid)
  })

  const leave = claimLock.withPermit(
    Effect.suspend(() => {
      const c = claiming
      if (c === undefined) return Effect.void
      c.stop = true
      return c.handling.withPermit(Effect.void)
    })
  )

  const start = (at: StepAttempt) =>
    claimLock.withPermit(
      Effect.gen(function* () {
        if (claiming !== undefined && claiming.step === at.step && claiming.attempt === at.attempt && !claiming.stop) return
        yield* stop
        const c: Claiming = { step: at.step, attempt: at.attempt, stop: false, fiber: undefined, handling: yield* Semaphore.make(1) }
        claiming = c
        c.fiber = yield* Effect.forkIn(runClaims(c), options.scope)
      })
    )

  return { start, leave, step: () => (claiming === undefined || claiming.stop ? -1 : claiming.step) }
})
