/**
 * `gyre node`: hosts actors on this machine.
 *
 * Connects to NATS_URL (or starts the embedded nats-server when unset: supervised, its store
 * kept in `--store` or `.gyre/nats/<run>.<name>`, admitting only the users of `.gyre/auth`;
 * see `auth.ts`), joins run `--run`,
 * loads actor types from `--load` modules (each exports actor types: any export that is an
 * `ActorType`), spawns `--spawn` actors, and serves spawn requests until SIGTERM or SIGINT,
 * on which it drains: in-flight messages finish, buffered ones go back to JetStream.
 * `--device-ids a,b` names the devices this node offers (for actors placed on a device).
 * `--pace` paces this node's devices (`pace.ts`; default: the run's configuration's pace).
 * `--devices K` joins a `gyre train` run as K more devices (`device/<name>.<backend><i>`, each with
 * the training role; K CPU devices split the cores): it waits for the run's configuration in the
 * journal, loads its checkpoint (the run's published copy when that path is not on this machine:
 * `shared-checkpoint.ts`) and announces the devices to the run's scheduler, which uses them
 * from then on.
 * `--listen HOST[:PORT]` puts the embedded server on that interface and logs how another machine
 * joins (`join.ts`; also `join` in the ready line).
 * `--scheduler` stands by as a candidate for the scheduler of the training run `--run` (its
 * configuration read from the journal, its train tasks from the suite in `--suites`): it hosts
 * `scheduler/main` while it holds the run's lease, and takes over when the leader's node dies.
 * `--metrics-port N` serves Prometheus `/metrics` on 127.0.0.1:N (0 = any free port).
 * Settings not given as flags come from the runtime's `Config` (GYRE_HEARTBEAT_MS, ...:
 * src/runtime/config.ts).
 *
 * Stdout carries two status lines for scripts and tests, `{"event":"ready",...}` once it is
 * serving (with the metrics URL when there is one) and `{"event":"drained",...}` before it
 * exits; every log line goes through the one logger (GYRE_LOG_FORMAT=json|pretty) on stderr.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { pathToFileURL } from "node:url"
import * as os from "node:os"
import { Effect, Fiber, Layer, Schedule } from "effect"
import { cpuDeviceThreads, device } from "../actors/device.ts"
import { makeScheduler, schedulerRef } from "../actors/scheduler.ts"
import { trainingRoleFor } from "../actors/trainer.ts"
import { Engine } from "../engine/engine.ts"
import { loadSuite, trainTaskIds } from "../harness/suites.ts"
import { DEVICE_KIND } from "../protocols/device.ts"
import { SCHEDULER_KIND } from "../protocols/scheduler.ts"
import { readRunConfig } from "../scheduling/records.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { ActorType } from "../runtime/actor.ts"
import { Nats } from "../runtime/nats.ts"
import { observabilityLayer } from "../runtime/observability.ts"
import { formatAddress, parseAddress } from "../runtime/names.ts"
import { repoRoot } from "../runtime/nats-server.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem } from "../runtime/system.ts"
import { UsageError, parseConfigured, type Command, type Flags } from "./args.ts"
import { checkListen, checkPort } from "./checks.ts"
import { checkKvFlags, nodeKvFlags } from "./kv.ts"
import { checkPaceFlag, nodePaceFlag } from "./pace.ts"
import type { Pace } from "../protocols/pace.ts"
import { embeddedNats } from "./auth.ts"
import { joinLines, joinOf } from "./join.ts"
import { serveUntilStopped } from "./lifetime.ts"
import { RUN_RUNNERS } from "./run-host.ts"
import { onThisMachine } from "./shared-checkpoint.ts"

const flags = {
  name: { kind: "string", doc: "node name (unique in the run)", default: os.hostname().replace(/[^A-Za-z0-9_-]/g, "-") },
  run: { kind: "string", doc: "run id that namespaces streams, subjects and buckets", default: "default" },
  load: { kind: "string", doc: "comma-separated modules whose exported actor types this node hosts" },
  spawn: { kind: "string", doc: "comma-separated kind/id actors to spawn at start" },
  "device-ids": { kind: "string", doc: "comma-separated device ids this node offers (for actors placed on a device)" },
  "heartbeat-ms": { kind: "integer", doc: "registry heartbeat interval (default GYRE_HEARTBEAT_MS or 1000)" },
  "dead-after-ms": { kind: "integer", doc: "silence after which an actor is declared dead (default GYRE_DEAD_AFTER_MS or 5000)" },
  "ack-wait-ms": { kind: "integer", doc: "JetStream ack wait of actor consumers (default GYRE_ACK_WAIT_MS or 10000)" },
  devices: { kind: "integer", doc: "host this many device actors of the training run --run (its configuration read from the run's journal)", default: 0 },
  scheduler: { kind: "boolean", doc: "stand by as a scheduler candidate of the training run --run (it leads while it holds the run's lease)", default: false },
  suites: { kind: "string", doc: "--scheduler: directory holding the run's suite", default: path.join(repoRoot, "suites") },
  store: { kind: "string", doc: "store directory of the embedded nats-server (default .gyre/nats/<run>.<name>, kept across restarts)" },
  listen: { kind: "string", doc: "the embedded nats-server listens on HOST[:PORT] (default port 4222, 0: any free one; 0.0.0.0: every interface) instead of loopback; how another machine joins is logged and in the ready line (join)" },
  "metrics-port": { kind: "integer", doc: "serve Prometheus /metrics on 127.0.0.1 at this port, 0 = any free one (default GYRE_METRICS_PORT or off)" },
  ...nodeKvFlags,
  ...nodePaceFlag
} as const

const isActorType = (v: unknown): v is ActorType<any, any, never> =>
  typeof v === "object" && v !== null && "kind" in v && "protocol" in v && "behaviour" in v && "supervision" in v

export const loadActorTypes = async (modules: ReadonlyArray<string>): Promise<Array<ActorType<any, any, never>>> => {
  const types: Array<ActorType<any, any, never>> = []
  for (const m of modules) {
    if (!fs.existsSync(path.resolve(m))) throw new UsageError(`gyre node: --load ${m}: no such file`)
    const mod = (await import(pathToFileURL(path.resolve(m)).href)) as Record<string, unknown>
    const found = Object.values(mod).filter(isActorType)
    if (found.length === 0) throw new UsageError(`gyre node: --load ${m} exports no actor type`)
    types.push(...found)
  }
  return types
}

const list = (s: string | undefined) => (s ?? "").split(",").map((x) => x.trim()).filter((x) => x !== "")

/** The configuration of the training run this node's system belongs to, once it is journaled. */
const journaledConfig = (system: ActorSystemShape) =>
  readRunConfig(system).pipe(
    Effect.flatMap((c) => (c === undefined ? Effect.fail("waiting" as const) : Effect.succeed(c))),
    Effect.retry({ while: (e) => e === "waiting", schedule: Schedule.spaced("500 millis") })
  )

