/**
 * The gateway's path from one model call to a rollout worker and back.
 *
 * - Sticky routing: an execution stays on the worker that served its last call (its cached
 *   context is there) while that worker is usable; otherwise it moves to the least loaded
 *   usable one (`worker-directory.ts`; the local load is this gateway's requests in flight
 *   plus the executions it keeps on the worker).
 * - Deltas: the route remembers the sequences (prompt ++ output) of the execution's last few
 *   calls on its worker; a call sends `base` = the longest common prefix with one of them
 *   (length, digest, that call's request id) and only the tokens after it. A `CacheMiss`
 *   answer (the worker no longer holds that context) is followed at once by the full prompt.
 * - Transparent retries: if the worker is unavailable or draining, rejects the request, or
 *   dies while generating (its registry entry stops beating), the call continues on another
 *   worker: the new prompt is the original prompt plus the tokens already generated (streamed,
 *   or returned by a cancelled generation), and their log-probs and versions are kept, so the
 *   client sees one response. A generation cancelled because the client went away ends there.
 * - Moved contexts: a device leaving rollout (a role switch) pauses its generations and hands
 *   their contexts to another device; an answer with `movedTo` continues there with `base` =
 *   the paused request's whole sequence, the same seed and the remaining tokens, so nothing is
 *   prefilled again and the tokens equal an unmoved run's. `ContextsMoved` (`contextsMoved`)
 *   moves the routes of executions between calls the same way. A device that is leaving
 *   rollout keeps its routes until then (`WorkerDirectory.keeps`).
 * - Bounded messages: a prompt (after its base) of more than `inlineTokens` tokens goes to the
 *   worker as an object of the run's transfer store (`../protocols/transfer.ts`), deleted once
 *   the worker answered, and a long answer comes back the same way: a full resend or a
 *   continuation of any length never meets NATS's `max_payload`.
 * - Counts: a call's `fullResends` are its asks that carried the whole prompt although the
 *   execution's earlier sequences share a prefix with it (a `CacheMiss`, a move to a worker
 *   without its context); `reprefillTokens` are the tokens its workers had evicted and computed
 *   again.
 */
import type { ObjectStore } from "@nats-io/obj"
import { nuid } from "@nats-io/transport-node"
import { Context, Deferred, Effect, Fiber, Layer, Schema } from "effect"
import { subscribe } from "../runtime/channel-io.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { digestOf } from "../tree/hash.ts"
import { Tokens, rolloutServerRef } from "../protocols/topology.ts"
import { deleteObject, getArrays, putArrays, type TokensRef } from "../protocols/transfer.ts"
import { apiError, type ApiError } from "../openai/openai.ts"
import { type ContextTooLong, type FinishReason, type GenerateResult, type SamplingParams, type StepTokens } from "../protocols/rollout.ts"
import type { WorkerDirectory } from "./worker-directory.ts"

/** One of an execution's last calls: its request id, its sequence (prompt ++ output), the worker that holds it. */
interface Remembered {
  readonly request: string
  tokens: Int32Array
  worker: string
}

/** Where an execution's calls go. */
export interface Route {
  worker: string | undefined
  /** The execution's last calls; those on `worker` are the bases of deltas. */
  recent: Array<Remembered>
  readonly servedBy: Set<string>
}

export const newRoute = (): Route => ({ worker: undefined, recent: [], servedBy: new Set() })

export interface CallRequest {
  readonly execution: string
  readonly route: Route
  readonly prompt: Int32Array
  readonly sampling: SamplingParams
  /** Receives each step's tokens as they are generated (asks the worker to stream). */
  readonly onTokens?: ((step: StepTokens) => void) | undefined
  /** Completed when the client went away: the generation is cancelled. */
  readonly clientGone: Deferred.Deferred<void>
}

export interface CallResult {
  readonly output: Int32Array
  readonly logprobs: Float32Array
  readonly versions: Int32Array
  readonly finishReason: FinishReason
  readonly promptTokens: number
  /** Prompt tokens the first worker to answer found in its cache. */
  readonly cachedTokens: number
  readonly computeMs: number
  /** Time spent inside workers (from each taking the request to its answer). */
  readonly workerMs: number
  /** Workers that took part, in order (more than one after a retry). */
  readonly workers: ReadonlyArray<string>
  /** Asks that carried the whole prompt again (see the module comment). */
  readonly fullResends: number
  /** Tokens the workers had evicted and prefilled again. */
  readonly reprefillTokens: number
}

