/**
 * The KV hand-off over NATS: contexts moving from a device that leaves rollout to the devices
 * that stay, through the run's transfer store `GYRE_<run>_kv` (`../protocols/transfer.ts`:
 * memory storage, 10-minute TTL for objects a crashed source never deleted).
 *
 * Source side: `exportContexts` pins and exports (GYKV buffers) every execution's latest
 * context and the context of every generation paused in flight; `spread` assigns whole
 * executions to destinations by free blocks; `sendContexts` puts each context as object
 * `h.<nuid>` (its tokens, then its GYKV buffer: chunks of `max_payload`, so a context of any
 * length moves) and asks the destination to `ImportContexts` (at most `ASK_CONTEXTS` contexts an
 * ask, each named by its object: no message grows with a context), then deletes the objects.
 * Destination side: `receiveContexts` reads each object and imports it into its batcher under
 * the same request id, so the gateway's `base.request` finds it there. The source frees its
 * copies only after the destination answered (`role-switch.ts`).
 */
import type { ObjectStore } from "@nats-io/obj"
import { nuid } from "@nats-io/transport-node"
import { Effect } from "effect"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { ContextHandoff } from "../protocols/device.ts"
import { Device } from "../protocols/topology.ts"
import { bytesOf, deleteObject, getBytes, putParts } from "../protocols/transfer.ts"
import type { BatcherShape } from "./batcher.ts"
import type { ExportedContext } from "./kv-handoff.ts"

/** A context leaving this device: pinned and exported, not yet freed. */
export interface OutgoingContext {
  readonly execution: string
  /** A generation paused in flight (true) or a context cached between calls. */
  readonly inFlight: boolean
  readonly exported: ExportedContext
}

export interface Destination {
  /** `device/<id>` */
  readonly key: string
  readonly freeBlocks: number
}

/** What became of the contexts sent to one destination. */
export interface SentContexts {
  readonly to: string
  readonly imported: ReadonlyArray<OutgoingContext>
  readonly failed: ReadonlyArray<OutgoingContext>
  readonly bytes: number
}

const REQUEST = /^[A-Za-z0-9_-]+$/
/** Contexts named in one `ImportContexts` ask (~200 bytes each). */
const ASK_CONTEXTS = 256
const IMPORT_TIMEOUT_MS = 60_000

/**
 * Pins and exports each execution's latest context, and the context of every request in
 * `inFlight` (request -> execution) that left one. Every context returned holds one pin; one
 * the engine could not export is left behind (and freed with the rest).
 */
export const exportContexts = Effect.fn("exportContexts")(function* (batcher: BatcherShape, inFlight: ReadonlyMap<string, string>) {
  const out: Array<OutgoingContext> = []
  const exportOf = (execution: string, request?: string) => batcher.exportContext(execution, request).pipe(Effect.catch(() => Effect.succeed(undefined)))
  for (const execution of batcher.executions()) {
    const latest = yield* exportOf(execution)
    if (latest !== undefined) out.push({ execution, inFlight: inFlight.has(latest.request), exported: latest })
    for (const [request, of] of inFlight) {
      if (of !== execution || request === latest?.request) continue
      const exported = yield* exportOf(execution, request)
      if (exported !== undefined) out.push({ execution, inFlight: true, exported })
    }
  }
  return out
})

/** Whether a context can go over the wire: it has K/V and a request id the gateway can name. */
export const movable = (c: OutgoingContext): boolean => c.exported.kvLength > 0 && REQUEST.test(c.exported.request)

/**
 * Assigns whole executions (largest first) to the destination with the most free blocks left
 * after the earlier assignments; ties go to the destination preferred first.
 */
