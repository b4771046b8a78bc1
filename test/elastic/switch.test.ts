/**
 * The harness-preserving role switch on the CPU engine (tiny preset), real NATS and real HTTP
 * through the `openai` client: a device leaves rollout for training while two executions are
 * generating (one streaming) and two sit between calls; every client call succeeds, each
 * paused generation continues on the destination from its exact position and each cached
 * context moves, so the engine runs exactly as many tokens as an unmoved run (nothing is
 * prefilled again), every call's usage (prompt and cached tokens) equals the unmoved run's,
 * and the recorded tokens equal the unmoved run's (temperature 0.9, fixed seeds). Once with
 * both devices in this process, once between two `gyre node` processes (the KV hand-off goes
 * over NATS either way), and between two processes again with F16 KV storage (GYRE_KV_DTYPE=f16:
 * the same guarantees against an unmoved F16 run, about half the bytes). Then the way back: a device without a training role refuses step
 * requests, and `SwitchRole` to rollout loads a version's weights and admits again; a
 * training role given to the device gets the step requests and is left on the way back.
 */
import { Objm } from "@nats-io/obj"
import { Deferred, Duration, Effect, Fiber, Layer, Logger } from "effect"
import OpenAI from "openai"
import { afterEach, describe, expect, it } from "vitest"
import { device, type DeviceConfig } from "../../src/actors/device.ts"
import { gateway } from "../../src/actors/gateway.ts"
import type { KvDtype } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { DeviceProtocol, type SwitchResult } from "../../src/protocols/device.ts"
import { rlLayout } from "../../src/protocols/layout.ts"
import { apiKeyDigest } from "../../src/protocols/gateway.ts"
import { parseAddress } from "../../src/runtime/names.ts"
import { nodeRef, startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import type { TrainingRole } from "../../src/serving/training-role.ts"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import type { ExecutionOutcome } from "../../src/tree/outcome.ts"
import { startNodeProcess, withSystem, type NodeProcess } from "../runtime/harness.ts"
import { gatewayRef, readRecords, tempDir, writeCheckpoint } from "../rollout/fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-switch-"), 31)
const deviceConfig: DeviceConfig = { checkpoint, numBlocks: 1024, maxBatch: 8 }
const promise = <A>(f: () => Promise<A>) => Effect.promise(f)
const deviceRef = (key: string) => refOf(DeviceProtocol, parseAddress(key))
const quiet = <A, E, R>(effect: Effect.Effect<A, E, R>) => effect.pipe(Effect.provide(Layer.merge(Engine.layer, Logger.layer([]))))

/** Executions x0 and x1 are generating at the switch (x0 streams); x2 and x3 are between calls. */
const EXECUTIONS = ["x0", "x1", "x2", "x3"] as const
const LONG = 360
const keyOf = (execution: string) => `key-${execution}-0123456789abcdef`

type Message = OpenAI.Chat.Completions.ChatCompletionMessageParam

interface CallSeen {
  readonly promptTokens: number
  readonly cachedTokens: number
  readonly completionTokens: number
  readonly finish: string
  readonly text: string
}

/** A chat call, streamed or not; `onChunk` is called with the number of content chunks so far. */
const chat = (client: OpenAI, messages: ReadonlyArray<Message>, seed: number, maxTokens: number, stream: boolean, onChunk?: (n: number) => void) =>
  promise(async (): Promise<CallSeen> => {
    const params = { model: "gyre", messages: [...messages], max_tokens: maxTokens, seed, temperature: 0.9, ignore_eos: maxTokens === LONG }
    if (!stream) {
      const r = await client.chat.completions.create(params as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
      const usage = r.usage!
      return {
        promptTokens: usage.prompt_tokens,
        cachedTokens: usage.prompt_tokens_details!.cached_tokens!,
        completionTokens: usage.completion_tokens,
        finish: r.choices[0]!.finish_reason,
        text: r.choices[0]!.message.content ?? ""
      }
    }
    const s = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } } as OpenAI.Chat.ChatCompletionCreateParamsStreaming)
    let text = ""
    let finish = ""
    let chunks = 0
    let usage: OpenAI.CompletionUsage | undefined
    for await (const c of s) {
      const choice = c.choices[0]
      if (choice?.delta.content) {
        text += choice.delta.content
        onChunk?.(++chunks)
      }
      if (choice?.finish_reason) finish = choice.finish_reason
      if (c.usage) usage = c.usage
    }
    return { promptTokens: usage!.prompt_tokens, cachedTokens: usage!.prompt_tokens_details!.cached_tokens!, completionTokens: usage!.completion_tokens, finish, text }
  })

