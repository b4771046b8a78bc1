/**
 * The batcher's side of the engine's KV pool: the sequences its generations run on and the
 * cached contexts they leave (`kv-contexts.ts` keeps the books, this module frees, forks and
 * measures the engine sequences behind them).
 *
 * A generation starts from a fork of the execution's cached context sharing the longest prefix
 * with its prompt: the whole context when all its K/V is shared, else a prefix fork of the
 * shared tokens when they fill at least one block; otherwise a fresh sequence. It leaves two: its prompt without the last
 * token (`anchor`, forked off as soon as that is in, so a retry of the same prompt prefills
 * one token) and, when it ends, its prompt ++ output (`keep`). Contexts pushed out of an
 * execution's budget are freed at once.
 */
import { Effect } from "effect"
import type { KvCache } from "../engine/kvcache.ts"
import type { Generation } from "./generation.ts"
import { ExecutionContexts, type CachedContext } from "./kv-contexts.ts"

export const makeKvPool = (cache: KvCache, contextsPerExecution: number) => {
  const contexts = new ExecutionContexts(contextsPerExecution)

  /** Frees a sequence; a failure (already gone) is ignored. */
  const free = (seq: number) => cache.free(seq).pipe(Effect.catchCause(() => Effect.void))
  const freeContexts = (list: ReadonlyArray<CachedContext>) => Effect.forEach(list, (c) => free(c.seq), { discard: true })

  /** Adds a context (its sequence is the pool's from now on), freeing those it pushes out. */
  const addContext = (context: Omit<CachedContext, "lastUsed" | "pins">) => freeContexts(contexts.add(context))

  return {
    contexts,
    free,
    addContext,
    /**
     * Gives an admitted generation its sequence: a fork (whole or prefix) of the cached context
     * sharing most of its prompt, else a new one. A generation preempted earlier resumes from
     * its prompt ++ output; what it had computed and must compute again is prefilled again.
     */
    start: (g: Generation) =>
      Effect.gen(function* () {
        const sequence = g.output.length === 0 ? g.prompt : concat(g.prompt, g.output)
        const match = contexts.bestPrefix(g.job.execution, sequence, cache.blockTokens)
        g.seq = match === undefined ? yield* cache.create() : match.whole ? yield* cache.fork(match.context.seq) : yield* cache.forkPrefix(match.context.seq, match.length)
        const cached = match?.length ?? 0
        g.pending = sequence.subarray(cached)
        g.appended = 0
        if (g.preemptedAt === undefined) {
          g.cachedTokens = cached
          g.reprefillTokens = contexts.reprefillOf(g.job.execution, sequence, cached)
          g.anchorPrompt = g.pending.length > 1
        } else {
          g.reprefillTokens += Math.max(0, g.preemptedAt - cached)
          g.preemptedAt = undefined
        }
      }),
    /** Keeps the prompt's K/V without its last token as a context (a fork: it shares the blocks). */
    anchor: (g: Generation) =>
      Effect.gen(function* () {
        g.anchorPrompt = false
        const seq = yield* cache.fork(g.seq)
        const kvLength = g.prompt.length - 1
        yield* addContext({ execution: g.job.execution, request: `${g.job.request}:prompt`, seq, tokens: g.prompt.subarray(0, kvLength), kvLength })
      }),
    /** An ended generation's sequence becomes a cached context of prompt ++ output. */
    keep: (g: Generation) =>
      Effect.gen(function* () {
        const kvLength = yield* cache.length(g.seq)
        yield* addContext({ execution: g.job.execution, request: g.job.request, seq: g.seq, tokens: concat(g.prompt, g.output), kvLength })
        return kvLength
      }),
    /** Drops the least recently used unpinned context of any execution; false when there is none. */
    evictOldest: Effect.suspend(() => {
      const victim = contexts.evictOldest()
      return victim === undefined ? Effect.succeed(false) : free(victim.seq).pipe(Effect.as(true))
    }),
    /** Frees an execution's cached contexts. */
    release: (execution: string) => freeContexts(contexts.release(execution))
  }
}

export type KvPool = ReturnType<typeof makeKvPool>

const concat = (a: Int32Array, b: ReadonlyArray<number>): Int32Array => {
  const out = new Int32Array(a.length + b.length)
  out.set(a)
  out.set(b, a.length)
  return out
}