export interface RouterOptions {
  readonly generateTimeoutMs: number
  readonly maxAttempts: number
  /** How long a call waits for a usable worker to appear before answering 503. */
  readonly workerWaitMs: number
  /** Sequences remembered per execution for deltas. */
  readonly recentPerExecution: number
  /** Prompt tokens sent inside a Generate at most; more go as an object (default `INLINE_TOKENS`). */
  readonly inlineTokens: number
}

class WorkerGone extends Schema.TaggedError<WorkerGone>()("WorkerGone", { worker: Schema.String }) {}

type Attempt =
  | { readonly _tag: "done"; readonly result: GenerateResult }
  | { readonly _tag: "failed"; readonly reason: string; readonly partial: StepTokens }
  | { readonly _tag: "tooLong"; readonly tokens: number; readonly limit: number; readonly bound: "model" | "kv-pool" | undefined }

const concat = (a: Int32Array, b: ArrayLike<number>): Int32Array => {
  const out = new Int32Array(a.length + b.length)
  out.set(a)
  out.set(b, a.length)
  return out
}

/** Appends `from` to `to` (no spread: an array of 100k+ values would overflow the stack). */
const pushAll = (to: Array<number>, from: ArrayLike<number>) => {
  for (let i = 0; i < from.length; i++) to.push(from[i]!)
}

/** The 400 of a prompt over the workers' context limit, naming what bounds it and the flag that moves it. */
const contextTooLong = (tokens: number, limit: number, bound: "model" | "kv-pool" | undefined) =>
  apiError(
    400,
    `This model's maximum context length is ${limit} tokens. However, your request has ${tokens} prompt tokens. ` +
      (bound === "kv-pool"
        ? `The limit is the rollout devices' KV pool (${limit / 16} blocks of 16 tokens); --kv-blocks raises it (gyre train, demo, node, serve).`
        : "The limit is the model's (max_position_embeddings)."),
    { param: "messages", code: "context_length_exceeded" }
  )

const commonPrefix = (a: Int32Array, b: Int32Array): number => {
  const n = Math.min(a.length, b.length)
  let i = 0
  while (i < n && a[i] === b[i]) i++
  return i
}

/** A worker by registry key: `rollout-worker/<id>`, or `device/<id>` (a device serves the same requests). */
const workerRef = rolloutServerRef

/** The router's own figures: this gateway's requests in flight and the routes it keeps, per worker. */
interface RouterState {
  readonly inFlight: Map<string, number>
  readonly routed: Map<string, number>
}

/** What the router's operations share. */
interface Routing {
  readonly system: ActorSystemShape
  readonly directory: WorkerDirectory
  readonly store: ObjectStore
  readonly options: RouterOptions
  readonly state: RouterState
}

const bump = (m: Map<string, number>, key: string | undefined, by: number) => {
  if (key !== undefined) m.set(key, (m.get(key) ?? 0) + by)
}

/** A worker's local load: this gateway's requests in flight plus the executions it keeps there. */
const localLoad = (state: RouterState) => (key: string) => (state.inFlight.get(key) ?? 0) + (state.routed.get(key) ?? 0)

const moveRoute = (state: RouterState, route: Route, worker: string | undefined) => {
  if (route.worker === worker) return
  bump(state.routed, route.worker, -1)
  bump(state.routed, worker, 1)
  route.worker = worker
}

/** The route's worker if usable, else the least loaded usable one (preferring those not tried). */
const chooseWorker = Effect.fnUntraced(function* (r: Routing, route: Route, tried: ReadonlySet<string>) {
  const deadline = performance.now() + r.options.workerWaitMs
  const load = localLoad(r.state)
  while (true) {
    if (route.worker !== undefined && !tried.has(route.worker) && r.directory.keeps(route.worker)) return route.worker
    const picked = r.directory.pick(tried, load) ?? r.directory.pick(new Set(), load)
    if (picked !== undefined) {
      moveRoute(r.state, route, picked.key)
      return picked.key
    }
    if (performance.now() > deadline) {
      return yield* Effect.fail(apiError(503, "No rollout worker is available to serve the model; try again later.", { code: "no_worker_available" }))
    }
    yield* Effect.sleep("100 millis")
  }
})

