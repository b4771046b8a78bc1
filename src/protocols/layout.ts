/**
 * The RL parts' NATS layout of a run `R`, beside the runtime's (`src/runtime/names.ts`):
 *
 * | name | kind | contents |
 * | --- | --- | --- |
 * | `GYRE_R_TRAJECTORIES` | stream, limits retention | `gyre.R.calls.<execution>`: one delta-encoded `CallRecord` per model call (JSON, `src/tree/record.ts`); `gyre.R.outcomes.<execution>`: the `ExecutionOutcome` (JSON, `src/tree/outcome.ts`) |
 * | `GYRE_R_weights` | object store | one object per policy version, `v<version>`: a `model.safetensors` (F32, Hugging Face names) |
 * | `gyre.R.tokens.<request>` | core NATS subject | streamed chunks of one generation (`TokenChunk`), for `stream: true` |
 * | `GYRE_R_MICROBATCHES` | stream, work-queue retention | `gyre.R.mb.<step>`: the step's micro-batches by reference (`MicroBatchRef`, src/protocols/device.ts), one shared durable consumer `mb-<step>` per step |
 * | `GYRE_R_batches` | object store | `s<step>.a<attempt>.m<index>`: one micro-batch's packed arrays (src/training/microbatch-store.ts) |
 * | `GYRE_R_grads` | object store | `s<step>.a<attempt>.m<index>`: one micro-batch's gradient and token log-probs (flat F32, little-endian) |
 * | `GYRE_R_kv` | object store | `h.<id>`: a KV hand-off buffer (GYKV) of a context moving between devices |
 * | checkpoints | directory, not NATS | `<checkpointDir>/step-<k>`: HF checkpoint + optimizer.safetensors + run-state.json |
 *
 * Execution ids are subject tokens: letters, digits, `_` and `-`.
 *
 * `ensureTrajectoryStream` creates the trajectory stream when it is missing; every writer
 * (gateway, harness runner) calls it, so whichever starts first creates it. Every stream and
 * object store here is created with `GYRE_REPLICAS` replicas (`NatsShape.replicas`).
 */
import { RetentionPolicy, StorageType } from "@nats-io/jetstream"
import { Effect, Schema } from "effect"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { checkRun } from "../runtime/names.ts"
import type { ActorSystemShape } from "../runtime/system.ts"

const EXECUTION = /^[A-Za-z0-9_-]+$/

export const ExecutionId = Schema.String.check(Schema.isPattern(EXECUTION))

export const rlLayout = (run: string) => {
  checkRun(run)
  const base = `gyre.${run}`
  return {
    trajectoryStream: `GYRE_${run}_TRAJECTORIES`,
    trajectorySubjects: [`${base}.calls.>`, `${base}.outcomes.>`],
    calls: (execution: string) => `${base}.calls.${execution}`,
    allCalls: `${base}.calls.>`,
    outcomes: (execution: string) => `${base}.outcomes.${execution}`,
    allOutcomes: `${base}.outcomes.>`,
    weightsBucket: `GYRE_${run}_weights`,
    weightsObject: (version: number) => `v${version}`,
    /** The core's AdamW state after making version `version` (for a new core, `weights.ts`). */
    optimizerObject: (version: number) => `opt-v${version}`,
    tokens: (request: string) => `${base}.tokens.${request}`,
    microBatchStream: `GYRE_${run}_MICROBATCHES`,
    microBatches: (step: number) => `${base}.mb.${step}`,
    microBatchConsumer: (step: number) => `mb-${step}`,
    allMicroBatches: `${base}.mb.>`,
    batchesBucket: `GYRE_${run}_batches`,
    gradsBucket: `GYRE_${run}_grads`,
    kvBucket: `GYRE_${run}_kv`
  }
}

export type RlLayout = ReturnType<typeof rlLayout>

/**
 * Creates the run's trajectory stream if it does not exist (idempotent; a concurrent
 * creation by another writer is fine): limits retention, file storage, `GYRE_REPLICAS`
 * replicas, 2-minute duplicate window (writers publish with `Nats-Msg-Id`, so a re-sent record or outcome is stored once).
 */
export const ensureTrajectoryStream = (system: ActorSystemShape) =>
  Effect.tryPromise({
    try: async () => {
      const names = rlLayout(system.run)
      const jsm = system.nats.jsm
      const exists = () => jsm.streams.info(names.trajectoryStream).then(() => true, () => false)
      if (await exists()) return
      await jsm.streams
        .add({
          name: names.trajectoryStream,
          subjects: names.trajectorySubjects,
          retention: RetentionPolicy.Limits,
          storage: StorageType.File,
          num_replicas: system.nats.replicas,
          duplicate_window: 120_000 * 1_000_000
        })
        .catch(async (e) => {
          if (!(await exists())) throw e
        })
    },
    catch: (e) => new TransportError({ operation: `create the trajectory stream of run ${system.run}`, message: messageOf(e) })
  })
