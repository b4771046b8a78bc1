/**
 * The run's published policy weights: object `v<version>` of `GYRE_<run>_weights`, a
 * model.safetensors (F32, Hugging Face names). The core trainer publishes each version it
 * makes; a device that needs a version (a rollout device's `LoadWeights`, a training
 * satellite joining a step) fetches it, decodes it through the engine and swaps the flat
 * parameters into its loaded model.
 *
 * Beside each version the core stores its AdamW state after making it (`opt-v<version>`, the
 * engine's optimizer bytes), before the weights themselves: whenever `v<k>` exists its optimizer
 * state does too, so any device can become the core of step k (the previous core lost, or the
 * whole run restarted by `gyre train --resume`) and continue exactly where the optimizer was.
 * Only the two newest optimizer states are kept. Version 0 has none: its state is a fresh one.
 */
import { Objm } from "@nats-io/obj"
import { Effect } from "effect"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { getObject, putObject } from "../runtime/nats.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { rlLayout } from "./layout.ts"
import { WeightsUnavailable } from "./rollout.ts"

const openBucket = (system: ActorSystemShape) => new Objm(system.nats.nc).create(rlLayout(system.run).weightsBucket, { replicas: system.nats.replicas })

/**
 * Stores `safetensors` as version `version`, after `optimizer` (the core's AdamW state at that
 * version) when given; a re-publish of a version replaces it with the same bytes.
 */
export const publishWeights = Effect.fn("publishWeights")(function* (
  system: ActorSystemShape,
  version: number,
  safetensors: Uint8Array,
  optimizer?: Uint8Array
) {
  const layout = rlLayout(system.run)
  yield* Effect.tryPromise({
    try: async () => {
      const store = await openBucket(system)
      if (optimizer !== undefined) {
        await putObject(store, layout.optimizerObject(version), optimizer)
        await store.delete(layout.optimizerObject(version - 2)).catch(() => undefined)
      }
      await putObject(store, layout.weightsObject(version), safetensors)
    },
    catch: (e) => new TransportError({ operation: `publish weights v${version} to ${layout.weightsBucket}`, message: messageOf(e) })
  })
})

const fetchObject = (system: ActorSystemShape, version: number, name: string) => {
  const layout = rlLayout(system.run)
  const unavailable = (reason: string) => new WeightsUnavailable({ version, reason })
  return Effect.tryPromise({
    try: async () => getObject(system.nats.jsm, await new Objm(system.nats.nc).open(layout.weightsBucket), layout.weightsBucket, name),
    catch: (e) => unavailable(messageOf(e))
  }).pipe(Effect.flatMap((blob) => (blob === null ? Effect.fail(unavailable(`no object ${name} in ${layout.weightsBucket}`)) : Effect.succeed(blob))))
}

/** The model.safetensors bytes of version `version`. */
export const fetchWeights = Effect.fn("fetchWeights")(function* (system: ActorSystemShape, version: number) {
  return yield* fetchObject(system, version, rlLayout(system.run).weightsObject(version))
})

/** The core's optimizer state at version `version` (`version` > 0). */
export const fetchOptimizer = Effect.fn("fetchOptimizer")(function* (system: ActorSystemShape, version: number) {
  return yield* fetchObject(system, version, rlLayout(system.run).optimizerObject(version))
})
