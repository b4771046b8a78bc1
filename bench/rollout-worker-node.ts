/**
 * The rollout worker type `bench:rollout`'s gateway phase runs in a separate `gyre node`
 * (`--load bench/rollout-worker-node.ts`), so the bench process holds only the gateway and
 * its HTTP client: the checkpoint comes from BENCH_CHECKPOINT.
 */
import { rolloutWorker } from "../src/actors/rollout-worker.ts"

export const worker = rolloutWorker({ checkpoint: process.env.BENCH_CHECKPOINT ?? "", maxBatch: 64 })
