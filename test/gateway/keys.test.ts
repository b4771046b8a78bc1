/**
 * API keys at the gateway, with a real worker, real NATS and the run's journal: keys are
 * random and unrelated to ids; only their digest is registered, so neither NATS nor the
 * journal ever holds a key; an open execution cannot be taken over by re-opening it with
 * another key, a key names one execution, and closing revokes it.
 */
import { Effect, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { apiKeyDigest, newApiKey } from "../../src/protocols/gateway.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { eventually, withSystem } from "../runtime/harness.ts"
import { KEY, gatewayRef, serve, tempDir, writeCheckpoint } from "../rollout/fixtures.ts"
import { httpRequest, rawRequest } from "./raw-http.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-gw-keys-"), 11)

describe("gateway API keys", () => {
  it("draws keys from the CSPRNG, each one unrelated to the others and to ids", () => {
    const keys = Array.from({ length: 1000 }, newApiKey)
    expect(new Set(keys).size).toBe(1000)
    for (const k of keys) expect(k).toMatch(/^gyre-[0-9a-f]{48}$/) // 192 bits
    // Bits are balanced across keys (a counter or a clock would not be).
    const ones = keys.reduce((n, k) => n + [...k.slice(5)].reduce((m, h) => m + Number.parseInt(h, 16).toString(2).replaceAll("0", "").length, 0), 0)
    expect(ones / (1000 * 192)).toBeGreaterThan(0.48)
    expect(ones / (1000 * 192)).toBeLessThan(0.52)
    expect(apiKeyDigest(keys[0]!)).toMatch(/^[0-9a-f]{64}$/)
    expect(apiKeyDigest(keys[0]!)).not.toBe(apiKeyDigest(keys[1]!))
  })

  it("refuses a takeover of an open execution, binds a key to one execution, revokes on close, and keeps keys out of the journal", async () => {
    const out = await withSystem("gw-keys", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { baseUrl, execution } = yield* serve({ checkpoint, workers: 1 })
      const port = Number(new URL(baseUrl).port)
      const models = (key: string) => Effect.promise(() => rawRequest(port, httpRequest("GET", "/v1/models", { authorization: `Bearer ${key}` }))).pipe(Effect.map((a) => a.status))
      const open = (key: string, exec: string) =>
        system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(key), task: "t", execution: exec, defaultRole: "main" }).pipe(
          Effect.map(() => "opened"),
          Effect.catchTag("ExecutionConflict", (e) => Effect.succeed(e.reason))
        )
      const intruder = newApiKey()
      const takeover = yield* open(intruder, execution)
      const afterTakeover = { owner: yield* models(KEY), intruder: yield* models(intruder) }
      const again = yield* open(KEY, execution) // a retried OpenExecution: a no-op
      const reuse = yield* open(KEY, "exec-2")
      yield* system.ask(gatewayRef, "CloseExecution", { execution })
      const afterClose = yield* models(KEY)
      const fresh = newApiKey()
      const reopened = yield* open(fresh, execution)
      const afterReopen = { fresh: yield* models(fresh), old: yield* models(KEY) }
      // Every OpenExecution above is in the journal (asks are copied there): none holds a key.
      const journal = yield* eventually(
        Stream.runCollect(readStored(system.nats, system.layout.journalStream)).pipe(
          Effect.map((ms) => Array.from(ms, (m) => m.string())),
          Effect.map((texts) => (texts.filter((t) => t.includes("keyDigest")).length >= 5 ? texts : undefined))
        )
      )
      return { takeover, afterTakeover, again, reuse, afterClose, reopened, afterReopen, journal, intruder, fresh }
    }))
    expect(out.takeover).toBe("the execution is already open under another key")
    expect(out.afterTakeover).toEqual({ owner: 200, intruder: 401 })
    expect(out.again).toBe("opened")
    expect(out.reuse).toBe("the key already names another open execution")
    expect(out.afterClose).toBe(401)
    expect(out.reopened).toBe("opened")
    expect(out.afterReopen).toEqual({ fresh: 200, old: 401 })
    const all = out.journal.join("\n")
    for (const key of [KEY, out.intruder, out.fresh]) expect(all).not.toContain(key)
    expect(all).toContain(apiKeyDigest(KEY))
  })
})
