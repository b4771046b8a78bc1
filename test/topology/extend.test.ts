/**
 * A kind added to the run's topology (examples/topology-kind.ts: `echo`, hosted by a new role
 * `echo-host`) gets, from the topology alone: its role's NATS permissions, enforced by a real
 * nats-server (the role's user hosts it and answers its asks; another role may not join its
 * queue group); replay's decoding of its messages (the journal read with the extended
 * topology's protocols gives the typed payload, a `Date`; with the run's, the raw JSON); a spawn
 * in a hosted run's plan; a row in the channel table. The run host's `implement` does not
 * compile without the new kind's implementation (the `@ts-expect-error` below fails tsc the
 * day it does).
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { connect, type NatsConnection } from "@nats-io/transport-node"
import { Effect, Exit, Layer, Scope, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Evaluator } from "../../examples/evaluator.ts"
import { Echo, EchoRun, echo } from "../../examples/topology-kind.ts"
import { defaultUsers, permissionsOf } from "../../src/protocols/roles.ts"
import { RunTopology, channelTable, implement, protocolsOf, spawnPlan, type Implementations } from "../../src/protocols/topology.ts"
import { clientAuth, seedFile, serverConfigOf, writeAuthDir } from "../../src/runtime/auth.ts"
import { readJournal } from "../../src/runtime/journal.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem } from "../../src/runtime/system.ts"

const RUN = "topo"
let url = ""
let dir = ""
let scope: Scope.Closeable

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-topology-"))
  await Effect.runPromise(writeAuthDir(dir, defaultUsers("*", EchoRun)))
  scope = Effect.runSync(Scope.make())
  url = (await Effect.runPromise(startEmbeddedServer({ extraConfig: serverConfigOf(dir) }).pipe(Scope.provide(scope)))).url
}, 60_000)
afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

describe("a kind added to the topology", () => {
  it("is in the derived permissions, decoders, spawn plan and table; the run's own are unchanged", () => {
    const echoHost = permissionsOf("r1", ["echo-host"], EchoRun)
    expect(echoHost.subscribe.allow).toContain("gyre.r1.ask.echo.>")
    expect(echoHost.publish.allow).toContain("gyre.r1.tell.echo.>")
    expect(echoHost.subscribe.allow).not.toContain("gyre.r1.ask.device.>")
    expect(permissionsOf("r1", ["gateway"], EchoRun)).toEqual(permissionsOf("r1", ["gateway"]))
    expect(Object.keys(protocolsOf(EchoRun))).toContain("echo")
    expect(Object.keys(protocolsOf(RunTopology))).not.toContain("echo")
    expect(spawnPlan(EchoRun, ["main.cpu0"])).toContainEqual({ kind: "echo", id: "main" })
    expect(spawnPlan(RunTopology, ["main.cpu0"]).map((s) => s.kind)).not.toContain("echo")
    expect(channelTable(EchoRun)).toContain("| `gyre.R.{ask,tell}.echo.<id>` | asks (core NATS), tells (journal) | echo-host | Echo, Note |")
    expect(defaultUsers("*", EchoRun).map((u) => u.name)).toContain("echo-host")
  })

  it("the run host's implement wants the new kind's implementation, of its protocol", () => {
    type Wanted = Implementations<typeof EchoRun>
    const withoutEcho = {} as Omit<Wanted, "echo">
    // @ts-expect-error: the implementations lack `echo`
    const missing: Wanted = withoutEcho
    const ofEcho: Wanted["echo"] = echo
    // @ts-expect-error: an evaluator does not speak the echo protocol
    const wrong: Wanted["echo"] = Evaluator
    expect([missing, ofEcho.kind, wrong.kind]).toEqual([withoutEcho, "echo", "evaluator"])
    // At run time too: an implementation under another kind's name is refused.
    const mislabelled = { device: echo, gateway: echo, "harness-runner": echo, scheduler: echo, echo } as unknown as Wanted
    expect(() => implement(EchoRun, mislabelled)).toThrow("the implementation of gateway is a echo")
  })

  it("runs on a real nats-server as its derived user: spawned by the plan, answering, journaled and decoded", { timeout: 60_000 }, async () => {
    const layer = ActorSystem.layer({ run: RUN }).pipe(Layer.provideMerge(Nats.layer({ url, nkeyFile: seedFile(dir, "echo-host") })))
    const at = new Date("2026-01-02T03:04:05.000Z")
    const { answer, spawned, typed, raw } = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const node = yield* startNode({ name: "n1", types: [echo] })
          const spawned = spawnPlan(EchoRun, []).filter((s) => s.kind === Echo.kind)
          for (const s of spawned) yield* node.spawn(s.kind, s.id)
          const answer = yield* system.ask(Echo.ref("main"), "Echo", { text: "hi", at })
          yield* system.tell(Echo.ref("main"), "Note", { text: "noted", at })
          const notes = (protocols: Parameters<typeof readJournal>[1]) =>
            readJournal(system, protocols).pipe(
              Stream.filter((e) => e.via === "tell" && e.actor?.kind === "echo"),
              Stream.runCollect,
              Effect.map((c) => [...c])
            )
          const typed = yield* notes({ protocols: protocolsOf(EchoRun) })
          const raw = yield* notes({ protocols: protocolsOf(RunTopology) })
          yield* node.drain
          return { answer, spawned, typed, raw }
        })
      ).pipe(Effect.provide(layer))
    )
    expect(spawned).toEqual([{ kind: "echo", id: "main" }])
    expect(answer).toBe("hi @ 2026-01-02T03:04:05.000Z")
    expect(typed).toHaveLength(1)
    expect(typed[0]!.error).toBeUndefined()
    expect((typed[0]!.payload as { at: unknown }).at).toEqual(at)
    expect((raw[0]!.payload as { at: unknown }).at).toBe("2026-01-02T03:04:05.000Z")
  })

  it("another role may not answer its asks", async () => {
    const refused = async (user: string) => {
      const nc: NatsConnection = await connect({ servers: url, ...clientAuth(seedFile(dir, user), user), maxReconnectAttempts: 0 })
      let denied = false
      nc.subscribe(`gyre.${RUN}.ask.echo.main`, { queue: "gyre", callback: (err) => void (err !== null && (denied = true)) })
      await nc.flush()
      await new Promise((r) => setTimeout(r, 300))
      await nc.close()
      return denied
    }
    expect(await refused("gateway")).toBe(true)
    expect(await refused("echo-host")).toBe(false)
  })
})
