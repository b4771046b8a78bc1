/**
 * A device's role switch over fakes (a batcher that records what it is asked, a scripted `ask`):
 * the order of a switch's steps, the state and load it reports, the answers it holds back, what
 * it counts as lost, and its refusals. No NATS and no engine: the KV hand-off itself (contexts
 * through the object store) is covered end to end (test/elastic/switch.test.ts).
 */
import type { ObjectStore } from "@nats-io/obj"
import { Deferred, Effect, Fiber } from "effect"
import { describe, expect, it } from "vitest"
import { WeightsUnavailable, WorkerUnavailable, type GenerateResult } from "../../src/protocols/rollout.ts"
import type { MessageMeta } from "../../src/runtime/actor.ts"
import { formatAddress } from "../../src/runtime/names.ts"
import { parseAddress } from "../../src/runtime/names.ts"
import { refOf, type ActorSystemShape } from "../../src/runtime/system.ts"
import { GatewayProtocol } from "../../src/protocols/gateway.ts"
import { RoleSwitch, type RoleState } from "../../src/serving/role-switch.ts"
import type { RolloutRole } from "../../src/serving/rollout-role.ts"
import type { TrainingRole } from "../../src/serving/training-role.ts"

const meta: MessageMeta = { via: "ask", msgId: "m", seq: 0, deliveryCount: 1, sender: undefined, senderIncarnation: undefined }

const answer = (finishReason: GenerateResult["finishReason"]): GenerateResult => ({
  output: Int32Array.from([1]),
  logprobs: Float32Array.from([-1]),
  versions: Int32Array.from([0]),
  finishReason,
  promptTokens: 1,
  cachedTokens: 0,
  reprefillTokens: 0,
  computeMs: 0,
  workerMs: 0,
  worker: "device/a"
})

interface Setup {
  /** Completed to let the destinations' `Status` asks answer (they fail: no destination serves). */
  readonly statusGate?: Deferred.Deferred<void>
  readonly generate?: () => Effect.Effect<GenerateResult, WorkerUnavailable>
  readonly loadWeights?: (version: number) => Effect.Effect<void, WeightsUnavailable>
  readonly training?: boolean
}

const setup = (o: Setup = {}) => {
  const log: Array<string> = []
  const reports: Array<RoleState> = []
  const state: RoleState = { role: "rollout", switching: false }
  const paused = Deferred.makeUnsafe<void>()
  const executions = new Set(["x1", "x2"])
  const batcher = {
    pause: Effect.sync(() => {
      log.push("pause")
      Deferred.doneUnsafe(paused, Effect.void)
      return [{ request: "r1", execution: "x1" }]
    }),
    executions: () => [...executions],
    exportContext: (execution: string, request?: string) =>
      Effect.sync(() => {
        log.push(`export ${execution}${request === undefined ? "" : ` ${request}`}`)
        // x1's latest context is the paused generation's; x2 has a context of 48 tokens between calls.
        return execution === "x1" ? { request: "r1", tokens: new Int32Array(40), kvLength: 40, buffer: new Uint8Array(8) } : { request: "r2", tokens: new Int32Array(48), kvLength: 48, buffer: new Uint8Array(8) }
      }),
    release: (execution: string) => Effect.sync(() => void log.push(`release ${execution}`)),
    unpinContext: (execution: string) => Effect.sync(() => void log.push(`unpin ${execution}`)),
    resume: () => void log.push("resume")
  }
  const rollout = {
    batcher,
    handlers: { Generate: () => (o.generate ?? (() => Effect.succeed(answer("stop"))))() },
    loadWeights: (version: number) => (o.loadWeights ?? (() => Effect.void))(version).pipe(Effect.tap(() => Effect.sync(() => void log.push(`load ${version}`))))
  } as unknown as RolloutRole
  const training: TrainingRole | undefined =
    o.training === false ? undefined : ({ handlers: {}, leave: Effect.sync(() => void log.push("leave training")), step: () => -1 } as unknown as TrainingRole)
  const asked: Array<{ to: string; tag: string; payload: any }> = []
  const ask = (ref: { address: { kind: string; id: string } }, tag: string, payload: any) =>
    Effect.suspend(() => {
      asked.push({ to: formatAddress(ref.address), tag, payload })
      if (tag === "Status") return (o.statusGate === undefined ? Effect.void : Deferred.await(o.statusGate)).pipe(Effect.andThen(Effect.fail(new Error("unreachable"))))
      return Effect.succeed({})
    })
  const system = { run: "run-1", ask } as unknown as ActorSystemShape
  const make = RoleSwitch.make({
    system,
    self: "device/a",
    gateway: refOf(GatewayProtocol, parseAddress("gateway/main")),
    rollout,
    training,
    state,
    blockTokens: 16,
    store: {} as ObjectStore,
    report: () => void reports.push({ ...state })
  })
  return { log, reports, state, asked, paused, make }
}

