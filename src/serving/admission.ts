/**
 * The batcher's admission and memory policy over its two lanes of generations.
 *
 * Waiting generations are admitted between steps in arrival order while fewer than
 * `maxBatch` run (one cancelled while waiting answers at once, never runs). A generation ends
 * by `finish`: out of the running lane, its sequence kept as a cached context (or freed), its
 * answer given. When the pool is short (`makeRoom`), the least recently used cached context of
 * any execution is dropped, else the youngest running generation is cancelled: it answers with
 * what it has, and the gateway continues it elsewhere.
 */
import { Deferred, Effect } from "effect"
import { WorkerUnavailable, type FinishReason } from "../protocols/rollout.ts"
import { resultOf, type Generation } from "./generation.ts"
import type { KvPool } from "./kv-pool.ts"

export const makeLanes = (pool: KvPool, options: { readonly worker: string; readonly maxBatch: number }) => {
  const waiting: Array<Generation> = []
  const running: Array<Generation> = []
  const answer = (g: Generation, reason: FinishReason) => Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, reason, options.worker)))

  /** Ends a running generation: its sequence becomes a cached context (unless `keep` is false). */
  const finish = (g: Generation, reason: FinishReason, keep = true) =>
    Effect.gen(function* () {
      const at = running.indexOf(g)
      if (at < 0) return
      running.splice(at, 1)
      if (keep) yield* pool.keep(g)
      else yield* pool.free(g.seq)
      answer(g, reason)
    })

  return {
    waiting,
    running,
    get idle() {
      return running.length === 0 && waiting.length === 0
    },
    finish,
    admit: Effect.gen(function* () {
      while (running.length < options.maxBatch && waiting.length > 0) {
        const g = waiting.shift()!
        if (g.cancelled) {
          answer(g, "cancelled")
          continue
        }
        yield* pool.start(g)
        running.push(g)
      }
    }),
    /** Makes room in the pool: drops a cached context, else cancels the youngest generation. */
    makeRoom: Effect.gen(function* () {
      if (yield* pool.evictOldest) return
      const youngest = running.at(-1)
      if (youngest !== undefined) yield* finish(youngest, "cancelled", false)
    }),
    /** Fails every generation (the engine step failed): `WorkerUnavailable`, the gateway retries elsewhere. */
    failAll: (reason: string) =>
      Effect.gen(function* () {
        for (const g of [...running, ...waiting.splice(0)]) {
          if (running.includes(g)) {
            running.splice(running.indexOf(g), 1)
            yield* pool.free(g.seq)
          }
          Deferred.doneUnsafe(g.done, Effect.fail(new WorkerUnavailable({ worker: options.worker, reason })))
        }
      }),
    /** Answers every generation as cancelled (the batcher's scope closes). */
    cancelAll: Effect.sync(() => {
      for (const g of [...running, ...waiting]) g.cancelled = true
      for (const g of waiting.splice(0)) answer(g, "cancelled")
      for (const g of running.splice(0)) answer(g, "cancelled")
    })
  }
}

export type Lanes = ReturnType<typeof makeLanes>
