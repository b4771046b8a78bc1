/**
 * Shared pieces of the Responses and Messages API tests: the scripted model served by a node
 * with a rollout worker and the gateway on a fresh nats-server, the official clients pointed
 * at it, and the check that an execution's calls never branch where nothing branched.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import Anthropic from "@anthropic-ai/sdk"
import { Effect } from "effect"
import OpenAI from "openai"
import { afterAll, expect } from "vitest"
import type { GatewayConfig } from "../../src/actors/gateway.ts"
import { anthropicBaseUrl } from "../../src/harness/environment.ts"
import { chatFormatOf } from "../../src/openai/hf-chat.ts"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import type { CallRecord } from "../../src/tree/record.ts"
import { KEY, serve } from "../rollout/fixtures.ts"
import { writeScriptedModel } from "./scripted-model.ts"

const dir = mkdtempSync(join(tmpdir(), "gyre-apis-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

export const scriptedModel = writeScriptedModel(dir)
const chat = await chatFormatOf(scriptedModel)

/** The scripted model served (one worker, the gateway), with both official clients on its execution's key. */
export const serveScripted = (gateway: Omit<GatewayConfig, "chat"> = {}) =>
  Effect.gen(function* () {
    const served = yield* serve({ checkpoint: scriptedModel, workers: 1, gateway: { ...gateway, chat } })
    const openai = new OpenAI({ baseURL: served.baseUrl, apiKey: KEY, maxRetries: 0, timeout: 60_000 })
    const anthropic = new Anthropic({ baseURL: anthropicBaseUrl(served.baseUrl), apiKey: KEY, maxRetries: 0, timeout: 60_000 })
    return { ...served, openai, anthropic }
  })

export const promise = <A>(f: () => Promise<A>) => Effect.promise(f)

/** The rejection of `f` as the client reports it: status and error body. */
export const failure = (f: () => Promise<unknown>) =>
  Effect.promise(() =>
    f().then(
      () => ({ status: 200, body: undefined as unknown }),
      (e: unknown) => (e instanceof OpenAI.APIError || e instanceof Anthropic.APIError ? { status: e.status ?? -1, body: e.error as unknown } : { status: -1, body: String(e) })
    )
  )

/**
 * Each call of `path` (call ids; default all the records) begins with the whole previous one
 * (its prompt and output tokens): that conversation is one path of the execution's trajectory,
 * no spurious branch. `records` are all the execution's records so far (deltas refer to them).
 */
export const expectOnePath = (execution: string, records: ReadonlyArray<CallRecord>, path: ReadonlyArray<string> = records.map((r) => r.callId)) => {
  const decoder = new DeltaDecoder(execution)
  for (const r of records) expect(decoder.add(r).rejected).toEqual([])
  const { tree } = decoder
  const calls = path.map((id) => tree.callIndex(id)!)
  for (let i = 1; i < calls.length; i++) {
    const before = tree.callSequence(calls[i - 1]!)
    const now = tree.callSequence(calls[i]!)
    expect(tree.call(calls[i]!).promptLength).toBeGreaterThan(before.length)
    expect(Array.from(now.subarray(0, before.length))).toEqual(Array.from(before))
  }
}

/** POSTs `body` and reads the answer as server-sent events: each event's name (`event:` line, null without one) and data. */
export const postEvents = (url: string, headers: Record<string, string>, body: unknown) =>
  Effect.promise(async () => {
    const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) })
    const text = await res.text()
    const events = text
      .split("\n\n")
      .filter((block) => block.trim() !== "")
      .map((block) => {
        const lines = block.split("\n")
        const name = lines.find((l) => l.startsWith("event: "))?.slice("event: ".length) ?? null
        const data = lines.find((l) => l.startsWith("data: "))?.slice("data: ".length) ?? ""
        return { name, data: data === "[DONE]" ? data : (JSON.parse(data) as Record<string, unknown>) }
      })
    return { status: res.status, contentType: res.headers.get("content-type"), events }
  })
