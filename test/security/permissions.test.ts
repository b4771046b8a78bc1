/**
 * The per-role NATS users of `gyre auth init` on a real nats-server: anonymous and unknown
 * keys are refused; each out-of-role publish or subscribe (forged call records and outcomes,
 * the impostor joining the rollout workers' queue group, spawning, reading another user's
 * replies, deleting a stream) is refused, counted attempt by attempt; the same operations in
 * role succeed (so a test that refused everything would fail).
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { connect, nkeys, nkeyAuthenticator, type NatsConnection } from "@nats-io/transport-node"
import { jetstreamManager } from "@nats-io/jetstream"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { embeddedNats } from "../../src/cli/auth.ts"
import { TRAIN_KINDS } from "../../src/cli/train.ts"
import { defaultUsers } from "../../src/protocols/roles.ts"
import { RESPONSE_EXPIRY_S, clientAuth, seedFile, serverConfigOf, writeAuthDir } from "../../src/runtime/auth.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"

const RUN = "sec"
let url = ""
let dir = ""
let close: () => Promise<void> = async () => undefined

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-auth-"))
  await Effect.runPromise(writeAuthDir(dir, defaultUsers("*")))
  const { Scope, Exit } = await import("effect")
  const scope = Effect.runSync(Scope.make())
  const server = await Effect.runPromise(startEmbeddedServer({ extraConfig: serverConfigOf(dir) }).pipe(Scope.provide(scope)))
  url = server.url
  close = () => Effect.runPromise(Scope.close(scope, Exit.void))
}, 60_000)
afterAll(() => close())

const as = (user: string) => connect({ servers: url, ...clientAuth(seedFile(dir, user), user), maxReconnectAttempts: 0 })

/** Permission errors the server sent this connection, as subjects. */
const violations = (nc: NatsConnection) => {
  const seen: Array<string> = []
  void (async () => {
    for await (const s of nc.status()) if (s.type === "error") seen.push(String((s as { error?: unknown }).error))
  })()
  return seen
}

const settle = (ms = 300) => new Promise((r) => setTimeout(r, ms))

/** Publishes and reports whether the server refused it. */
const publishRefused = async (user: string, subject: string) => {
  const nc = await as(user)
  const seen = violations(nc)
  nc.publish(subject, "forged")
  await nc.flush()
  await settle()
  await nc.close()
  return seen.some((e) => e.includes("Permissions Violation") && e.includes(subject))
}

/** Subscribes (in queue group `gyre`) and reports whether the server refused it. */
const subscribeRefused = async (user: string, subject: string) => {
  const nc = await as(user)
  let refused = false
  nc.subscribe(subject, { queue: "gyre", callback: (err) => void (err !== null && (refused = true)) })
  await nc.flush()
  await settle()
  await nc.close()
  return refused
}

const attempts: Array<{ what: string; refused: boolean }> = []
const attempt = async (what: string, refused: Promise<boolean>) => {
  attempts.push({ what, refused: await refused })
}

