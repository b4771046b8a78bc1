/**
 * KV hand-off of an execution's cached contexts between workers (a device's role switch,
 * `role-switch.ts`, moves them over NATS with `handoff.ts`).
 *
 * Each hook acts on the execution's latest context, or on the one a given request left. `pin` holds the context (never evicted; released meanwhile, its blocks stay until the
 * unpin), `export` pins it and copies its K/V out as the engine's GYKV buffer, `unpin` lets
 * go once the destination acknowledged, `import` makes a received buffer the execution's
 * latest context (the destination's least recently used contexts are evicted for it when its
 * pool is short). A cancelled generation leaves its context (prompt ++ partial output) like a
 * finished one, so a request moved off a worker is exported after the cancel, imported at
 * the destination and continued there with `base` pointing at it: nothing is prefilled again.
 * Each operation runs between engine steps (under `stepLock`).
 */
import { Effect, type Semaphore } from "effect"
import type { KvCache } from "../engine/kvcache.ts"
import type { NativeError } from "../engine/native.ts"
import type { CachedContext } from "./kv-contexts.ts"
import type { KvPool } from "./kv-pool.ts"

/** An execution's context as it leaves for another worker. */
export interface ExportedContext {
  /** The request that left it (the name it is imported under). */
  readonly request: string
  readonly tokens: Int32Array
  readonly kvLength: number
  /** The engine's GYKV hand-off buffer of `tokens[0, kvLength)`. */
  readonly buffer: Uint8Array
}

export interface KvHandoff {
  /** Pins the execution's latest context (or `request`'s); its request, tokens and K/V length, or undefined. */
  readonly pinContext: (
    execution: string,
    request?: string
  ) => Effect.Effect<{ readonly request: string; readonly tokens: Int32Array; readonly kvLength: number; readonly seq: number } | undefined, NativeError>
  /** Pins and exports the execution's latest context, or `request`'s (unpin after the destination acknowledged). */
  readonly exportContext: (execution: string, request?: string) => Effect.Effect<ExportedContext | undefined, NativeError>
  /** Releases a pin taken by `pinContext` / `exportContext`. */
  readonly unpinContext: (execution: string) => Effect.Effect<void, NativeError>
  /** Imports an exported context as the execution's latest, named by `request`. */
  readonly importContext: (execution: string, request: string, context: ExportedContext) => Effect.Effect<void, NativeError>
}

export const makeKvHandoff = (cache: KvCache, pool: KvPool, stepLock: Semaphore.Semaphore): KvHandoff => {
  // Contexts pinned for a hand-off, per execution.
  const pinned = new Map<string, Array<CachedContext>>()

  const pinContext: KvHandoff["pinContext"] = (execution, request) =>
    stepLock.withPermit(
      Effect.gen(function* () {
        const c = request === undefined ? pool.contexts.latest(execution) : pool.contexts.find(execution, request)
        if (c === undefined) return undefined
        yield* cache.pin(c.seq)
        c.pins++
        pinned.set(execution, [...(pinned.get(execution) ?? []), c])
        return { request: c.request, tokens: c.tokens, kvLength: c.kvLength, seq: c.seq }
      })
    )

  const exportContext: KvHandoff["exportContext"] = (execution, request) =>
    Effect.gen(function* () {
      const c = yield* pinContext(execution, request)
      if (c === undefined) return undefined
      const buffer = yield* stepLock.withPermit(cache.export(c.seq))
      return { request: c.request, tokens: c.tokens, kvLength: c.kvLength, buffer }
    })

  const unpinContext: KvHandoff["unpinContext"] = (execution) =>
    stepLock.withPermit(
      Effect.gen(function* () {
        const list = pinned.get(execution) ?? []
        const c = list.pop()
        if (list.length === 0) pinned.delete(execution)
        if (c === undefined) return
        c.pins--
        yield* cache.unpin(c.seq)
      })
    )

  /** The imported sequence; a short pool drops its least recently used contexts for it, one at a time. */
  const importRoomy = (buffer: Uint8Array): Effect.Effect<number, NativeError> =>
    cache.import(buffer).pipe(
      Effect.catchTag("OutOfKvBlocks", (e) => pool.evictOldest.pipe(Effect.flatMap((evicted) => (evicted ? importRoomy(buffer) : Effect.fail(e)))))
    )

  const importContext: KvHandoff["importContext"] = (execution, request, context) =>
    stepLock.withPermit(
      Effect.gen(function* () {
        const seq = yield* importRoomy(context.buffer)
        yield* pool.addContext({ execution, request, seq, tokens: context.tokens, kvLength: context.kvLength })
      })
    )

  return { pinContext, exportContext, unpinContext, importContext }
}
