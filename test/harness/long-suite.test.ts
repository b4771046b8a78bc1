/**
 * The long suite at 1/16 scale through the real rollout path: a harness runner runs the
 * harness as a child process, which talks HTTP to the gateway, which serves it from a rollout
 * worker (tiny preset, random weights) and records every call on a real nats-server. The
 * tree rebuilt from the trajectory stream has the script's shape: one call per scripted
 * decision with its role, every call that continues a history starting with the recorded
 * sequence of the call it continues (no spurious branch), a branch for each retry, fork and
 * compaction and no other, compacted histories sharing only the system prompt, and as many
 * distinct tokens as the script's distinct text; the device served the continued contexts from
 * its KV cache; the scorer's per-call rewards are keyed by the recorded calls.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Layer, Logger } from "effect"
import { describe, expect, it } from "vitest"
import { gateway } from "../../src/actors/gateway.ts"
import { makeHarnessRunner } from "../../src/actors/harness-runner.ts"
import { rolloutWorker } from "../../src/actors/rollout-worker.ts"
import { Engine } from "../../src/engine/engine.ts"
import { renderChat } from "../../src/openai/chat.ts"
import { readTrajectories } from "../../src/protocols/trajectories.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import type { TrajectoryTree } from "../../src/tree/tree.ts"
import { configFrom, runScript, systemPromptOf, type LongCall, type LongMessage } from "../../suites/long/world.mjs"
import { writeCheckpoint } from "../rollout/fixtures.ts"
import { withSystem } from "../runtime/harness.ts"
import { request, runnerRef, sharedDir, suitesDir, tempDir } from "./helpers.ts"

const TASK = "train-0"
const ENV = { LONG_SCALE: "1/16" }
const cfg = configFrom(ENV)

interface Planned extends LongCall {
  readonly messages: ReadonlyArray<LongMessage>
  readonly reply: string
}

/** The script's calls (a dry run: each reply is the expected one; the shape is the same whatever the replies). */
const plan = async () => {
  const calls: Array<Planned> = []
  const stats = await runScript(TASK, cfg, async (messages, c) => {
    calls.push({ ...c, messages, reply: c.expected })
    return c.expected
  })
  return { calls, stats }
}

/** Does call `b` continue call `a` (a's messages and its reply, then more)? */
const continues = (a: Planned, b: Planned) =>
  b.messages.length > a.messages.length && a.messages.every((m, i) => b.messages[i] === m) && b.messages[a.messages.length]!.role === "assistant" && b.messages[a.messages.length]!.content === a.reply

const commonPrefix = (a: Int32Array, b: Int32Array) => {
  let i = 0
  while (i < a.length && i < b.length && a[i] === b[i]) i++
  return i
}

const branchPoints = (tree: TrajectoryTree) => {
  let n = 0
  for (let node = 1; node < tree.nodeCount; node++) if (tree.childrenOf(node).length > 1) n++
  return n
}

interface Line {
  readonly id: string
  readonly role: string
  readonly call?: string
  readonly fresh: boolean
  readonly refused?: unknown
  readonly usage?: { readonly prompt: number; readonly cached: number; readonly completion: number }
}

