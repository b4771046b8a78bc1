/**
 * `gyre serve` as a user runs it: a child process with its own embedded nats-server and two
 * rollout workers; an OpenAI client talks to the printed base URL with the printed key, the
 * call is on the printed record subject, and SIGINT drains and exits 0.
 */
import * as path from "node:path"
import { Effect, Schema } from "effect"
import OpenAI from "openai"
import { afterEach, describe, expect, it } from "vitest"
import { connectTo } from "../../src/runtime/nats.ts"
import { jetstream } from "@nats-io/jetstream"
import { CallRecordJson } from "../../src/tree/record.ts"
import { seedFile } from "../../src/runtime/auth.ts"
import { serveChild, tempDir, writeCheckpoint } from "./fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-serve-"), 3)
const killAfter: Array<() => void> = []
afterEach(() => killAfter.splice(0).forEach((k) => k()))

describe("gyre serve", () => {
  it("serves a checkpoint to any OpenAI client, records the calls, and drains on SIGINT", async () => {
    // The embedded server admits only the users of GYRE_AUTH_DIR: this test reads the records as the observer.
    const authDir = path.join(tempDir("gyre-serve-auth-"), "auth")
    const store = tempDir("gyre-serve-store-")
    const { child, lines, exited, event } = serveChild(["--checkpoint", checkpoint, "--port", "0", "--devices", "2", "--store", store], authDir, 60_000)
    killAfter.push(() => child.exitCode === null && child.kill("SIGKILL"))

    const ready = await event("ready")
    expect(lines.some((l) => l.startsWith(`OpenAI base URL: ${ready.baseUrl}`))).toBe(true)
    expect(lines.some((l) => l.includes(ready.key!))).toBe(true)
    // worker i on device i mod the device count (the CPU has one: both on 0)
    expect(lines.some((l) => /^model: .*2 (cpu workers on devices 0, 0|cuda workers on devices 0, [01])\)$/.test(l))).toBe(true)
    const client = new OpenAI({ baseURL: ready.baseUrl, apiKey: ready.key, maxRetries: 0 })
    const answer = await client.chat.completions.create({ model: "gyre", messages: [{ role: "user", content: "hello" }], max_tokens: 12 })
    const records = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const nc = yield* connectTo(ready.nats!, { nkeyFile: seedFile(authDir, "observer") })
          return yield* Effect.promise(async () => {
            const consumer = await jetstream(nc).consumers.get(`GYRE_${ready.run}_TRAJECTORIES`, { filter_subjects: [ready.records!] })
            const batch = await consumer.fetch({ max_messages: 1, expires: 5000 })
            const out = []
            for await (const m of batch) out.push(Schema.decodeUnknownSync(CallRecordJson)(m.string()))
            return out
          })
        })
      )
    )
    child.kill("SIGINT")
    await event("drained")
    expect(await exited).toBe(0)
    expect(answer.usage!.completion_tokens).toBeGreaterThan(0)
    expect(records.map((r) => [r.callId, r.outputLength, r.execution])).toEqual([[answer.id, answer.usage!.completion_tokens, ready.execution]])
  })
})
