/**
 * kill -9 of a node hosting a rollout worker while a client keeps calling: every call is
 * answered (the gateway routes to the worker left), and every answered call has its call
 * record on the trajectory stream, once (no acknowledged call record missing).
 */
import { Effect } from "effect"
import OpenAI from "openai"
import { afterEach, describe, expect, it } from "vitest"
import { rlLayout } from "../../src/protocols/layout.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { startNodeProcess, withSystem, type NodeProcess } from "../runtime/harness.ts"
import { KEY, readRecords, serve, tempDir, writeCheckpoint } from "../rollout/fixtures.ts"
import { recordFault } from "./helpers.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-chaos-roll-"), 5)
const CALLS = 12

const children: Array<NodeProcess> = []
afterEach(() => {
  for (const p of children.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

describe("rollout node killed with SIGKILL", () => {
  it("answers every call and records each answered call once", { timeout: 240_000 }, async () => {
    const out = await withSystem("roll-kill", Effect.gen(function* () {
      const system = yield* ActorSystem
      const b = startNodeProcess(
        system.nats.servers,
        ["--name", "b", "--run", "roll-kill", "--load", "src/actors/rollout-worker.ts", "--spawn", "rollout-worker/b.cpu0", "--heartbeat-ms", "250"],
        { GYRE_CHECKPOINT: checkpoint }
      )
      children.push(b)
      yield* Effect.promise(() => b.waitFor("ready", 90_000))
      const { node, baseUrl, execution } = yield* serve({ checkpoint, workers: 0, gateway: { workerDeadAfterMs: 1500 } })
      const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0, timeout: 60_000 })
      const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [{ role: "user", content: "Count." }]
      let answered = 0
      let killedAt = 0
      let recoveredAt = 0
      for (let i = 0; i < CALLS; i++) {
        if (i === 3) yield* node.spawn("rollout-worker", "a.cpu0") // the survivor
        if (i === 5) {
          killedAt = Date.now()
          b.child.kill("SIGKILL")
        }
        const r = yield* Effect.promise(() => client.chat.completions.create({ model: "gyre", messages, max_tokens: 6, seed: i }))
        if (i === 5) recoveredAt = Date.now()
        messages.push({ role: "assistant", content: r.choices[0]!.message.content ?? "" }, { role: "user", content: `Again ${i}.` })
        answered++
      }
      const records = yield* readRecords(execution, answered)
      const info = yield* Effect.promise(() => system.nats.jsm.streams.info(rlLayout(system.run).trajectoryStream))
      return { answered, records, stored: info.state.messages, recoveryS: (recoveredAt - killedAt) / 1000 }
    }))
    const callIds = new Set(out.records.map((r) => r.callId))
    recordFault({ fault: "rollout node kill -9", recovered: out.answered === CALLS, recoveryS: out.recoveryS, executionsLost: CALLS - callIds.size })
    expect(out.answered).toBe(CALLS)
    expect(callIds.size).toBe(CALLS)
    expect(out.stored).toBe(CALLS)
  })
})