describe("long suite through the gateway and a rollout worker", () => {
  it("records the scripted tree at 1/16 scale: calls, roles, continuations, branches, forks, compactions, distinct tokens", async () => {
    const checkpoint = await writeCheckpoint(tempDir("long-ckpt"), 11)
    const workspaceRoot = sharedDir("long-ws")
    const result = await withSystem(
      "long",
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const node = yield* startNode({
          name: "a",
          types: [
            rolloutWorker({ checkpoint }),
            gateway({ port: 0 }),
            makeHarnessRunner({ suitesDir, gateway: address("gateway", "main"), capacity: 1, evaluationRetries: 1, workspaceRoot })
          ]
        })
        yield* node.spawn("rollout-worker", "a.cpu0")
        yield* node.spawn("gateway", "main")
        yield* node.spawn("harness-runner", "r1")
        const req = request({ suite: "long", task: TASK }, { env: ENV, keepWorkspace: "always" })
        const outcome = yield* system.ask(runnerRef, "RunExecution", req, { timeoutMs: 120_000 })
        const trajectories = yield* readTrajectories(system, new Set([req.execution]))
        return { outcome, trajectory: trajectories.executions.get(req.execution)!, malformed: trajectories.malformed, dir: path.join(workspaceRoot, req.execution) }
      }).pipe(Effect.provide(Layer.merge(Engine.layer, Logger.layer([]))))
    )
    const harnessLog = () => fs.readFileSync(path.join(result.dir, "harness.log"), "utf8").slice(-2000)
    const lines = fs.readFileSync(path.join(result.dir, "workspace", "calls.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Line)
    const { calls, stats } = await plan()

    // The execution: every scripted call answered, none refused, scored with a reward per call.
    expect(lines.filter((l) => l.refused !== undefined), harnessLog()).toEqual([])
    expect(lines.map((l) => [l.id, l.role, l.fresh])).toEqual(calls.map((c) => [c.id, c.role, c.fresh]))
    expect(result.outcome).toMatchObject({ ended: "finished", evaluation: "scored" })
    expect(Object.keys(result.outcome.rewards ?? {}).sort()).toEqual(lines.map((l) => l.call!).sort())
    expect(stats).toMatchObject({ main: cfg.calls, retries: 3, subagents: 2 })
    expect(stats.compactions).toBeGreaterThanOrEqual(1)

    // The recorded tree: one call per scripted call, with its role and the gateway's token counts.
    const { decoder, rejected } = result.trajectory
    expect(result.malformed).toEqual([])
    expect(rejected).toEqual([])
    expect(decoder.pending()).toEqual([])
    const tree = decoder.tree
    expect(tree.callCount).toBe(calls.length)
    const index = new Map(lines.map((l) => [l.id, tree.callIndex(l.call!)!]))
    for (const l of lines) {
      const c = tree.call(index.get(l.id)!)
      expect(c.role).toBe(l.role)
      expect([c.promptLength, c.length - c.promptLength]).toEqual([l.usage!.prompt, cfg.outputTokens])
    }
    const prompt = (id: string) => tree.callSequence(index.get(id)!).subarray(0, tree.call(index.get(id)!).promptLength)
    const sequence = (id: string) => tree.callSequence(index.get(id)!)
    expect(Math.max(...lines.map((l) => l.usage!.prompt))).toBeLessThan(cfg.window)

    // Continuations: the prompt starts with the whole recorded sequence of each call it continues
    // (every call does but the first, the fresh ones after a compaction and maybe a retry).
    const retries = calls.filter((c) => c.role === "main" && c.messages.at(-1)!.content.startsWith(`The last ${cfg.back} changes broke the build`))
    for (const [i, b] of calls.entries()) {
      const earlier = calls.slice(0, i).filter((a) => continues(a, b))
      if (i > 0 && !b.fresh && !retries.includes(b)) expect(earlier.length, `${b.id} continues a call`).toBeGreaterThan(0)
      for (const a of earlier) expect(commonPrefix(sequence(a.id), prompt(b.id)), `${b.id} continues ${a.id}`).toBe(sequence(a.id).length)
    }

    // Retries: the prompt the reverted-to call was sent with, all but its generation prompt, then a new branch.
    expect(retries).toHaveLength(stats.retries)
    for (const r of retries) {
      const earlier = `m${Number(r.id.slice(1)) - cfg.back}`
      expect(commonPrefix(prompt(r.id), sequence(earlier))).toBe(prompt(earlier).length - 1)
    }

    // Compactions: a fresh history shares the system prompt (and at most the summary's fixed head) with every earlier call.
    const systemTokens = renderChat([{ role: "system", content: systemPromptOf(TASK, cfg) }], [], undefined).length - 1
    const fresh = calls.filter((c) => c.fresh && c.id !== "m0")
    expect(fresh).toHaveLength(stats.compactions)
    for (const f of fresh) {
      const shared = Math.max(...calls.slice(0, calls.indexOf(f)).map((a) => commonPrefix(prompt(f.id), sequence(a.id))))
      expect(shared).toBeGreaterThanOrEqual(systemTokens + 1)
      expect(shared).toBeLessThanOrEqual(systemTokens + 1 + 80 + cfg.outputTokens)
    }

    // Branches: one per retry, fork and compaction, and none elsewhere; one root (every call starts with the system prompt).
    expect(tree.childrenOf(0)).toHaveLength(1)
    expect(branchPoints(tree)).toBe(stats.retries + stats.subagents + stats.compactions)

    // Distinct tokens: the script's distinct text once (+ each turn's markers), the outputs, and nothing twice.
    const distinct = new Set(calls.flatMap((c) => c.messages.filter((m) => m.role !== "assistant")))
    const text = [...distinct].reduce((n, m) => n + m.content.length + 2, 1)
    const estimate = text + calls.length * (cfg.outputTokens + 2)
    const quoted = (stats.subagents + stats.compactions) * cfg.outputTokens
    expect(Math.abs(tree.uniqueTokens - estimate)).toBeLessThanOrEqual(quoted + calls.length)
    expect(tree.totalCallTokens).toBe(lines.reduce((n, l) => n + l.usage!.prompt + l.usage!.completion, 0))
    expect(tree.totalCallTokens / tree.uniqueTokens).toBeGreaterThan(3)

    // The KV cache: a call that continues the call just before it prefilled only what is new.
    for (const [i, b] of calls.entries()) {
      if (i === 0 || !continues(calls[i - 1]!, b)) continue
      expect(lines[i]!.usage!.cached, `${b.id} cached`).toBeGreaterThanOrEqual(prompt(calls[i - 1]!.id).length)
    }
  }, 120_000)
})