interface Hosting {
  readonly baseUrl: string
  /** The device every execution starts on. */
  readonly source: string
  readonly destination: string
  /** Every device that may serve (their engine figures are summed). */
  readonly devices: ReadonlyArray<string>
  /** Starts the destination device (after the first calls, so every context is on the source). */
  readonly addDestination: Effect.Effect<void, unknown, ActorSystem>
}

interface Outcome {
  readonly calls: Record<string, ReadonlyArray<CallSeen>>
  /** Output tokens of each execution's calls, from the trajectory records. */
  readonly outputs: Record<string, ReadonlyArray<ReadonlyArray<number>>>
  /** Tokens the engine ran over all devices (prefill and decode). */
  readonly processed: number
  readonly switched: SwitchResult | undefined
  readonly errors: number
}

const waitReady = (key: string) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const deadline = Date.now() + 30_000
    while (Date.now() < deadline) {
      const ok = yield* system.ask(deviceRef(key), "Status", undefined, { timeoutMs: 1000 }).pipe(
        Effect.as(true),
        Effect.catch(() => Effect.succeed(false))
      )
      if (ok) return yield* Effect.sleep(Duration.millis(600)) // the gateway sees its registry entry
      yield* Effect.sleep(Duration.millis(100))
    }
    return yield* Effect.die(new Error(`${key} did not start`))
  })

/**
 * Three calls per execution: a short first call on the source; then x0, x1 start a long call,
 * and once x0 has streamed a few chunks `during` runs (the switch, or nothing), then x2, x3 make
 * their second call; last, every execution makes a third call.
 */
const workload = (hosting: Hosting, during: Effect.Effect<SwitchResult | undefined, unknown, ActorSystem>) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    for (const x of EXECUTIONS) yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(keyOf(x)), task: "t", execution: x, defaultRole: "main" })
    const clients = Object.fromEntries(EXECUTIONS.map((x) => [x, new OpenAI({ baseURL: hosting.baseUrl, apiKey: keyOf(x), maxRetries: 0, timeout: 60_000 })]))
    const history: Record<string, Array<Message>> = Object.fromEntries(EXECUTIONS.map((x, i) => [x, [{ role: "user", content: `Task ${i}: begin.` }]]))
    const calls: Record<string, Array<CallSeen>> = Object.fromEntries(EXECUTIONS.map((x) => [x, []]))
    const turn = (x: string, n: number, maxTokens: number, stream = false, onChunk?: (n: number) => void) =>
      chat(clients[x]!, history[x]!, 100 * n + EXECUTIONS.indexOf(x as never), maxTokens, stream, onChunk).pipe(
        Effect.tap((seen) =>
          Effect.sync(() => {
            calls[x]!.push(seen)
            history[x]!.push({ role: "assistant", content: seen.text }, { role: "user", content: `Step ${n + 1}.` })
          })
        )
      )
    yield* Effect.forEach(EXECUTIONS, (x) => turn(x, 1, 12), { concurrency: "unbounded", discard: true })
    yield* hosting.addDestination
    const streaming = yield* Deferred.make<void>()
    const long = yield* Effect.forkChild(
      Effect.all([turn("x0", 2, LONG, true, (n) => n === 6 && Deferred.doneUnsafe(streaming, Effect.void)), turn("x1", 2, LONG)], { concurrency: "unbounded" })
    )
    yield* Deferred.await(streaming)
    const switched = yield* during
    yield* Effect.forEach(["x2", "x3"], (x) => turn(x, 2, 12), { concurrency: "unbounded", discard: true })
    yield* Fiber.join(long)
    yield* Effect.forEach(EXECUTIONS, (x) => turn(x, 3, 10), { concurrency: "unbounded", discard: true })
    const outputs: Record<string, Array<Array<number>>> = {}
    for (const x of EXECUTIONS) {
      const records = yield* readRecords(x, 3)
      const decoder = new DeltaDecoder(x)
      for (const r of records) decoder.add(r)
      const tree = decoder.tree
      outputs[x] = records.map((r) => {
        const at = tree.callIndex(r.callId)!
        return Array.from(tree.callSequence(at).subarray(tree.call(at).promptLength))
      })
    }
    const loads = yield* Effect.forEach(hosting.devices, (k) => system.ask(deviceRef(k), "Status", undefined))
    const status = yield* system.ask(gatewayRef, "Status", undefined)
    return { calls, outputs, processed: loads.reduce((n, l) => n + l.processedTokens, 0), switched, errors: status.errors } satisfies Outcome
  })

