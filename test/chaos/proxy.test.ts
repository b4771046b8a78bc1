/**
 * A TCP proxy between a node and NATS that delays, cuts and restores: the node reconnects
 * after each cut and handles every tell acknowledged meanwhile, once.
 */
import { Effect, Schedule } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { LedgerProtocol } from "../fixtures/actors.ts"
import { eventually, startNodeProcess, withSystem, type NodeProcess } from "../runtime/harness.ts"
import { recordFault, sleep } from "./helpers.ts"
import { startProxy } from "./tcp-proxy.ts"

const FIXTURES = "test/fixtures/actors.ts"
const ledger = refOf(LedgerProtocol, address("ledger", "p1"))

const started: Array<NodeProcess> = []
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

describe("TCP proxy between a node and NATS", () => {
  it("delays, cuts twice and restores: every acknowledged tell is handled once", { timeout: 240_000 }, async () => {
    const result = await withSystem("proxy", Effect.gen(function* () {
      const system = yield* ActorSystem
      const u = new URL(system.nats.servers.split(",")[0]!)
      const proxy = yield* Effect.acquireRelease(Effect.promise(() => startProxy({ host: u.hostname, port: Number(u.port) })), (p) => Effect.promise(() => p.close()))
      const node = startNodeProcess(proxy.url, ["--name", "behind", "--run", "proxy", "--load", FIXTURES, "--spawn", "ledger/p1", "--ack-wait-ms", "2000"], { GYRE_NATS_GONE_MS: "600000" })
      started.push(node)
      yield* Effect.promise(() => node.waitFor("ready", 90_000))
      let told = 0
      const tell = (n: number) =>
        Effect.gen(function* () {
          for (let i = 0; i < n; i++) yield* system.tell(ledger, "Append", { item: `t${told++}` })
        })
      const items = (want: number) =>
        eventually(system.ask(ledger, "Items", undefined, { timeoutMs: 3000 }).pipe(Effect.map((xs) => (xs.length >= want ? xs : undefined))), 90_000, 250) as Effect.Effect<ReadonlyArray<string>>
      const recoveries: Array<number> = []
      yield* tell(20)
      yield* items(20)
      for (const cutMs of [2000, 4000]) {
        proxy.cut()
        yield* tell(20) // acknowledged by the server while the node is cut off
        yield* sleep(cutMs)
        proxy.restore()
        const restored = Date.now()
        yield* items(told)
        recoveries.push((Date.now() - restored) / 1000)
      }
      proxy.delay(150)
      yield* tell(20)
      const final = yield* items(told)
      proxy.delay(0)
      yield* sleep(2500) // anything redelivered late would show now
      const settled = yield* system.ask(ledger, "Items", undefined).pipe(Effect.retry({ times: 5, schedule: Schedule.spaced("500 millis") }))
      return { told, final, settled, recoveries, nodeAlive: node.child.exitCode === null }
    }))
    for (const r of result.recoveries) recordFault({ fault: "proxy cut and restore", recovered: true, recoveryS: r, executionsLost: result.told - new Set(result.settled).size })
    expect(result.nodeAlive).toBe(true)
    expect(new Set(result.settled).size).toBe(result.told)
    expect(result.settled.length).toBe(result.told)
  })
})
