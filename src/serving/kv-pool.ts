/**
 * The batcher's side of the engine's KV pool: the sequences its generations run on and the
 * cached contexts they leave (`kv-contexts.ts` keeps the books, this module frees, forks and
 * measures the engine sequences behind them).
 *
 * A generation starts from a fork of the execution's cached context whose K/V is the longest
 * prefix of its prompt (or a fresh sequence), and leaves two: its prompt without the last
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
    /** Gives an admitted generation its sequence: a fork of its best cached prefix, else a new one. */
    start: (g: Generation) =>
      Effect.gen(function* () {
        const anchor = contexts.bestPrefix(g.job.execution, g.prompt)
        g.seq = anchor === undefined ? yield* cache.create() : yield* cache.fork(anchor.seq)
        g.cachedTokens = anchor?.kvLength ?? 0
        g.pending = g.prompt.subarray(g.cachedTokens)
        g.anchorPrompt = g.pending.length > 1
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
        const tokens = new Int32Array(g.prompt.length + g.output.length)
        tokens.set(g.prompt)
        tokens.set(g.output, g.prompt.length)
        const kvLength = yield* cache.length(g.seq)
        yield* addContext({ execution: g.job.execution, request: g.job.request, seq: g.seq, tokens, kvLength })
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