/**
 * A node in this process hosting the gateway and device `<name>.0`; `addDestination` spawns
 * `<name>.1` and, with `decoy`, `<name>.2`: a rollout device that is not a destination, where
 * a call that lost its moved context would land (the least loaded).
 */
const hostHere = (name: string, config: DeviceConfig = deviceConfig, decoy = false) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const node = yield* startNode({ name, types: [device(config), gateway()], heartbeatMs: 200 })
    yield* node.spawn("gateway", "main")
    yield* node.spawn("device", `${name}.0`)
    yield* waitReady(`device/${name}.0`)
    const { baseUrl } = yield* system.ask(gatewayRef, "Status", undefined)
    return {
      node,
      hosting: {
        baseUrl,
        source: `device/${name}.0`,
        destination: `device/${name}.1`,
        devices: (decoy ? [0, 1, 2] : [0, 1]).map((i) => `device/${name}.${i}`),
        addDestination: Effect.forEach(decoy ? [1, 2] : [1], (i) => node.spawn("device", `${name}.${i}`).pipe(Effect.andThen(waitReady(`device/${name}.${i}`))), {
          discard: true
        })
      } satisfies Hosting
    }
  })

const switchOut = (hosting: Hosting) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    return yield* system.ask(deviceRef(hosting.source), "SwitchRole", { role: "training", destinations: [hosting.destination] }, { timeoutMs: 30_000 })
  })

/** Once per key: a run shared by the tests that compare with it. */
const once = <A>(run: (key: KvDtype) => Promise<A>) => {
  const runs = new Map<KvDtype, Promise<A>>()
  return (key: KvDtype) => runs.get(key) ?? runs.set(key, run(key)).get(key)!
}

/** The unmoved run: one device, no switch, its KV cache storing `kvDtype`. */
const reference = once((kvDtype) =>
  withSystem(
    `sw-ref-${kvDtype}`,
    quiet(
      Effect.gen(function* () {
        const { hosting } = yield* hostHere("r", { ...deviceConfig, kvDtype })
        return yield* workload({ ...hosting, destination: hosting.source, devices: [hosting.source], addDestination: Effect.void }, Effect.succeed(undefined))
      })
    )
  )
)

/** The switch between two `gyre node` processes (devices configured from the environment: GYRE_KV_DTYPE). */
const overNats = once((kvDtype) =>
  withSystem(
    `sw-nodes-${kvDtype}`,
    quiet(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const env = { GYRE_CHECKPOINT: checkpoint, GYRE_KV_BLOCKS: "1024", GYRE_MAX_BATCH: "8", GYRE_KV_DTYPE: kvDtype }
        const args = (name: string) => ["--name", name, "--run", `sw-nodes-${kvDtype}`, "--load", "src/actors/device.ts", "--heartbeat-ms", "200"]
        const pa = startNodeProcess(system.nats.servers, [...args("pa"), "--spawn", "device/pa.0"], env)
        const pb = startNodeProcess(system.nats.servers, args("pb"), env)
        started.push(pa, pb)
        yield* promise(() => Promise.all([pa.waitFor("ready"), pb.waitFor("ready")]))
        const node = yield* startNode({ name: "gw", types: [gateway()], heartbeatMs: 200 })
        yield* node.spawn("gateway", "main")
        yield* waitReady("device/pa.0")
        const { baseUrl } = yield* system.ask(gatewayRef, "Status", undefined)
        const hosting: Hosting = {
          baseUrl,
          source: "device/pa.0",
          destination: "device/pb.0",
          devices: ["device/pa.0", "device/pb.0"],
          addDestination: system.ask(nodeRef("pb"), "Spawn", { kind: "device", id: "pb.0" }).pipe(Effect.andThen(waitReady("device/pb.0")))
        }
        return yield* workload(hosting, switchOut(hosting))
      })
    )
  )
)