/** `base` and the tokens after it, relative to the route's remembered sequences on `worker`. */
const delta = (route: Route, worker: string, full: Int32Array) => {
  let best: { request: string; length: number } | undefined
  if (route.worker === worker) {
    for (const r of route.recent) {
      if (r.worker !== worker) continue
      const n = commonPrefix(r.tokens, full)
      if (n > 0 && (best === undefined || n > best.length)) best = { request: r.request, length: n }
    }
  }
  if (best === undefined) return { base: null, prompt: full }
  return {
    base: { length: best.length, digest: digestOf(full.subarray(0, best.length)), request: best.request },
    prompt: full.subarray(best.length)
  }
}

/**
 * Remembers a call's sequence. The earlier ones it extends (an agent loop's, each call's prompt
 * starting with the last sequence) become views of its buffer: an execution's remembered
 * sequences cost about one copy of its context, not `recentPerExecution`.
 */
const remember = (options: RouterOptions, route: Route, entry: Remembered) => {
  for (const r of route.recent) {
    if (r.tokens.buffer !== entry.tokens.buffer && commonPrefix(r.tokens, entry.tokens) === r.tokens.length) r.tokens = entry.tokens.subarray(0, r.tokens.length)
  }
  route.recent.push(entry)
  if (route.recent.length > options.recentPerExecution) route.recent.shift()
}

/** A whole prompt that an earlier sequence of the execution shares a prefix with: sent again. */
const resends = (route: Route, full: Int32Array) => route.recent.some((r) => commonPrefix(r.tokens, full) > 0)

/** Runs `use` with the Generate's prompt fields: inline, or an object of the transfer store deleted afterwards. */
const withPrompt = <A, E>(r: Routing, tokens: Int32Array, use: (fields: { prompt: Int32Array; promptObject?: TokensRef }) => Effect.Effect<A, E>) =>
  tokens.length <= r.options.inlineTokens
    ? use({ prompt: tokens })
    : Effect.acquireUseRelease(
        putArrays(r.store, "p", [tokens]),
        (ref) => use({ prompt: new Int32Array(0), promptObject: ref }),
        (ref) => deleteObject(r.store, ref.object)
      )

/** An answer with its output in place (read from the transfer store, then deleted, when it came as an object). */
const withOutput = (r: Routing, result: GenerateResult) => {
  const ref = result.outputObject
  if (ref === undefined) return Effect.succeed(result)
  return getArrays(r.system, r.store, ref, ["int32", "float32", "int32"] as const).pipe(
    Effect.map(([output, logprobs, versions]): GenerateResult => ({ ...result, output, logprobs, versions, outputObject: undefined })),
    Effect.ensuring(deleteObject(r.store, ref.object))
  )
}

/** Tokens, log-probs and versions gathered piece by piece. */
class Gathered {
  readonly tokens: Array<number> = []
  readonly logprobs: Array<number> = []
  readonly versions: Array<number> = []
  append(s: { readonly tokens: ArrayLike<number>; readonly logprobs: ArrayLike<number>; readonly versions: ArrayLike<number> }) {
    pushAll(this.tokens, s.tokens)
    pushAll(this.logprobs, s.logprobs)
    pushAll(this.versions, s.versions)
  }
  arrays(): StepTokens {
    return { tokens: Int32Array.from(this.tokens), logprobs: Float32Array.from(this.logprobs), versions: Int32Array.from(this.versions) }
  }
}

/** Subscribes to the token stream of `request` (when the call streams): each chunk is kept in `streamed` and handed on. */
const subscribeTokens = (r: Routing, req: CallRequest, request: string, streamed: Gathered) => {
  const onTokens = req.onTokens
  if (onTokens === undefined) return Effect.succeed(undefined)
  return subscribe(r.system, Tokens, request, (chunk) => {
    if (chunk.done) return
    const { tokens, logprobs } = chunk
    const step = { tokens, logprobs, versions: chunk.versions ?? new Int32Array(tokens.length) }
    streamed.append(step)
    onTokens(step)
  })
}