/** A scheduler candidate of the training run (its type, and the stand-by loop to fork once the node runs). */
const schedulerCandidate = (system: ActorSystemShape, suitesDir: string) =>
  Effect.gen(function* () {
    const config = yield* journaledConfig(system)
    const suite = yield* loadSuite(suitesDir, config.suite)
    return makeScheduler({ config, trainTasks: trainTaskIds(suite), runners: RUN_RUNNERS })
  })

/**
 * The device type of the training run this node's system belongs to, once its configuration is
 * journaled; `kv` and `pace` (this node's flags) override the run's KV pool and pace.
 */
const trainingDevices = (system: ActorSystemShape, count: number, kv: ReturnType<typeof checkKvFlags>, pace: Pace | undefined) =>
  Effect.gen(function* () {
    const config = yield* onThisMachine(system, yield* journaledConfig(system))
    const engine = yield* Engine
    const threads = yield* cpuDeviceThreads(engine, count)
    const type = device({
      checkpoint: config.checkpoint,
      kvDtype: kv.kvDtype ?? config.kvDtype,
      numBlocks: kv.kvBlocks ?? config.kvBlocks,
      pace: pace ?? config.pace,
      maxBatch: 64,
      scheduler: schedulerRef,
      training: trainingRoleFor(config),
      threads
    })
    return { type, backend: engine.backend }
  })

/** One status line on stdout. */
const status = (line: Record<string, unknown>) => Effect.sync(() => void process.stdout.write(`${JSON.stringify(line)}\n`))

type NodeFlags = Flags<typeof flags>

/** The flags, checked before anything starts (a bad one is a `UsageError`), and the actor types of `--load`. */
const checkedFlags = async (f: NodeFlags) => {
  const spawns = list(f.spawn).map((a) => {
    try {
      return parseAddress(a)
    } catch (e) {
      throw new UsageError(`gyre node: --spawn ${a}: ${(e as Error).message}`)
    }
  })
  if (f.devices < 0) throw new UsageError(`gyre node: --devices must be at least 0, got ${f.devices}`)
  if (f["metrics-port"] !== undefined) await checkPort("node", "127.0.0.1", f["metrics-port"], "--metrics-port")
  const kv = checkKvFlags("node", f)
  // Actors of --load modules read their configuration from the environment (GYRE_KV_BLOCKS, GYRE_KV_DTYPE, GYRE_PACE).
  if (kv.kvBlocks !== undefined) process.env.GYRE_KV_BLOCKS = String(kv.kvBlocks)
  if (kv.kvDtype !== undefined) process.env.GYRE_KV_DTYPE = kv.kvDtype
  const pace = checkPaceFlag("node", f.pace)
  if (pace !== undefined) process.env.GYRE_PACE = f.pace!
  const types = await loadActorTypes(list(f.load))
  const kinds = [...types.map((t) => t.kind), ...(f.devices > 0 ? [DEVICE_KIND] : []), ...(f.scheduler ? [SCHEDULER_KIND] : [])]
  for (const a of spawns) {
    if (!kinds.includes(a.kind)) throw new UsageError(`gyre node: --spawn ${formatAddress(a)}: no actor type '${a.kind}' on this node (its types: ${kinds.join(", ") || "none"}; --load a module that exports it)`)
  }
  const listen = f.listen === undefined ? undefined : await checkListen("node", f.listen)
  return { spawns, kv, pace, types, kinds, listen }
}