const expectSameAsReference = (moved: Outcome, unmoved: Outcome) => {
  expect(moved.errors).toBe(0)
  for (const x of EXECUTIONS) {
    expect(moved.outputs[x]).toEqual(unmoved.outputs[x])
    expect(moved.calls[x]).toEqual(unmoved.calls[x])
  }
  // x0 and x1 were generating when the switch came: they ran to their full length
  expect(moved.calls.x0![1]!.completionTokens).toBe(LONG)
  expect(moved.calls.x1![1]!.completionTokens).toBe(LONG)
  // every call after the first prefilled only its new suffix, on whichever device
  for (const x of EXECUTIONS) for (const c of moved.calls[x]!.slice(1)) expect(c.cachedTokens).toBeGreaterThan(0)
  // nothing was computed twice: the engine ran exactly the unmoved run's tokens
  expect(moved.processed).toBe(unmoved.processed)
  const s = moved.switched!
  expect(s.role).toBe("training")
  expect(s.generationsMoved).toBe(2)
  expect(s.contextsMoved).toBe(2)
  expect(s.reprefillTokens).toBe(0)
  expect(s.bytesMoved).toBeGreaterThan(0)
  expect(s.controlMs).toBeLessThanOrEqual(s.ms)
}

const started: Array<NodeProcess> = []
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

