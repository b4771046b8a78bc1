/**
 * The gateway's health and readiness, answered without a key:
 *
 *   GET /health   200 while the process serves HTTP (liveness), with what /ready checks
 *   GET /ready    200 only when NATS answers a round trip (within 1 s) and at least one
 *                 rollout worker is usable; else 503 with the reasons
 */
import { Effect } from "effect"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { Probe } from "./http.ts"
import type { WorkerDirectory } from "./worker-directory.ts"

const NATS_PING_MS = 1000

/** The probes of a gateway on `system` routing to `directory`'s workers. */
export const readiness = (system: ActorSystemShape, directory: WorkerDirectory): Record<string, Probe> => {
  const check = Effect.gen(function* () {
    const nc = system.nats.nc
    const nats = nc.isClosed()
      ? false
      : yield* Effect.tryPromise(() => nc.flush()).pipe(
          Effect.timeout(NATS_PING_MS),
          Effect.as(true),
          Effect.catch(() => Effect.succeed(false))
        )
    const workers = directory.workers().filter((w) => directory.usable(w.key)).length
    const reasons = [...(nats ? [] : [`NATS did not answer within ${NATS_PING_MS} ms`]), ...(workers > 0 ? [] : ["no usable rollout worker"])]
    return { ready: reasons.length === 0, nats, workers, reasons }
  })
  return {
    "/health": check.pipe(Effect.map((c) => ({ status: 200, body: { status: "ok", ...c } }))),
    "/ready": check.pipe(Effect.map((c) => ({ status: c.ready ? 200 : 503, body: { status: c.ready ? "ready" : "not_ready", ...c } })))
  }
}
