/**
 * `gyre serve --checkpoint DIR` on a Hugging Face model directory (BF16 weights in two shards
 * with an index, a byte-level BPE tokenizer.json, a ChatML chat template, generation_config
 * eos ids), talked to by the official `openai` client; the call records are token-exact: the
 * assistant turn the harness sends back is the generated ids, so rebuilding the trajectory
 * tree from the records gives one path, the second call extending the first.
 */
import * as path from "node:path"
import { jetstream } from "@nats-io/jetstream"
import { Effect, Schema } from "effect"
import OpenAI from "openai"
import { afterEach, describe, expect, it } from "vitest"
import { seedFile } from "../../src/runtime/auth.ts"
import { connectTo } from "../../src/runtime/nats.ts"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import { CallRecordJson } from "../../src/tree/record.ts"
import { serveChild, tempDir } from "../rollout/fixtures.ts"
import { byteLevelTokenizer, writeSmolModel } from "./fixtures.ts"

const tok = byteLevelTokenizer()

const killAfter: Array<() => void> = []
afterEach(() => killAfter.splice(0).forEach((k) => k()))

// The embedded server admits only the users of GYRE_AUTH_DIR: the records are read as the observer.
const authDir = path.join(tempDir("gyre-hf-auth-"), "auth")

const serve = (checkpoint: string) => {
  const served = serveChild(["--checkpoint", checkpoint, "--port", "0", "--model", "smol", "--store", tempDir("gyre-hf-store-")], authDir)
  killAfter.push(() => served.child.exitCode === null && served.child.kill("SIGKILL"))
  return served
}

const fetchRecords = (ready: Record<string, string>, n: number) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const nc = yield* connectTo(ready.nats!, { nkeyFile: seedFile(authDir, "observer") })
        return yield* Effect.promise(async () => {
          const consumer = await jetstream(nc).consumers.get(`GYRE_${ready.run}_TRAJECTORIES`, { filter_subjects: [ready.records!] })
          const out = []
          for await (const m of await consumer.fetch({ max_messages: n, expires: 5000 })) out.push(Schema.decodeUnknownSync(CallRecordJson)(m.string()))
          return out
        })
      })
    )
  )

describe("gyre serve on a Hugging Face model directory", () => {
  it("answers the openai client with the model's tokenizer and template; records are token-exact", async () => {
    const dir = await writeSmolModel(tempDir("gyre-hf-serve-"))
    const { child, exited, event } = serve(dir)
    const ready = await event("ready")
    const client = new OpenAI({ baseURL: ready.baseUrl, apiKey: ready.key, maxRetries: 0 })
    const first = await client.chat.completions.create({ model: "smol", messages: [{ role: "user", content: "hello world" }], max_tokens: 16, seed: 3 })
    const reply = first.choices[0]!.message.content ?? ""
    const history = [
      { role: "user" as const, content: "hello world" },
      { role: "assistant" as const, content: reply },
      { role: "user" as const, content: "to" }
    ]
    const second = await client.chat.completions.create({ model: "smol", messages: history, max_tokens: 4, seed: 4 })
    const records = await fetchRecords(ready, 2)
    child.kill("SIGINT")
    await event("drained")
    expect(await exited).toBe(0)

    expect(records.map((r) => r.callId)).toEqual([first.id, second.id])
    const decoder = new DeltaDecoder(ready.execution!)
    for (const r of records) expect(decoder.add(r).rejected).toEqual([])
    const [one, two] = records.map((r) => decoder.tree.callSequence(decoder.tree.callIndex(r.callId)!))
    const [p1, o1] = [records[0]!.promptLength, records[0]!.outputLength]
    expect(o1).toBe(first.usage!.completion_tokens)
    // the prompt is the template's text in the model's tokens: ChatML with the default system turn
    const prompt1 = one!.subarray(0, p1)
    expect(Array.from(prompt1.subarray(0, 1))).toEqual([tok.ids.im_start])
    const generationPrompt = [tok.ids.im_start, ...Buffer.from("assistant\n")] // byte ids are the bytes (no merges apply)
    expect(Array.from(prompt1.subarray(p1 - generationPrompt.length))).toEqual(generationPrompt)
    // token-exact: the second call's sequence starts with the whole first call (prompt and generated ids)
    expect(Array.from(two!.subarray(0, p1 + o1))).toEqual(Array.from(one!))
    expect(records[1]!.ref).toMatchObject({ callId: first.id })
    expect(records[1]!.ref!.shared).toBeGreaterThanOrEqual(p1 + o1)
    expect(decoder.tree.leaves()).toHaveLength(1)
  }, 180_000)
})
