/**
 * A 3-server loopback JetStream cluster with the run's streams and buckets at R3: a node
 * hosting a ledger keeps taking tells while one server is killed with SIGKILL (and restarted
 * by its supervisor on the same store and port); every acknowledged tell is handled once.
 */
import * as fs from "node:fs"
import * as net from "node:net"
import * as path from "node:path"
import { Effect, Exit, Schedule, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { layout, address } from "../../src/runtime/names.ts"
import { startEmbeddedServer, type EmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { LedgerProtocol } from "../fixtures/actors.ts"
import { eventually, startNodeProcess, type NodeProcess } from "../runtime/harness.ts"
import { asClient, recordFault, tempDir } from "./helpers.ts"

const FIXTURES = "test/fixtures/actors.ts"
const RUN = "cluster"
const ledger = refOf(LedgerProtocol, address("ledger", "c1"))

/**
 * A free port below the kernel's ephemeral range (32768-60999 here), for a route: the other
 * tests' servers and clients take ephemeral ports, so one of them could take a route port
 * picked from that range between this check and the cluster server's bind.
 */
const freeRoutePort = async (): Promise<number> => {
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000)
    const free = await new Promise<boolean>((resolve) => {
      const s = net.createServer()
      s.once("error", () => resolve(false))
      s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)))
    })
    if (free) return port
  }
}

/** Three servers of cluster `gyre`, each supervised, in their own scopes. */
const startCluster = async (dir: string) => {
  const routes = [await freeRoutePort(), await freeRoutePort(), await freeRoutePort()]
  const scopes = routes.map(() => Effect.runSync(Scope.make()))
  const servers: Array<EmbeddedServer> = await Promise.all(
    routes.map((route, i) =>
      Effect.runPromise(
        startEmbeddedServer({
          storeDir: path.join(dir, `s${i}`),
          readyTimeoutMs: 30_000,
          extraConfig: [
            `server_name: s${i}`,
            `cluster { name: gyre, listen: 127.0.0.1:${route}, routes: [${routes.filter((r) => r !== route).map((r) => `nats-route://127.0.0.1:${r}`).join(", ")}] }`
          ].join("\n")
        }).pipe(Scope.provide(scopes[i]!))
      )
    )
  )
  return { servers, url: servers.map((s) => s.url).join(","), close: () => Promise.all(scopes.map((s) => Effect.runPromise(Scope.close(s, Exit.void)))) }
}

/** The run's journal and dead-letter streams and its buckets, created at R3 before any node (the runtime then finds them). */
const createAtR3 = Effect.gen(function* () {
  const nats = yield* Nats
  const names = layout(RUN)
  // tryPromise, so a refusal (no meta leader yet: "no suitable peers for placement") is retried, not a defect
  yield* Effect.tryPromise(async () => {
    await nats.jsm.streams.add({ name: names.journalStream, subjects: names.journalSubjects, num_replicas: 3, duplicate_window: 120_000_000_000 })
    await nats.jsm.streams.add({ name: names.deadStream, subjects: names.deadSubjects, num_replicas: 3 })
    await nats.kvm.create(names.registryBucket, { history: 1, replicas: 3 })
    await nats.kvm.create(names.stateBucket, { history: 1, replicas: 3 })
  }).pipe(Effect.retry({ times: 30, schedule: Schedule.spaced("1 second") })) // the cluster elects its meta leader first
  const info = yield* Effect.promise(() => nats.jsm.streams.info(names.journalStream))
  return info.config.num_replicas
})

const started: Array<NodeProcess> = []
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

/** The test: a cluster, the streams at R3, a node, tells across a server's kill; `enter` names each phase. */
const body = async (enter: (phase: string) => void) => {
  const dir = tempDir("cluster")
  const cluster = await startCluster(dir)
  try {
    enter("creating the streams and buckets at R3")
    let replicas: number | undefined
    for (let i = 0; replicas === undefined; i++) {
      // Until the cluster has elected its meta leader, JetStream does not answer.
      replicas = await Effect.runPromise(Effect.scoped(createAtR3).pipe(Effect.provide(Nats.layer({ url: cluster.url })))).catch((e) =>
        i < 30 ? new Promise<undefined>((r) => setTimeout(() => r(undefined), 1000)) : Promise.reject(e)
      )
    }
    enter("starting the node")
    const node = startNodeProcess(cluster.url, ["--name", "c", "--run", RUN, "--load", FIXTURES, "--spawn", "ledger/c1"])
    started.push(node)
    await node.waitFor("ready", 90_000)
    const victim = cluster.servers[1]!
    const result = await asClient(RUN, cluster.url, undefined, Effect.gen(function* () {
      const system = yield* ActorSystem
      const tell = (i: number) =>
        system.tell(ledger, "Append", { item: `t${i}` }).pipe(Effect.retry({ times: 60, schedule: Schedule.spaced("500 millis") }))
      enter("telling 50 items")
      for (let i = 0; i < 50; i++) yield* tell(i)
      const killedAt = Date.now()
      process.kill(victim.pid, "SIGKILL")
      enter("telling 50 items with a server killed")
      for (let i = 50; i < 100; i++) yield* tell(i)
      enter("waiting for the killed server's restart")
      yield* (eventually(Effect.sync(() => (victim.restarts >= 1 ? true : undefined)), 60_000) as Effect.Effect<boolean>)
      enter("asking for the 100 items")
      let seen = "no answer yet"
      const items = yield* (eventually(
        system.ask(ledger, "Items", undefined).pipe(
          Effect.tapError((e) => Effect.sync(() => void (seen = `ask failed: ${String(e)}`))),
          Effect.map((xs) => {
            seen = `${xs.length} items`
            return xs.length >= 100 ? xs : undefined
          })
        ),
        120_000,
        250
      ).pipe(Effect.catchDefect(() => Effect.die(new Error(`the ledger never held 100 items (last: ${seen})`)))) as Effect.Effect<ReadonlyArray<string>>)
      return { items, recoveryS: (Date.now() - killedAt) / 1000 }
    }))
    recordFault({ fault: "cluster server kill -9 (R3)", recovered: new Set(result.items).size === 100, recoveryS: result.recoveryS, executionsLost: 100 - new Set(result.items).size })
    expect(replicas).toBe(3)
    expect(new Set(result.items).size).toBe(100)
    expect(result.items.length).toBe(100)
  } finally {
    enter("closing the cluster")
    await cluster.close()
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

describe("3-server cluster, streams at R3", () => {
  it("loses no acknowledged tell while one server is killed with SIGKILL and restarted", { timeout: 300_000 }, async () => {
    // What the test is doing, so that a stuck run fails naming it (before vitest's timeout).
    let phase = "starting the cluster"
    let stuck: ReturnType<typeof setTimeout> | undefined
    const watchdog = new Promise<never>((_, reject) => {
      stuck = setTimeout(() => reject(new Error(`stuck for 280 s, while ${phase}`)), 280_000)
    })
    try {
      await Promise.race([body((p) => void (phase = p)), watchdog])
    } finally {
      clearTimeout(stuck)
    }
  })
})