export const spread = (
  contexts: ReadonlyArray<OutgoingContext>,
  destinations: ReadonlyArray<Destination>,
  blockTokens: number
): Map<string, Array<OutgoingContext>> => {
  const byExecution = new Map<string, Array<OutgoingContext>>()
  for (const c of contexts) byExecution.set(c.execution, [...(byExecution.get(c.execution) ?? []), c])
  const blocksOf = (list: ReadonlyArray<OutgoingContext>) => list.reduce((n, c) => n + Math.ceil(c.exported.kvLength / blockTokens), 0)
  const free = destinations.map((d) => d.freeBlocks)
  const out = new Map<string, Array<OutgoingContext>>()
  const groups = [...byExecution.values()].sort((a, b) => blocksOf(b) - blocksOf(a))
  for (const group of groups) {
    if (destinations.length === 0) break
    const at = free.reduce((best, f, i) => (f > free[best]! ? i : best), 0)
    free[at]! -= blocksOf(group)
    const key = destinations[at]!.key
    out.set(key, [...(out.get(key) ?? []), ...group])
  }
  return out
}

/** Splits a list into asks of at most `ASK_CONTEXTS`. */
const asks = <A>(list: ReadonlyArray<A>): Array<Array<A>> =>
  Array.from({ length: Math.ceil(list.length / ASK_CONTEXTS) }, (_, i) => list.slice(i * ASK_CONTEXTS, (i + 1) * ASK_CONTEXTS))

/** Puts the contexts' buffers in the store, asks `to` to import them, deletes the objects. */
export const sendContexts = Effect.fn("sendContexts")(function* (
  system: ActorSystemShape,
  store: ObjectStore,
  from: string,
  to: string,
  contexts: ReadonlyArray<OutgoingContext>
) {
  const put = (c: OutgoingContext) =>
    putParts(store, `h.${nuid.next()}`, [bytesOf(c.exported.tokens), c.exported.buffer]).pipe(
      Effect.map((info): ContextHandoff | undefined => ({
        execution: c.execution,
        request: c.exported.request,
        object: info.name,
        length: c.exported.tokens.length,
        kvLength: c.exported.kvLength,
        inFlight: c.inFlight
      })),
      Effect.catch(() => Effect.succeed(undefined))
    )
  const handoffs = yield* Effect.forEach(contexts, put, { concurrency: 8 })
  const stored = handoffs.filter((h): h is ContextHandoff => h !== undefined)
  const ref = Device.refOfKey(to)
  const failed = new Set(contexts.filter((_, i) => handoffs[i] === undefined).map((c) => c.exported.request))
  yield* Effect.forEach(
    asks(stored),
    (chunk) =>
      system.ask(ref, "ImportContexts", { from, contexts: chunk }, { timeoutMs: IMPORT_TIMEOUT_MS }).pipe(
        Effect.map((answer) => answer.failed),
        Effect.catch(() => Effect.succeed(chunk.map((h) => h.request))),
        Effect.map((requests) => requests.forEach((r) => failed.add(r)))
      ),
    { concurrency: 2, discard: true }
  )
  yield* Effect.forEach(stored, (h) => deleteObject(store, h.object), { concurrency: 8, discard: true })
  return {
    to,
    imported: contexts.filter((c) => !failed.has(c.exported.request)),
    failed: contexts.filter((c) => failed.has(c.exported.request)),
    bytes: contexts.reduce((n, c) => n + (failed.has(c.exported.request) ? 0 : c.exported.buffer.length), 0)
  } satisfies SentContexts
})

/**
 * Destination side: reads each hand-off object and imports it under its request id, one at a time
 * (a context's object is as large as its K/V: reading them all first would hold them all at once).
 */
export const receiveContexts = Effect.fn("receiveContexts")(function* (
  system: ActorSystemShape,
  store: ObjectStore,
  batcher: BatcherShape,
  contexts: ReadonlyArray<ContextHandoff>
) {
  const failed: Array<string> = []
  for (const h of contexts) {
    const imported = yield* getBytes(system, store, h.object).pipe(
      Effect.flatMap((bytes) => {
        const split = h.length * 4
        if (bytes.length <= split) return Effect.succeed(false)
        const tokens = new Int32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + split))
        return batcher.importContext(h.execution, h.request, { request: h.request, tokens, kvLength: h.kvLength, buffer: bytes.subarray(split) }).pipe(Effect.as(true))
      }),
      Effect.catch(() => Effect.succeed(false))
    )
    if (!imported) failed.push(h.request)
  }
  return { imported: contexts.length - failed.length, failed }
})
