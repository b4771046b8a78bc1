/**
 * The embedded nats-server under faults: kill -9 of the server (restarted on the same store
 * and port, clients reconnect, nothing acknowledged lost), kill -9 of the node that owns it
 * (the server dies with it; the restarted node finds its 100 acknowledged tells in the kept
 * store), a node whose NATS is gone (exits 1 with the reason), and SIGTERM while NATS is gone
 * (quick).
 */
import * as path from "node:path"
import { Effect, Layer, Schedule } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { LedgerProtocol } from "../fixtures/actors.ts"
import { eventually, startNodeProcess, type NodeProcess } from "../runtime/harness.ts"
import { alive, asClient, goneWithin, recordFault, tempDir } from "./helpers.ts"

const FIXTURES = "test/fixtures/actors.ts"
const ledger = (id: string) => refOf(LedgerProtocol, address("ledger", id))

const started: Array<NodeProcess> = []
const node = (url: string, args: ReadonlyArray<string>, env: Record<string, string> = {}) => {
  const p = startNodeProcess(url, args, env)
  started.push(p)
  return p
}
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

describe("embedded nats-server", () => {
  it("is restarted on the same store and port after kill -9; clients reconnect and every acknowledged message is there", { timeout: 120_000 }, async () => {
    const store = tempDir("store")
    const result = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const nats = yield* Nats
          const system = yield* ActorSystem
          for (let i = 0; i < 50; i++) yield* system.tell(ledger("s1"), "Append", { item: `before-${i}` })
          const firstPid = nats.server!.pid
          const killedAt = Date.now()
          process.kill(firstPid, "SIGKILL")
          yield* (eventually(Effect.sync(() => (nats.server!.restarts === 1 ? true : undefined)), 20_000) as Effect.Effect<boolean>)
          // Acknowledged again once the client has reconnected to the same URL.
          // A tell sent while the client reconnects may time out (not acknowledged): sent again.
          for (let i = 0; i < 50; i++) {
            yield* system.tell(ledger("s1"), "Append", { item: `after-${i}` }).pipe(Effect.retry({ times: 40, schedule: Schedule.spaced("250 millis") }))
          }
          const recoveryS = (Date.now() - killedAt) / 1000
          const info = yield* Effect.promise(() => nats.jsm.streams.info(system.layout.journalStream))
          return { firstPid, pid: nats.server!.pid, url: nats.servers, messages: info.state.messages, recoveryS, storeDir: nats.server!.storeDir }
        }).pipe(Effect.provide(ActorSystem.layer({ run: "restart" }).pipe(Layer.provideMerge(Nats.layer({ storeDir: store })))))
      )
    )
    recordFault({ fault: "nats-server kill -9 (embedded restart)", recovered: result.messages === 100, recoveryS: result.recoveryS, executionsLost: 100 - result.messages })
    expect(result.pid).not.toBe(result.firstPid)
    expect(alive(result.firstPid)).toBe(false)
    expect(result.storeDir).toBe(store)
    expect(result.messages).toBe(100)
  })

  it("dies with its node on kill -9; the restarted node finds the 100 acknowledged tells in the kept store", { timeout: 240_000 }, async () => {
    const dir = tempDir("node")
    const env = { GYRE_AUTH_DIR: path.join(dir, "auth") }
    const args = ["--name", "a", "--run", "keep", "--load", FIXTURES, "--store", path.join(dir, "store"), "--ack-wait-ms", "1500"]
    const first = node("", args, env)
    const ready = await first.waitFor("ready", 60_000)
    const natsPid = ready.natsPid as number
    expect(ready.embedded).toBe(true)
    expect(alive(natsPid)).toBe(true)
    await asClient("keep", ready.nats as string, env.GYRE_AUTH_DIR, Effect.gen(function* () {
      const system = yield* ActorSystem
      for (let i = 0; i < 100; i++) yield* system.tell(ledger("k1"), "Append", { item: `t${i}` })
    }))
    const killedAt = Date.now()
    first.child.kill("SIGKILL")
    const serverGoneMs = await goneWithin(natsPid, 10_000)
    expect(serverGoneMs).toBeDefined()

    const second = node("", [...args, "--spawn", "ledger/k1"], env)
    const again = await second.waitFor("ready", 60_000)
    const items: ReadonlyArray<string> = await asClient("keep", again.nats as string, env.GYRE_AUTH_DIR, eventually(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const xs = yield* system.ask(ledger("k1"), "Items", undefined)
        return xs.length >= 100 ? xs : undefined
      }),
      60_000,
      200
    ))
    recordFault({ fault: "node kill -9 (embedded server, kept store)", recovered: items.length === 100, recoveryS: (Date.now() - killedAt) / 1000, executionsLost: 100 - new Set(items).size })
    expect(new Set(items).size).toBe(100)
    expect(items.length).toBe(100)
  })

  it("a node whose NATS is gone longer than GYRE_NATS_GONE_MS exits 1 with the reason; SIGTERM with NATS gone is quick", { timeout: 180_000 }, async () => {
    const server = await Effect.runPromise(Effect.scoped(Effect.gen(function* () {
      const s = yield* startEmbeddedServer()
      const lost = node(s.url, ["--name", "lost", "--run", "gone", "--load", FIXTURES], { GYRE_NATS_GONE_MS: "2000" })
      const term = node(s.url, ["--name", "term", "--run", "gone", "--load", FIXTURES], { GYRE_NATS_GONE_MS: "600000", GYRE_DRAIN_MS: "2000" })
      yield* Effect.promise(() => Promise.all([lost.waitFor("ready", 60_000), term.waitFor("ready", 60_000)]))
      return { pid: s.pid, lost, term }
    })))
    // The scope closed: the server is stopped, and is not coming back.
    expect(alive(server.pid)).toBe(false)
    const goneAt = Date.now()
    const code = await server.lost.exited
    const lostAfterMs = Date.now() - goneAt
    server.term.child.kill("SIGTERM")
    const termAt = Date.now()
    await server.term.exited
    const termMs = Date.now() - termAt
    expect(code).toBe(1)
    expect(server.lost.stderr()).toContain("unreachable for")
    expect(lostAfterMs).toBeLessThan(20_000)
    expect(termMs).toBeLessThan(15_000)
  })
})