/** An attempt's failure as an outcome: too long, or failed with what was streamed (a worker still there is asked to stop). */
const failedAttempt = (r: Routing, worker: string, request: string, streamed: Gathered, e: { readonly _tag: string }): Effect.Effect<Attempt> => {
  if (e._tag === "ContextTooLong") {
    const t = e as ContextTooLong
    return Effect.succeed({ _tag: "tooLong", tokens: t.tokens, limit: t.limit, bound: t.bound })
  }
  const failed = Effect.succeed<Attempt>({ _tag: "failed", reason: e._tag, partial: streamed.arrays() })
  // A worker that is still there may still be generating: stop it (best effort).
  return e._tag === "AskTimeout" || e._tag === "TransportError"
    ? Effect.forkDetach(r.system.ask(workerRef(worker), "Cancel", { request }, { timeoutMs: 5000 }).pipe(Effect.ignore)).pipe(Effect.andThen(failed))
    : failed
}

/** One ask of the call on `worker`: the answer, a failure to retry elsewhere, or a prompt too long. */
const attempt = Effect.fnUntraced(function* (r: Routing, worker: string, req: CallRequest, full: Int32Array, sampling: SamplingParams) {
  const ref = workerRef(worker)
  const request = nuid.next()
  const streamed = new Gathered()
  const subscription = yield* subscribeTokens(r, req, request, streamed)
  bump(r.state.inFlight, worker, 1)
  const canceller = yield* Effect.forkChild(
    Deferred.await(req.clientGone).pipe(Effect.andThen(r.system.ask(ref, "Cancel", { request }, { timeoutMs: 5000 })), Effect.ignore)
  )
  let fullResends = 0
  const ask = (d: ReturnType<typeof delta>) => {
    if (d.base === null && resends(req.route, full)) fullResends++
    const generate = { execution: req.execution, request, base: d.base, sampling, stream: req.onTokens !== undefined }
    return withPrompt(r, d.prompt, (fields) => r.system.ask(ref, "Generate", { ...generate, ...fields }, { timeoutMs: r.options.generateTimeoutMs }))
  }
  const outcome: Attempt = yield* ask(delta(req.route, worker, full)).pipe(
    Effect.catchTag("CacheMiss", () => ask({ base: null, prompt: full })),
    Effect.flatMap((result) => withOutput(r, result)),
    Effect.raceFirst(r.directory.awaitDeath(worker).pipe(Effect.andThen(Effect.fail(new WorkerGone({ worker }))))),
    Effect.map((result): Attempt => ({ _tag: "done", result })),
    Effect.catch((e) => failedAttempt(r, worker, request, streamed, e)),
    Effect.ensuring(
      Effect.sync(() => {
        subscription?.unsubscribe()
        bump(r.state.inFlight, worker, -1)
      })
    )
  )
  yield* Fiber.interrupt(canceller)
  return { outcome, request, fullResends }
})

/** A call's figures over its attempts, and its output so far. */
class CallTally {
  readonly out = new Gathered()
  readonly workers: Array<string> = []
  cachedTokens: number | undefined = undefined
  computeMs = 0
  workerMs = 0
  fullResends = 0
  reprefillTokens = 0
  constructor(readonly promptTokens: number) {}
  answered(result: GenerateResult) {
    this.out.append({ tokens: result.output, logprobs: result.logprobs, versions: result.versions })
    this.computeMs += result.computeMs
    this.workerMs += result.workerMs
    this.reprefillTokens += result.reprefillTokens
    this.cachedTokens ??= result.cachedTokens
  }
  finished(finishReason: FinishReason): CallResult {
    const { tokens: output, logprobs, versions } = this.out.arrays()
    return {
      output,
      logprobs,
      versions,
      finishReason,
      promptTokens: this.promptTokens,
      cachedTokens: Math.min(this.cachedTokens ?? 0, this.promptTokens),
      computeMs: this.computeMs,
      workerMs: this.workerMs,
      workers: this.workers,
      fullResends: this.fullResends,
      reprefillTokens: this.reprefillTokens
    }
  }
}

/**
 * A device leaving rollout handed the contexts of `requests` to `to`: a route still on `from`
 * moves there, keeping the sequences of those requests (the next call's base). False when
 * the route had already left `from`.
 */
const contextsMoved = (state: RouterState) => (route: Route, from: string, to: string, requests: ReadonlySet<string>): boolean => {
  if (route.worker !== from) return false
  for (const r of route.recent) if (r.worker === from && requests.has(r.request)) r.worker = to
  moveRoute(state, route, to)
  route.servedBy.add(to)
  return true
}

