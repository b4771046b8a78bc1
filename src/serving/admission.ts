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

/** The two lanes of generations and the admission state. */
interface LanesState {
  readonly pool: KvPool
  readonly worker: string
  readonly maxBatch: number
  readonly waiting: Array<Generation>
  readonly running: Array<Generation>
  /** A generation was preempted and none has ended since: admit only into an empty batch. */
  pressure: boolean
  preemptions: number
}

const answer = (s: LanesState, g: Generation, reason: FinishReason) => Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, reason, s.worker)))

const fail = (s: LanesState, g: Generation, reason: string) =>
  Deferred.doneUnsafe(g.done, Effect.fail(new WorkerUnavailable({ worker: s.worker, reason })))

/** Takes a generation out of the running lane; false when it was not there. */
const leave = (s: LanesState, g: Generation): boolean => {
  const at = s.running.indexOf(g)
  if (at >= 0) s.running.splice(at, 1)
  return at >= 0
}

/** Ends a running generation: its sequence becomes a cached context. */
const finish = (s: LanesState) => (g: Generation, reason: FinishReason) =>
  Effect.gen(function* () {
    if (!leave(s, g)) return
    s.pressure = false
    yield* s.pool.keep(g)
    answer(s, g, reason)
  })

/** Back to the head of the queue, its sequence kept as a context to resume from. */
const preempt = (s: LanesState, g: Generation) =>
  Effect.gen(function* () {
    leave(s, g)
    g.preemptedAt = yield* s.pool.keep(g)
    g.seq = -1
    s.waiting.unshift(g)
    s.pressure = true
    s.preemptions++
  })

/** Admits waiting generations in arrival order while the batch has room. */
const admit = (s: LanesState) =>
  Effect.gen(function* () {
    while (s.running.length < s.maxBatch && s.waiting.length > 0 && !(s.pressure && s.running.length > 0)) {
      const g = s.waiting.shift()!
      if (g.cancelled) {
        answer(s, g, "cancelled")
        continue
      }
      yield* s.pool.start(g)
      s.running.push(g)
    }
  })

/** Makes room in the pool: drops a cached context, else preempts the youngest generation. */
const makeRoom = (s: LanesState) =>
  Effect.gen(function* () {
    if (yield* s.pool.evictOldest) return
    const youngest = s.running.at(-1)
    if (youngest === undefined) return
    if (s.running.length > 1) return yield* preempt(s, youngest)
    leave(s, youngest)
    yield* s.pool.free(youngest.seq)
    fail(s, youngest, "the KV pool is held by contexts pinned for a hand-off")
  })

/** Fails every generation (the engine step failed): `WorkerUnavailable`, the gateway retries elsewhere. */
const failAll = (s: LanesState) => (reason: string) =>
  Effect.gen(function* () {
    for (const g of [...s.running, ...s.waiting.splice(0)]) {
      if (leave(s, g)) yield* s.pool.free(g.seq)
      fail(s, g, reason)
    }
  })

/** Answers every generation as cancelled (the batcher's scope closes). */
const cancelAll = (s: LanesState) =>
  Effect.sync(() => {
    for (const g of [...s.running, ...s.waiting]) g.cancelled = true
    for (const g of s.waiting.splice(0)) answer(s, g, "cancelled")
    for (const g of s.running.splice(0)) answer(s, g, "cancelled")
  })

/** The lanes of one batcher over its pool (the module comment). */
export const makeLanes = (pool: KvPool, options: { readonly worker: string; readonly maxBatch: number }) => {
  const s: LanesState = { pool, worker: options.worker, maxBatch: options.maxBatch, waiting: [], running: [], pressure: false, preemptions: 0 }
  return {
    waiting: s.waiting,
    running: s.running,
    get idle() {
      return s.running.length === 0 && s.waiting.length === 0
    },
    get preemptions() {
      return s.preemptions
    },
    finish: finish(s),
    admit: admit(s),
    makeRoom: makeRoom(s),
    failAll: failAll(s),
    cancelAll: cancelAll(s)
  }
}

export type Lanes = ReturnType<typeof makeLanes>