describe("per-role NATS permissions", () => {
  it("refuses anonymous connections and keys it does not know", async () => {
    const anonymous = await connect({ servers: url, maxReconnectAttempts: 0 }).then(() => "connected", (e: Error) => e.message)
    const stranger = nkeys.createUser()
    const unknown = await connect({ servers: url, authenticator: nkeyAuthenticator(stranger.getSeed()), maxReconnectAttempts: 0 }).then(() => "connected", (e: Error) => e.message)
    expect(anonymous).toMatch(/Authorization/i)
    expect(unknown).toMatch(/Authorization/i)
  })

  it("gyre train's embedded server admits only these users: the train process connects as `train`", async () => {
    const saved = { url: process.env.NATS_URL, auth: process.env.GYRE_AUTH_DIR }
    process.env.GYRE_AUTH_DIR = dir
    delete process.env.NATS_URL
    try {
      const options = await Effect.runPromise(embeddedNats({ name: "t", run: RUN, node: "main", kinds: TRAIN_KINDS, store: path.join(dir, "store") }))
      expect(options.auth).toEqual({ dir, user: "train" })
      expect(options.storeDir).toBe(path.join(dir, "store"))
    } finally {
      if (saved.url !== undefined) process.env.NATS_URL = saved.url
      if (saved.auth === undefined) delete process.env.GYRE_AUTH_DIR
      else process.env.GYRE_AUTH_DIR = saved.auth
    }
  })

  it("refuses every out-of-role publish and subscribe, the impostor of the workers' queue group included", { timeout: 120_000 }, async () => {
    const base = `gyre.${RUN}`
    await attempt("observer forges a call record", publishRefused("observer", `${base}.calls.e1`))
    await attempt("harness runner forges a call record", publishRefused("harness-runner", `${base}.calls.e1`))
    await attempt("gateway forges an outcome", publishRefused("gateway", `${base}.outcomes.e1`))
    await attempt("rollout worker forges an outcome", publishRefused("rollout-worker", `${base}.outcomes.e1`))
    await attempt("rollout worker publishes a micro-batch", publishRefused("rollout-worker", `${base}.mb.1`))
    await attempt("observer tells the scheduler", publishRefused("observer", `${base}.tell.scheduler.main`))
    await attempt("observer asks a node to spawn", publishRefused("observer", `${base}.ask.node.a`))
    await attempt("harness runner asks a rollout worker", publishRefused("harness-runner", `${base}.ask.rollout-worker.a.cpu0`))
    await attempt("gateway replies into another user's inbox", publishRefused("gateway", "_I.harness-runner.x.1"))
    await attempt("harness runner joins the workers' queue group", subscribeRefused("harness-runner", `${base}.ask.rollout-worker.a.cpu0`))
    await attempt("gateway joins the workers' queue group", subscribeRefused("gateway", `${base}.ask.rollout-worker.>`))
    await attempt("observer joins the workers' queue group", subscribeRefused("observer", `${base}.ask.rollout-worker.>`))
    await attempt("gateway answers the harness runner's asks", subscribeRefused("gateway", `${base}.ask.harness-runner.main`))
    await attempt("scheduler answers the gateway's asks", subscribeRefused("scheduler", `${base}.ask.gateway.main`))
    await attempt("observer deletes an actor's durable consumer", publishRefused("observer", `$JS.API.CONSUMER.DELETE.GYRE_${RUN}_JOURNAL.ledger__l1`))
    await attempt("gateway reads another user's replies", subscribeRefused("gateway", "_I.harness-runner.>"))
    await attempt("observer reads every inbox", subscribeRefused("observer", "_INBOX.>"))
    for (const user of ["rollout-worker", "trainer", "scheduler", "gateway", "harness-runner", "observer", "actor-host", "train"]) {
      await attempt(`${user} deletes the trajectory stream`, publishRefused(user, `$JS.API.STREAM.DELETE.GYRE_${RUN}_TRAJECTORIES`))
      await attempt(`${user} deletes a journal message`, publishRefused(user, `$JS.API.STREAM.MSG.DELETE.GYRE_${RUN}_JOURNAL`))
    }
    const refusals = attempts.filter((a) => a.refused).length
    console.log(JSON.stringify({ permission_attempts: attempts.length, permission_refusals: refusals }))
    const file = process.env.GYRE_CHAOS_PERMISSIONS
    if (file !== undefined) fs.writeFileSync(file, JSON.stringify({ permission_attempts: attempts.length, permission_refusals: refusals }))
    expect(attempts.filter((a) => !a.refused).map((a) => a.what)).toEqual([])
    expect(refusals).toBe(attempts.length)
  })

  it("lets every user answer a request long after it came (nats-server's default allows 2 minutes; gyre eval waits 60)", async () => {
    const conf = serverConfigOf(dir)
    const users = conf.match(/nkey: /g)?.length ?? 0
    expect(users).toBe(defaultUsers("*").length)
    expect(conf.match(/allow_responses: \{ max: 1, expires: "(\d+)s" \}/g)?.length).toBe(users)
    expect(RESPONSE_EXPIRY_S).toBeGreaterThanOrEqual(60 * 60)
    // The server runs on this configuration (beforeAll), and an answer within it arrives.
    const [asker, answerer] = [await as("train"), await as("harness-runner")]
    answerer.subscribe(`gyre.${RUN}.ask.harness-runner.main`, { callback: (_e, m) => void setTimeout(() => m.respond("done"), 500) })
    await answerer.flush()
    expect((await asker.request(`gyre.${RUN}.ask.harness-runner.main`, "run", { timeout: 5000 })).string()).toBe("done")
    await Promise.all([asker.close(), answerer.close()])
  })

  it("allows the same operations in role: records by the gateway, outcomes by the runner, the workers' queue group by workers", async () => {
    const base = `gyre.${RUN}`
    expect(await publishRefused("gateway", `${base}.calls.e1`)).toBe(false)
    expect(await publishRefused("harness-runner", `${base}.outcomes.e1`)).toBe(false)
    expect(await publishRefused("trainer", `${base}.mb.1`)).toBe(false)
    expect(await subscribeRefused("rollout-worker", `${base}.ask.rollout-worker.a.cpu0`)).toBe(false)
    expect(await subscribeRefused("serve", `${base}.ask.gateway.main`)).toBe(false)
    // The observer reads streams: create one as a host, read its info as the observer.
    const host = await as("gateway")
    const jsm = await jetstreamManager(host, { checkAPI: false })
    await jsm.streams.add({ name: `GYRE_${RUN}_TRAJECTORIES`, subjects: [`${base}.calls.>`, `${base}.outcomes.>`] })
    await host.close()
    const observer = await as("observer")
    const info = await (await jetstreamManager(observer, { checkAPI: false })).streams.info(`GYRE_${RUN}_TRAJECTORIES`)
    await observer.close()
    expect(info.config.name).toBe(`GYRE_${RUN}_TRAJECTORIES`)
  })
})