describe("role switch", () => {
  it("answers a switch to the role the device is in at once, with zero figures and nothing done", async () => {
    const s = setup()
    const result = await Effect.runPromise(Effect.flatMap(s.make, (roles) => roles.switchRole({ role: "rollout", destinations: [] }, meta)))
    expect(result).toMatchObject({ role: "rollout", generationsMoved: 0, contextsMoved: 0, bytesMoved: 0, reprefillTokens: 0, controlMs: 0 })
    expect(s.log).toEqual([])
    expect(s.reports).toEqual([])
  })

  it("leaving rollout with no destination left: pauses, exports, frees everything, counts every context's tokens as lost", async () => {
    const s = setup()
    const result = await Effect.runPromise(Effect.flatMap(s.make, (roles) => roles.switchRole({ role: "training", destinations: ["device/a", "device/b"] }, meta)))
    expect(result.role).toBe("training")
    expect(result).toMatchObject({ generationsMoved: 0, contextsMoved: 0, bytesMoved: 0, reprefillTokens: 40 + 48 })
    expect(s.log).toEqual(["pause", "export x1", "export x2", "release x1", "release x2", "unpin x1", "unpin x2"])
    // Its own key is not a destination: only b was asked.
    expect(s.asked.filter((a) => a.tag === "Status").map((a) => a.to)).toEqual(["device/b"])
    expect(s.asked.filter((a) => a.tag === "ContextsMoved")).toEqual([])
    // Reported switching from the start, not switching at the end; in the training role.
    expect(s.reports[0]).toEqual({ role: "training", switching: true })
    expect(s.reports.at(-1)).toEqual({ role: "training", switching: false })
    expect(s.state).toEqual({ role: "training", switching: false })
  })

  it("holds a paused generation's answer and a refusal until the hand-off ends", async () => {
    const statusGate = Deferred.makeUnsafe<void>()
    let calls = 0
    const s = setup({
      statusGate,
      generate: () => (++calls === 1 ? Effect.succeed(answer("cancelled")) : Effect.fail(new WorkerUnavailable({ worker: "device/a", reason: "draining" })))
    })
    await Effect.runPromise(
      Effect.gen(function* () {
        const roles = yield* s.make
        const request = { execution: "x1", request: "r1", base: null, prompt: new Int32Array(0), sampling: { maxTokens: 4, temperature: 1, topP: 1, seed: null, stop: [] }, stream: false }
        // Before any switch: answered as the rollout role answers.
        const before = yield* roles.generate(request, meta)
        expect(before.finishReason).toBe("cancelled")
        calls = 0
        const switching = yield* Effect.forkChild(roles.switchRole({ role: "training", destinations: ["device/b"] }, meta))
        yield* Deferred.await(s.paused)
        const held = yield* Effect.forkChild(roles.generate(request, meta))
        const refused = yield* Effect.forkChild(Effect.flip(roles.generate({ ...request, request: "r9" }, meta)))
        yield* Effect.sleep("30 millis")
        expect(held.pollUnsafe()).toBeUndefined()
        expect(refused.pollUnsafe()).toBeUndefined()
        yield* Deferred.succeed(statusGate, undefined)
        const answered = yield* Fiber.join(held)
        // Its context went nowhere: no `movedTo`.
        expect(answered.finishReason).toBe("cancelled")
        expect(answered.movedTo).toBeUndefined()
        expect((yield* Fiber.join(refused))._tag).toBe("WorkerUnavailable")
        expect((yield* Fiber.join(switching)).reprefillTokens).toBe(88)
      })
    )
  })

  it("joining rollout: leaves the training role, loads the version, resumes admitting", async () => {
    const s = setup()
    s.state.role = "training"
    const result = await Effect.runPromise(Effect.flatMap(s.make, (roles) => roles.switchRole({ role: "rollout", destinations: [], version: 3 }, meta)))
    expect(result.role).toBe("rollout")
    expect(s.log).toEqual(["leave training", "load 3", "resume"])
    expect(s.state).toEqual({ role: "rollout", switching: false })
    expect(s.reports[0]).toEqual({ role: "rollout", switching: true })
  })

  it("joining rollout without its weights: refused, back in the training role, not admitting", async () => {
    const s = setup({ loadWeights: (version) => Effect.fail(new WeightsUnavailable({ version, reason: "not published" })) })
    s.state.role = "training"
    const error = await Effect.runPromise(Effect.flip(Effect.flatMap(s.make, (roles) => roles.switchRole({ role: "rollout", destinations: [], version: 4 }, meta))))
    expect(error._tag).toBe("DeviceRefused")
    expect(error.reason).toContain("version 4")
    expect(error.reason).toContain("not published")
    expect(s.log).toEqual(["leave training"])
    expect(s.state).toEqual({ role: "training", switching: false })
  })

  it("imports contexts only while serving rollouts and not switching", async () => {
    const s = setup()
    const contexts = [{ execution: "x1", request: "r1", object: "h.1", length: 4, kvLength: 4, inFlight: false }]
    const roles = await Effect.runPromise(s.make)
    s.state.role = "training"
    expect(await Effect.runPromise(roles.importContexts({ from: "device/b", contexts }, meta))).toEqual({ imported: 0, failed: ["r1"] })
    s.state.role = "rollout"
    s.state.switching = true
    expect(await Effect.runPromise(roles.importContexts({ from: "device/b", contexts }, meta))).toEqual({ imported: 0, failed: ["r1"] })
  })
})