/** What a call does after a worker answered: the result to return, or undefined to continue on another worker. */
const afterAnswer = Effect.fnUntraced(function* (r: Routing, req: CallRequest, tally: CallTally, worker: string, request: string, full: Int32Array, result: GenerateResult) {
  tally.answered(result)
  req.route.servedBy.add(worker)
  remember(r.options, req.route, { request, tokens: concat(full, result.output), worker })
  const clientGone = yield* Deferred.isDone(req.clientGone)
  if (result.finishReason !== "cancelled" || clientGone) return tally.finished(result.finishReason)
  // Cancelled by the worker: continue where a role switch moved its context (its sequence is
  // remembered above, so the next attempt's base is all of it), else elsewhere.
  if (result.movedTo !== undefined) contextsMoved(r.state)(req.route, worker, result.movedTo, new Set([request]))
  else if (req.route.worker === worker) moveRoute(r.state, req.route, undefined)
  if (tally.out.tokens.length >= req.sampling.maxTokens) return tally.finished("length")
  return undefined
})

const call = Effect.fn("CallRouter.call")(function* (r: Routing, req: CallRequest) {
  const tally = new CallTally(req.prompt.length)
  const tried = new Set<string>()
  for (let n = 1; n <= r.options.maxAttempts; n++) {
    const worker = yield* chooseWorker(r, req.route, tried)
    tried.add(worker)
    tally.workers.push(worker)
    const full = concat(req.prompt, tally.out.tokens)
    const sampling = { ...req.sampling, maxTokens: req.sampling.maxTokens - tally.out.tokens.length }
    const { outcome, request, fullResends } = yield* attempt(r, worker, req, full, sampling)
    tally.fullResends += fullResends
    if (outcome._tag === "tooLong") {
      if (tally.out.tokens.length > 0) return tally.finished("length")
      return yield* Effect.fail(contextTooLong(outcome.tokens, outcome.limit, outcome.bound))
    }
    if (outcome._tag === "failed") {
      tally.out.append(outcome.partial)
      if (req.route.worker === worker) moveRoute(r.state, req.route, undefined)
      continue
    }
    const done = yield* afterAnswer(r, req, tally, worker, request, full, outcome.result)
    if (done !== undefined) return done
  }
  return yield* Effect.fail(apiError(503, `The call failed on ${r.options.maxAttempts} rollout workers in a row; try again later.`, { code: "worker_unavailable" }))
})

/** Frees the execution's cached contexts on `worker` (best effort). */
const releaseOn = (system: ActorSystemShape) => (worker: string, execution: string) =>
  system.ask(workerRef(worker), "Release", { execution }, { timeoutMs: 5000 }).pipe(Effect.ignore)

export interface CallRouterShape {
  /** Runs a model call on the workers (the module comment: routes, deltas, retries, moves). */
  readonly call: (req: CallRequest) => Effect.Effect<CallResult, ApiError>
  /** Frees the execution's cached contexts on every worker that served it. */
  readonly release: (execution: string, route: Route) => Effect.Effect<void>
  /** Frees the execution's cached contexts on `worker` (best effort). */
  readonly releaseOn: (worker: string, execution: string) => Effect.Effect<void>
  /** A device handed the contexts of `requests` from `from` to `to` (`ContextsMoved`); false when the route had left `from`. */
  readonly contextsMoved: (route: Route, from: string, to: string, requests: ReadonlySet<string>) => boolean
}

const makeCallRouter = (system: ActorSystemShape, directory: WorkerDirectory, store: ObjectStore, options: RouterOptions): CallRouterShape => {
  const r: Routing = { system, directory, store, options, state: { inFlight: new Map(), routed: new Map() } }
  const release = Effect.fn("CallRouter.release")(function* (execution: string, route: Route) {
    moveRoute(r.state, route, undefined)
    yield* Effect.forEach([...route.servedBy], (worker) => releaseOn(system)(worker, execution), { concurrency: "unbounded", discard: true })
  })
  return { call: (req) => call(r, req), release, releaseOn: releaseOn(system), contextsMoved: contextsMoved(r.state) }
}

/** The gateway's call router over the run's worker directory and transfer store. */
export class CallRouter extends Context.Service<CallRouter, CallRouterShape>()("gyre/gateway/CallRouter") {
  static readonly make = makeCallRouter
  static readonly layer = (system: ActorSystemShape, directory: WorkerDirectory, store: ObjectStore, options: RouterOptions) =>
    Layer.succeed(CallRouter, makeCallRouter(system, directory, store, options))
}
