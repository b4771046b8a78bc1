/**
 * The call router over fake workers (a scripted `ask`, a fixed worker directory): sticky routes,
 * deltas against remembered sequences, the full resend after a `CacheMiss`, retries on other
 * workers, moved contexts, the 400 of a prompt too long and the 503s. No NATS: the router's
 * decisions are the point, the transport is covered end to end (test/rollout).
 */
import type { ObjectStore } from "@nats-io/obj"
import { Deferred, Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { CallRouter, newRoute, type CallResult, type Route, type RouterOptions } from "../../src/gateway/call-router.ts"
import type { WorkerDirectory, WorkerView } from "../../src/gateway/worker-directory.ts"
import type { ApiError } from "../../src/openai/openai.ts"
import { CacheMiss, ContextTooLong, WorkerUnavailable, type GenerateRequest, type GenerateResult } from "../../src/protocols/rollout.ts"
import { AskTimeout } from "../../src/runtime/errors.ts"
import { formatAddress } from "../../src/runtime/names.ts"
import type { ActorSystemShape } from "../../src/runtime/system.ts"
import { digestOf } from "../../src/tree/hash.ts"

interface Asked {
  readonly worker: string
  readonly tag: string
  readonly payload: any
}

/** What a worker answers a `Generate`: a result, or a failure. */
type Answer = (req: GenerateRequest) => Effect.Effect<GenerateResult, unknown>

const result = (worker: string, output: ReadonlyArray<number>, more: Partial<GenerateResult> = {}): GenerateResult => ({
  output: Int32Array.from(output),
  logprobs: Float32Array.from(output, (t) => -t / 100),
  versions: new Int32Array(output.length).fill(2),
  finishReason: "stop",
  promptTokens: 0,
  cachedTokens: 0,
  reprefillTokens: 0,
  computeMs: 1,
  workerMs: 2,
  worker,
  ...more
})

/** Workers `keys`, each answering `Generate` with the next of its scripted answers (else `output` [7, 8]). */
const fakes = (keys: ReadonlyArray<string>, script: Record<string, Array<Answer>> = {}) => {
  const asked: Array<Asked> = []
  const usable = new Set(keys)
  // Lazy, as the real ask: nothing is sent until the effect runs.
  const ask = (ref: { address: { kind: string; id: string } }, tag: string, payload: any) => Effect.suspend(() => answer(ref, tag, payload))
  const answer = (ref: { address: { kind: string; id: string } }, tag: string, payload: any): Effect.Effect<unknown, unknown> => {
    const worker = formatAddress(ref.address)
    asked.push({ worker, tag, payload })
    if (tag === "Generate") {
      const next = script[worker]?.shift()
      return next === undefined ? Effect.succeed(result(worker, [7, 8])) : next(payload)
    }
    if (tag === "Cancel") return Effect.succeed({ found: true })
    return Effect.succeed({ freedBlocks: 1 })
  }
  const system = { run: "run-1", ask } as unknown as ActorSystemShape
  const view = (key: string): WorkerView => ({ key, id: key.split("/")[1]!, node: "n", status: "running", load: undefined, seenAt: 0 })
  const directory: WorkerDirectory = {
    alive: (k) => usable.has(k),
    usable: (k) => usable.has(k),
    keeps: (k) => usable.has(k),
    pick: (exclude, localLoad) =>
      keys
        .filter((k) => usable.has(k) && !exclude.has(k))
        .sort((a, b) => localLoad(a) - localLoad(b))
        .map(view)[0],
    awaitDeath: () => Effect.never,
    workers: () => keys.filter((k) => usable.has(k)).map(view)
  }
  return { asked, system, directory, usable, generates: () => asked.filter((a) => a.tag === "Generate") }
}

const options: RouterOptions = { generateTimeoutMs: 1000, maxAttempts: 3, workerWaitMs: 150, recentPerExecution: 4, inlineTokens: 1 << 20 }

const router = (f: ReturnType<typeof fakes>, more: Partial<RouterOptions> = {}) =>
  CallRouter.make(f.system, f.directory, {} as ObjectStore, { ...options, ...more })

const call = (r: ReturnType<typeof router>, route: Route, prompt: ReadonlyArray<number>, maxTokens = 16) =>
  Effect.gen(function* () {
    const clientGone = yield* Deferred.make<void>()
    return yield* r.call({
      execution: "x1",
      route,
      prompt: Int32Array.from(prompt),
      sampling: { maxTokens, temperature: 1, topP: 1, seed: 3, stop: [] },
      clientGone
    })
  })

const run = <A>(effect: Effect.Effect<A, ApiError>) => Effect.runPromise(effect)
const failure = (effect: Effect.Effect<CallResult, ApiError>) =>
  Effect.runPromise(Effect.exit(effect)).then((exit) => {
    if (Exit.isSuccess(exit)) throw new Error("expected a failure")
    return exit.cause.reasons.find((r) => r._tag === "Fail")?.error as ApiError
  })

describe("call router", () => {
  it("keeps an execution on its worker and sends only the tokens after the longest remembered prefix", async () => {
    const f = fakes(["rollout-worker/a", "rollout-worker/b"])
    const r = router(f)
    const route = newRoute()
    const first = await run(call(r, route, [1, 2, 3]))
    expect([...first.output]).toEqual([7, 8])
    expect(first.workers).toHaveLength(1)
    const worker = first.workers[0]!
    expect(route.worker).toBe(worker)
    // The next call extends the first one's sequence (prompt ++ output): a delta.
    const second = await run(call(r, route, [1, 2, 3, 7, 8, 4, 5]))
    expect(second.workers).toEqual([worker])
    const [g1, g2] = f.generates()
    expect(g1!.payload.base).toBeNull()
    expect([...g1!.payload.prompt]).toEqual([1, 2, 3])
    expect(g2!.payload.base).toEqual({ length: 5, digest: digestOf(Int32Array.from([1, 2, 3, 7, 8])), request: g1!.payload.request })
    expect([...g2!.payload.prompt]).toEqual([4, 5])
    expect(second.fullResends).toBe(0)
    expect(second.promptTokens).toBe(7)
  })

  it("spreads new executions over the least loaded workers", async () => {
    const f = fakes(["rollout-worker/a", "rollout-worker/b"])
    const r = router(f)
    const a = await run(call(r, newRoute(), [1]))
    const b = await run(call(r, newRoute(), [1]))
    // The first route stays on its worker: the second execution goes to the other one.
    expect(new Set([...a.workers, ...b.workers])).toEqual(new Set(["rollout-worker/a", "rollout-worker/b"]))
  })

  it("answers a CacheMiss by sending the whole prompt at once, counted as a full resend", async () => {
    const f = fakes(["rollout-worker/a"], { "rollout-worker/a": [() => Effect.succeed(result("rollout-worker/a", [9])), () => Effect.fail(new CacheMiss({ execution: "x1", reason: "evicted" }))] })
    const r = router(f)
    const route = newRoute()
    await run(call(r, route, [1, 2]))
    const out = await run(call(r, route, [1, 2, 9, 3]))
    const gens = f.generates()
    expect(gens).toHaveLength(3)
    expect(gens[1]!.payload.base?.length).toBe(3)
    expect(gens[2]!.payload.base).toBeNull()
    expect([...gens[2]!.payload.prompt]).toEqual([1, 2, 9, 3])
    expect(out.fullResends).toBe(1)
    expect([...out.output]).toEqual([7, 8])
  })

  it("retries a call another worker failed, with the same request on the next one, and moves the route", async () => {
    const f = fakes(["rollout-worker/a", "rollout-worker/b"], {
      "rollout-worker/a": [() => Effect.fail(new WorkerUnavailable({ worker: "rollout-worker/a", reason: "draining" }))],
      "rollout-worker/b": [() => Effect.fail(new AskTimeout({ actor: "rollout-worker/b", request: "Generate", timeoutMs: 1 }))]
    })
    const r = router(f)
    const route = newRoute()
    route.worker = "rollout-worker/a"
    const out = await run(call(r, route, [1, 2]))
    // a refused, b timed out (and is asked to cancel), a answers the third attempt.
    expect(out.workers).toEqual(["rollout-worker/a", "rollout-worker/b", "rollout-worker/a"])
    expect([...out.output]).toEqual([7, 8])
    expect(route.worker).toBe("rollout-worker/a")
    await Effect.runPromise(Effect.sleep("20 millis"))
    expect(f.asked.filter((a) => a.tag === "Cancel").map((a) => a.worker)).toEqual(["rollout-worker/b"])
    expect(route.servedBy).toEqual(new Set(["rollout-worker/a"]))
  })

  it("gives up with a 503 after maxAttempts failed attempts", async () => {
    const fail = () => Effect.fail(new WorkerUnavailable({ worker: "w", reason: "full" }))
    const f = fakes(["rollout-worker/a", "rollout-worker/b"], { "rollout-worker/a": [fail, fail], "rollout-worker/b": [fail, fail] })
    const error = await failure(call(router(f), newRoute(), [1]))
    expect(error).toMatchObject({ status: 503, code: "worker_unavailable" })
    expect(f.generates()).toHaveLength(3)
  })

  it("answers 503 when no worker appears within workerWaitMs", async () => {
    const f = fakes([])
    const started = performance.now()
    const error = await failure(call(router(f), newRoute(), [1]))
    expect(error).toMatchObject({ status: 503, code: "no_worker_available" })
    expect(performance.now() - started).toBeGreaterThanOrEqual(140)
  })

  it("turns ContextTooLong into a 400 naming the KV pool and its flag", async () => {
    const f = fakes(["rollout-worker/a"], { "rollout-worker/a": [() => Effect.fail(new ContextTooLong({ tokens: 5000, limit: 4096, bound: "kv-pool" }))] })
    const error = await failure(call(router(f), newRoute(), [1]))
    expect(error).toMatchObject({ status: 400, code: "context_length_exceeded", param: "messages" })
    expect(error.message).toContain("4096")
    expect(error.message).toContain("--kv-blocks")
    expect(error.message).toContain("256 blocks")
  })

  it("continues a generation paused by a role switch on the device its context moved to, with nothing prefilled again", async () => {
    const f = fakes(["device/a", "device/b"], {
      "device/a": [() => Effect.succeed(result("device/a", [5, 6], { finishReason: "cancelled", movedTo: "device/b", cachedTokens: 2 }))],
      "device/b": [() => Effect.succeed(result("device/b", [7], { reprefillTokens: 1 }))]
    })
    const r = router(f)
    const route = newRoute()
    route.worker = "device/a"
    const out = await run(call(r, route, [1, 2, 3], 10))
    expect(out.workers).toEqual(["device/a", "device/b"])
    expect([...out.output]).toEqual([5, 6, 7])
    expect([...out.versions]).toEqual([2, 2, 2])
    expect(out.finishReason).toBe("stop")
    expect(out.cachedTokens).toBe(2)
    expect(out.reprefillTokens).toBe(1)
    expect(out.computeMs).toBe(2)
    const [first, moved] = f.generates()
    // On b: base = a's whole sequence under a's request id, no new tokens, the remaining budget, the same seed.
    expect(moved!.payload.base).toEqual({ length: 5, digest: digestOf(Int32Array.from([1, 2, 3, 5, 6])), request: first!.payload.request })
    expect([...moved!.payload.prompt]).toEqual([])
    expect(moved!.payload.sampling).toMatchObject({ maxTokens: 8, seed: 3 })
    expect(route.worker).toBe("device/b")
  })

  it("moves a route's remembered sequences between calls (ContextsMoved) only from the route's worker", async () => {
    const f = fakes(["device/a", "device/b"])
    const r = router(f)
    const route = newRoute()
    route.worker = "device/a"
    await run(call(r, route, [1, 2]))
    const request = f.generates()[0]!.payload.request as string
    expect(r.contextsMoved(route, "device/b", "device/a", new Set([request]))).toBe(false)
    expect(r.contextsMoved(route, "device/a", "device/b", new Set([request]))).toBe(true)
    expect(route.worker).toBe("device/b")
    await run(call(r, route, [1, 2, 7, 8, 9]))
    const next = f.generates()[1]!
    expect(next.worker).toBe("device/b")
    expect(next.payload.base?.length).toBe(4)
  })

  it("releases an execution on every worker that served it", async () => {
    const f = fakes(["rollout-worker/a", "rollout-worker/b"], { "rollout-worker/a": [() => Effect.fail(new WorkerUnavailable({ worker: "a", reason: "x" }))] })
    const r = router(f)
    const route = newRoute()
    route.worker = "rollout-worker/a"
    await run(call(r, route, [1]))
    route.servedBy.add("rollout-worker/a")
    await Effect.runPromise(r.release("x1", route))
    const released = f.asked.filter((a) => a.tag === "Release")
    expect(released.map((a) => a.worker).sort()).toEqual(["rollout-worker/a", "rollout-worker/b"])
    expect(released.every((a) => a.payload.execution === "x1")).toBe(true)
    expect(route.worker).toBeUndefined()
  })
})
