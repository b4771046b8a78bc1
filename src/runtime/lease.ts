/**
 * Leader leases: one holder of a name at a time (the live scheduler and its standby), on the
 * claim mechanism of claim.ts.
 *
 * A lease is the registry entry `lease/<name>`: `node` is its holder and `incarnation` its
 * term, one more for every new holder. `acquire` waits until the lease is obtained: at once
 * when it is free (never held, released, or the caller's own), else when the holder's entry
 * has not changed for `ttlMs` on the caller's own monotonic clock. The holder renews every
 * `renewEveryMs` (default ttl / 3) with a compare-and-set; while the registry does not answer,
 * `acquire` keeps waiting (found by test/chaos/cluster.test.ts: the scheduler's lease lapsed
 * while the cluster elected the registry stream's leader, the standby's next `acquire` failed
 * on the unanswered registry, and with it the standby, for good). The lease is lost when a renewal
 * finds another holder's entry, or when no renewal succeeded for `ttlMs` since it was sent
 * (so it is given up before a standby may take it). Closing the scope releases it, and a
 * standby takes it at its next poll.
 *
 * ```ts
 * const lease = yield* Lease.acquire(system, "scheduler", "node-a", { ttlMs: 3000 })
 * yield* Effect.raceFirst(runScheduler(lease.term), lease.lost)
 * ```
 *
 * Holder names must be unique among contenders. Nodes' liveness monitors leave `lease/` keys
 * alone: a lease keeps its own time-to-live.
 */
import { Duration, Effect, type Scope } from "effect"
import { cappedBackoff } from "../common/retry.ts"
import * as Claim from "./claim.ts"
import type { TransportError } from "./errors.ts"
import { address, type InvalidAddress } from "./names.ts"
import type { ActorSystemShape } from "./system.ts"

export interface LeaseOptions {
  /** Silence after which a standby takes the lease, and after which a holder gives it up. */
  readonly ttlMs: number
  /** Default ttlMs / 3. */
  readonly renewEveryMs?: number
}

export interface Lease {
  readonly name: string
  readonly holder: string
  /** One more for every new holder of the lease. */
  readonly term: number
  readonly held: () => boolean
  /** Completes when the lease is lost (taken over, or not renewed in time). */
  readonly lost: Effect.Effect<void>
}

const retryEvery = cappedBackoff(Duration.millis(100), Duration.seconds(2))

/** Waits until `holder` holds the lease `name`; held until lost or until the scope closes. */
export const acquire = Effect.fn("Lease.acquire")(function* (
  system: ActorSystemShape,
  name: string,
  holder: string,
  options: LeaseOptions
): Effect.fn.Return<Lease, TransportError | InvalidAddress, Scope.Scope> {
  const at = yield* Effect.try({ try: () => address("lease", name), catch: (e) => e as InvalidAddress })
  const claim = yield* Claim.acquire(system.registry, at, { holder, silentMs: options.ttlMs, whenHeld: "wait" }).pipe(
    Effect.catchTag("AddressClaimed", (e) => Effect.die(e)), // never with whenHeld: "wait"
    // The registry unreadable for a while (a lost connection; a cluster electing the registry
    // stream's leader after a server's loss): still waiting, as for a held lease.
    Effect.tapError((e) => Effect.logWarning(`lease/${name}: the registry did not answer; ${holder} keeps waiting`, e)),
    Effect.retry({ schedule: retryEvery, while: (e) => e._tag === "TransportError" })
  )
  yield* Effect.addFinalizer(() => claim.release("stopped"))
  yield* Effect.forkScoped(claim.renew(() => ({}), options.renewEveryMs ?? options.ttlMs / 3, { stepDownAfterMs: options.ttlMs }))
  return { name, holder, term: claim.incarnation, held: claim.held, lost: claim.lost }
})