type Checked = Awaited<ReturnType<typeof checkedFlags>>

/** The `ready` status line: where this node serves, what it hosts, its metrics URL and how another machine joins. */
const readyLine = (f: NodeFlags, system: ActorSystemShape, hosted: ReadonlyArray<{ readonly kind: string }>, metricsUrl: string | undefined, join: unknown) => ({
  event: "ready",
  node: f.name,
  run: f.run,
  nats: system.nats.servers,
  embedded: system.nats.embedded,
  ...(system.nats.server !== undefined ? { natsPid: system.nats.server.pid, store: system.nats.server.storeDir } : {}),
  types: hosted.map((t) => t.kind),
  ...(metricsUrl !== undefined ? { metrics: metricsUrl } : {}),
  ...(join !== undefined ? { join } : {})
})

/** Hosts the node's actors until SIGTERM or SIGINT, then drains (the module comment). */
const serveNode = (f: NodeFlags, c: Checked, auth: { readonly dir: string } | undefined) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const join = c.listen === undefined || system.nats.server === undefined ? undefined : yield* joinOf({ urls: system.nats.server.urls, host: c.listen.host, run: f.run, auth })
    if (join !== undefined) yield* Effect.logInfo(joinLines(join).join("\n"))
    const devices = f.devices > 0 ? yield* trainingDevices(system, f.devices, c.kv, c.pace) : undefined
    const scheduler = f.scheduler ? yield* schedulerCandidate(system, f.suites) : undefined
    const hosted = [...c.types, ...(devices === undefined ? [] : [devices.type]), ...(scheduler === undefined ? [] : [scheduler.type])]
    const node = yield* startNode({
      name: f.name,
      types: hosted,
      devices: list(f["device-ids"]),
      ...(f["heartbeat-ms"] !== undefined ? { heartbeatMs: f["heartbeat-ms"] } : {}),
      ...(f["dead-after-ms"] !== undefined ? { deadAfterMs: f["dead-after-ms"] } : {}),
      ...(f["ack-wait-ms"] !== undefined ? { ackWaitMs: f["ack-wait-ms"] } : {}),
      ...(f["metrics-port"] !== undefined ? { metricsPort: f["metrics-port"] } : {})
    })
    for (const a of c.spawns) yield* node.spawn(a.kind, a.id)
    if (devices !== undefined) for (let i = 0; i < f.devices; i++) yield* node.spawn(DEVICE_KIND, `${f.name}.${devices.backend}${i}`)
    const candidate = scheduler === undefined ? undefined : yield* Effect.forkScoped(scheduler.standBy(node, system))
    yield* status(readyLine(f, system, hosted, node.metricsUrl, join))
    yield* Effect.logInfo(`node ${f.name} serving run ${f.run} on ${system.nats.servers}`)
    // the candidate goes first: a scheduler stopped by the drain under it would read as one that gave up
    yield* serveUntilStopped(system.nats, Effect.andThen(candidate === undefined ? Effect.void : Fiber.interrupt(candidate), node.drain))
    yield* status({ event: "drained", node: f.name })
  })

export const command: Command<typeof flags> = {
  summary: "host actors on this machine (embedded nats-server unless NATS_URL is set)",
  configured: true,
  flags,
  run: async (argv) => {
    const f = parseConfigured("node", flags, argv)
    const checked = await checkedFlags(f)
    const nats = await Effect.runPromise(embeddedNats({ name: `gyre-node-${f.name}`, run: f.run, node: f.name, kinds: checked.kinds, store: f.store, listen: checked.listen }))
    const layer = Layer.merge(ActorSystem.layer({ run: f.run }), Engine.layer).pipe(
      Layer.provideMerge(Nats.layer(nats)),
      Layer.provideMerge(observabilityLayer(`gyre-node-${f.name}`))
    )
    await Effect.runPromise(Effect.scoped(serveNode(f, checked, nats.auth)).pipe(Effect.provide(layer)))
    return 0
  }
}
