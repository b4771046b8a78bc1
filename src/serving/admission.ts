/**
 * The batcher's admission and memory policy over its two lanes of generations.
 *
 * Waiting generations are admitted between steps in arrival order while fewer than
 * `maxBatch` run (one cancelled while waiting answers at once, never runs). A generation ends
 * by `finish`: out of the running lane, its sequence kept as a cached context, its answer
 * given. When the pool is short (`makeRoom`), the least recently used cached context of any
 * execution is dropped; when none is left, the youngest running generation is preempted: its
 * sequence is kept as a context (evicted in turn if the pool stays short) and it waits at the
 * head of the queue, admitted again once a generation has ended (or alone), to resume from what
 * is still cached. A request is never refused for memory: the worker's context limit is the
 * whole pool, so a generation alone always fits once everything else is evicted. The one
 * exception is a pool held by pinned contexts (a KV hand-off under way): the last running
 * generation then fails with `WorkerUnavailable` and the gateway continues it elsewhere.
 */
import { Deferred, Effect } from "effect"
import { WorkerUnavailable, type FinishReason } from "../protocols/rollout.ts"
import { resultOf, type Generation } from "./generation.ts"
import type { KvPool } from "./kv-pool.ts"

export const makeLanes = (pool: KvPool, options: { readonly worker: string; readonly maxBatch: number }) => {
  const waiting: Array<Generation> = []
  const running: Array<Generation> = []
  const answer = (g: Generation, reason: FinishReason) => Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, reason, options.worker)))
  const fail = (g: Generation, reason: string) => Deferred.doneUnsafe(g.done, Effect.fail(new WorkerUnavailable({ worker: options.worker, reason })))
  /** A generation was preempted and none has ended since: admit only into an empty batch. */
  let pressure = false
  let preemptions = 0

  /** Takes a generation out of the running lane; false when it was not there. */
  const leave = (g: Generation): boolean => {
    const at = running.indexOf(g)
    if (at >= 0) running.splice(at, 1)
    return at >= 0
  }

  /** Ends a running generation: its sequence becomes a cached context. */
  const finish = (g: Generation, reason: FinishReason) =>
    Effect.gen(function* () {
      if (!leave(g)) return
      pressure = false
      yield* pool.keep(g)
      answer(g, reason)
    })

  /** Back to the head of the queue, its sequence kept as a context to resume from. */
  const preempt = (g: Generation) =>
    Effect.gen(function* () {
      leave(g)
      g.preemptedAt = yield* pool.keep(g)
      g.seq = -1
      waiting.unshift(g)
      pressure = true
      preemptions++
    })

  return {
    waiting,
    running,
    get idle() {
      return running.length === 0 && waiting.length === 0
    },
    get preemptions() {
      return preemptions
    },
    finish,
    admit: Effect.gen(function* () {
      while (running.length < options.maxBatch && waiting.length > 0 && !(pressure && running.length > 0)) {
        const g = waiting.shift()!
        if (g.cancelled) {
          answer(g, "cancelled")
          continue
        }
        yield* pool.start(g)
        running.push(g)
      }
    }),
    /** Makes room in the pool: drops a cached context, else preempts the youngest generation. */
    makeRoom: Effect.gen(function* () {
      if (yield* pool.evictOldest) return
      const youngest = running.at(-1)
      if (youngest === undefined) return
      if (running.length > 1) return yield* preempt(youngest)
      leave(youngest)
      yield* pool.free(youngest.seq)
      fail(youngest, "the KV pool is held by contexts pinned for a hand-off")
    }),
    /** Fails every generation (the engine step failed): `WorkerUnavailable`, the gateway retries elsewhere. */
    failAll: (reason: string) =>
      Effect.gen(function* () {
        for (const g of [...running, ...waiting.splice(0)]) {
          if (leave(g)) yield* pool.free(g.seq)
          fail(g, reason)
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
