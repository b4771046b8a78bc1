/**
 * The run's published policy weights: object `v<version>` of `GYRE_<run>_weights`, a
 * model.safetensors (F32, Hugging Face names). The core trainer publishes each version it
 * makes; a device that needs a version (a rollout device's `LoadWeights`, a training
 * satellite joining a step) fetches it, decodes it through the engine and swaps the flat
 * parameters into its loaded model.
 */
import { Objm } from "@nats-io/obj"
import { Effect } from "effect"
import { TransportError, messageOf } from "../runtime/errors.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { rlLayout } from "./layout.ts"
import { WeightsUnavailable } from "./rollout.ts"

/** Stores `safetensors` as version `version` (a re-publish of a version replaces it with the same bytes). */
export const publishWeights = Effect.fn("publishWeights")(function* (system: ActorSystemShape, version: number, safetensors: Uint8Array) {
  const layout = rlLayout(system.run)
  yield* Effect.tryPromise({
    try: async () => {
      const store = await new Objm(system.nats.nc).create(layout.weightsBucket)
      await store.putBlob({ name: layout.weightsObject(version) }, safetensors)
    },
    catch: (e) => new TransportError({ operation: `publish weights v${version} to ${layout.weightsBucket}`, message: messageOf(e) })
  })
})

/** The model.safetensors bytes of version `version`. */
export const fetchWeights = Effect.fn("fetchWeights")(function* (system: ActorSystemShape, version: number) {
  const layout = rlLayout(system.run)
  const unavailable = (reason: string) => new WeightsUnavailable({ version, reason })
  const name = layout.weightsObject(version)
  const blob = yield* Effect.tryPromise({
    try: async () => (await new Objm(system.nats.nc).open(layout.weightsBucket)).getBlob(name),
    catch: (e) => unavailable(messageOf(e))
  })
  if (blob === null) return yield* unavailable(`no object ${name} in ${layout.weightsBucket}`)
  return blob
})