describe("role switch (device actors)", () => {
  it("moves in-flight generations and cached contexts to the destination in one process: same tokens, same usage, nothing prefilled again", async () => {
    const unmoved = await reference("f32")
    const moved = await withSystem(
      "sw-local",
      quiet(
        Effect.gen(function* () {
          const { hosting } = yield* hostHere("a", deviceConfig, true)
          const outcome = yield* workload(hosting, switchOut(hosting))
          const system = yield* ActorSystem
          const load = yield* system.ask(deviceRef(hosting.source), "Status", undefined)
          return { ...outcome, sourceLoad: load }
        })
      )
    )
    expectSameAsReference(moved, unmoved)
    expect(moved.sourceLoad.draining).toBe(true)
    expect(moved.sourceLoad.cachedExecutions).toBe(0)
    console.log(`switch (one process): ${JSON.stringify(moved.switched)}`)
  })

  it("moves them between two gyre node processes over NATS", async () => {
    const moved = await overNats("f32")
    expectSameAsReference(moved, await reference("f32"))
    console.log(`switch (two processes): ${JSON.stringify(moved.switched)}`)
  })

  it("does the same with F16 KV storage (GYRE_KV_DTYPE=f16), moving half the bytes", async () => {
    const moved = await overNats("f16")
    expectSameAsReference(moved, await reference("f16"))
    const wide = (await overNats("f32")).switched!
    // contexts of about the same lengths at 2 bytes an element instead of 4 (the runs' tokens, and so
    // their contexts' lengths, differ a little: F16 rounds K and V); measured 0.565
    expect(moved.switched!.bytesMoved).toBeLessThan(0.7 * wide.bytesMoved)
    expect(moved.switched!.bytesMoved).toBeGreaterThan(0.35 * wide.bytesMoved)
    console.log(`switch (two processes, F16 KV): ${JSON.stringify(moved.switched)}`)
  })

  it("back to rollout: refuses step requests without a training role, loads the version's weights and admits again", async () => {
    const out = await withSystem(
      "sw-back",
      quiet(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const { hosting } = yield* hostHere("b")
          const names = rlLayout(system.run)
          const weights = yield* otherWeights
          yield* promise(async () => {
            const store = await new Objm(system.nats.nc).create(names.weightsBucket)
            await store.putBlob({ name: names.weightsObject(4) }, weights)
          })
          const ref = deviceRef(hosting.source)
          const out = yield* system.ask(ref, "SwitchRole", { role: "training", destinations: [] })
          const again = yield* system.ask(ref, "SwitchRole", { role: "training", destinations: [] })
          const noRole = yield* Effect.flip(system.ask(ref, "StartStep", { step: 0, attempt: 0, version: 0, executions: 1, groupSizes: [1], cells: [] }))
          const told = yield* system.ask(ref, "TrainExecution", { step: 0, execution: "e", task: "t", group: 0, tokens: 1, outcome: outcomeOf() })
          const refusedWeights = yield* Effect.flip(system.ask(ref, "LoadWeights", { version: 4 }))
          const back = yield* system.ask(ref, "SwitchRole", { role: "rollout", destinations: [], version: 4 })
          const load = yield* system.ask(ref, "Status", undefined)
          const client = new OpenAI({ baseURL: hosting.baseUrl, apiKey: keyOf("y"), maxRetries: 0 })
          yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(keyOf("y")), task: "t", execution: "y", defaultRole: "main" })
          yield* Effect.sleep(Duration.millis(500)) // the gateway sees the device in rollout again
          const call = yield* chat(client, [{ role: "user", content: "Hello again." }], 1, 8, false)
          return { out, again, noRole, told, refusedWeights, back, load, call }
        })
      )
    )
    expect(out.out).toMatchObject({ role: "training", generationsMoved: 0, contextsMoved: 0, reprefillTokens: 0 })
    expect(out.again).toMatchObject({ role: "training", generationsMoved: 0 })
    expect(out.noRole).toMatchObject({ _tag: "DeviceRefused", reason: expect.stringMatching(/no training role/) })
    expect(out.told.queued).toBe(false)
    expect(out.refusedWeights._tag).toBe("WeightsUnavailable")
    expect(out.back.role).toBe("rollout")
    expect(out.load).toMatchObject({ version: 4, draining: false })
    expect(out.call.completionTokens).toBeGreaterThan(0)
  })

  it("delegates step requests to its training role while training and leaves it on the way back", async () => {
    const log: Array<string> = []
    const training: DeviceConfig["training"] = (resources) =>
      Effect.succeed({
        handlers: {
          StartStep: (plan) => Effect.sync(() => (log.push(`start ${plan.step} on ${resources.ctx.address.id} v${resources.version()}`), { started: true })),
          JoinStep: ({ step }) => Effect.sync(() => (log.push(`join ${step}`), { joined: true })),
          TrainExecution: ({ execution }) => Effect.sync(() => (log.push(`execution ${execution}`), { queued: true })),
          GradientReady: ({ index }) => Effect.sync(() => (log.push(`gradient ${index}`), { accepted: true }))
        },
        leave: Effect.sleep(Duration.millis(50)).pipe(Effect.andThen(Effect.sync(() => log.push("left")))),
        step: () => 0
      } satisfies TrainingRole)
    const out = await withSystem(
      "sw-train",
      quiet(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const { hosting } = yield* hostHere("c", { ...deviceConfig, training })
          const ref = deviceRef(hosting.source)
          const inRollout = yield* Effect.flip(system.ask(ref, "JoinStep", { step: 0, attempt: 0, version: 0, core: hosting.source }))
          yield* system.ask(ref, "SwitchRole", { role: "training", destinations: [] })
          const load = yield* system.ask(ref, "Status", undefined)
          const started = yield* system.ask(ref, "StartStep", { step: 0, attempt: 0, version: 0, executions: 1, groupSizes: [1], cells: [] })
          yield* system.ask(ref, "TrainExecution", { step: 0, execution: "e1", task: "t", group: 0, tokens: 3, outcome: outcomeOf() })
          const back = yield* system.ask(ref, "SwitchRole", { role: "rollout", destinations: [] })
          const after = yield* Effect.flip(system.ask(ref, "JoinStep", { step: 0, attempt: 0, version: 0, core: hosting.source }))
          return { inRollout, load, started, back, after }
        })
      )
    )
    expect(out.inRollout).toMatchObject({ _tag: "DeviceRefused", reason: expect.stringMatching(/in the rollout role/) })
    expect(out.load.draining).toBe(true)
    expect(out.started.started).toBe(true)
    expect(log).toEqual(["start 0 on c.0 v0", "execution e1", "left"])
    expect(out.back.controlMs).toBeGreaterThanOrEqual(40)
    expect(out.after._tag).toBe("DeviceRefused")
  })
})

/** The safetensors of another tiny model: the weights of "policy version 4". */
const otherWeights = Effect.promise(() =>
  Effect.runPromise(
    Effect.gen(function* () {
      const model = yield* (yield* Engine).createModel(presets.tiny, { seed: 77, initStd: 0.2 })
      return yield* model.save()
    }).pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([])))))
  )
)

const outcomeOf = (): ExecutionOutcome => ({ run: "r", task: "t", execution: "e", ended: "finished", evaluation: "scored", score: 1, attempts: 1, detail: "" })
