/**
 * The run's topology as one typed value: every actor kind with its protocol (a definition,
 * `src/runtime/kind.ts`; implementations live in `src/actors`), every channel the kinds use as a
 * subject family or object store with its codec (`src/runtime/channel.ts`), every NATS role
 * (the kinds it hosts and talks to, the channels it publishes, subscribes and writes), and what
 * a hosted run (`gyre train`, `gyre demo`) spawns of each kind.
 *
 * Derived from it, never written twice: NATS permissions (`roles.ts`), the journal's decoders
 * (`protocolsOf`, `src/replay/read.ts`), the run host's actor types and spawns (`implement`,
 * `spawnPlan`, `src/cli/run-host.ts`) and ARCHITECTURE.md's channel table (`channelTable`,
 * checked by test/topology). Adding a kind to a run is one edit here: the compiler then asks
 * the run host for its implementation (`implement` wants one per hosted kind), and its role's
 * permissions, replay's decoding and its spawn follow (test/topology/extend.test.ts,
 * examples/topology-kind.ts).
 */
import { Schema } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { ActorType } from "../runtime/actor.ts"
import * as Channel from "../runtime/channel.ts"
import { runtimeEvents } from "../runtime/events.ts"
import * as Kind from "../runtime/kind.ts"
import { InvalidAddress } from "../runtime/names.ts"
import { NodeProtocol } from "../runtime/node.ts"
import { refOf } from "../runtime/system.ts"
import { CallRecord } from "../tree/record.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { DeviceProtocol, MicroBatchRef } from "./device.ts"
import { GatewayProtocol } from "./gateway.ts"
import { HarnessRunnerProtocol } from "./harness.ts"
import { RolloutWorkerProtocol, TokenChunk } from "./rollout.ts"
import { RunConfig } from "./run.ts"
import { PolicyRecord, SchedulerProtocol, StepMetrics } from "./scheduler.ts"

// ---- kinds ----------------------------------------------------------------------------------

export const Scheduler = Kind.make("scheduler", SchedulerProtocol)
export const Device = Kind.make("device", DeviceProtocol)
export const Gateway = Kind.make("gateway", GatewayProtocol)
export const HarnessRunner = Kind.make("harness-runner", HarnessRunnerProtocol)
export const RolloutWorker = Kind.make("rollout-worker", RolloutWorkerProtocol)
/** The runtime's node actor (spawning, stopping): every host answers and addresses it. */
export const Node = Kind.make("node", NodeProtocol)

export type SchedulerRef = ReturnType<typeof Scheduler.ref>
export type DeviceRef = ReturnType<typeof Device.ref>
export type GatewayRef = ReturnType<typeof Gateway.ref>
export type HarnessRunnerRef = ReturnType<typeof HarnessRunner.ref>
export type RolloutWorkerRef = ReturnType<typeof RolloutWorker.ref>

/** The kinds that answer the rollout worker's requests: rollout workers (`gyre serve`) and devices (whose protocol adds to it). */
export const rolloutServers = [RolloutWorker, Device] as const

/**
 * A rollout server by its registry key, `rollout-worker/<id>` or `device/<id>`: a reference to
 * its rollout requests. Throws `InvalidAddress` for a key of another kind.
 */
export const rolloutServerRef = (key: string): RolloutWorkerRef => {
  const kind = rolloutServers.find((k) => key.startsWith(`${k.kind}/`))
  if (kind === undefined) throw new InvalidAddress({ address: key, message: `'${key}' is not a ${rolloutServers.map((k) => k.kind).join(" or ")}` })
  return refOf(RolloutWorkerProtocol, kind.address(key.slice(kind.kind.length + 1)))
}

// ---- channels -------------------------------------------------------------------------------

export const Calls = Channel.subjects({
  name: "calls", token: "calls", transport: "stream", stream: "TRAJECTORIES", key: "<execution>", codec: CallRecord,
  doc: "one delta-encoded `CallRecord` per model call (src/tree/record.ts; in parts when too long, record-parts.ts)"
})
export const Outcomes = Channel.subjects({
  name: "outcomes", token: "outcomes", transport: "stream", stream: "TRAJECTORIES", key: "<execution>", codec: ExecutionOutcome,
  doc: "the execution's `ExecutionOutcome` (src/tree/outcome.ts)"
})
export const MicroBatches = Channel.subjects({
  name: "micro-batches", token: "mb", transport: "work-queue", stream: "MICROBATCHES", key: "<step>", codec: MicroBatchRef,
  doc: "the step's micro-batches by reference (`MicroBatchRef`), one shared durable consumer `mb-<step>` per step"
})
export const Tokens = Channel.subjects({
  name: "tokens", token: "tokens", transport: "core", key: "<request>", codec: TokenChunk,
  doc: "streamed chunks of one generation (`TokenChunk`), for `stream: true`"
})
export const Weights = Channel.objects({
  name: "weights", bucket: "weights", object: "v<version>, opt-v<version>",
  format: "a version's `model.safetensors` (F32, Hugging Face names) and the core's AdamW state after it"
})
export const Batches = Channel.objects({
  name: "batches", bucket: "batches", object: "s<step>.a<attempt>.m<index>", format: "one micro-batch's packed arrays (src/training/microbatch-store.ts)"
})
export const Gradients = Channel.objects({
  name: "gradients", bucket: "grads", object: "s<step>.a<attempt>.m<index>", format: "one micro-batch's gradient and token log-probs (flat F32, little-endian)"
})
export const KvHandoff = Channel.objects({
  name: "kv", bucket: "kv", object: "p.<id>, o.<id>, h.<id>",
  format: "the transfer store (transfer.ts): a long prompt, a long answer, a KV hand-off's tokens and GYKV buffer"
})

/** What `gyre.<run>.sys.run-done` holds: the run's audit (src/scheduling/audit.ts) with its name, policy and wall time. */
export interface RunDone {
  readonly run: string
  readonly policy: string
  readonly wallS: number
}
const RunDoneSchema = Schema.declare((u: unknown): u is RunDone => {
  const o = u as Partial<RunDone> | null
  return typeof o === "object" && o !== null && typeof o.run === "string" && typeof o.policy === "string" && typeof o.wallS === "number"
})

/** The RL parts' system events (the runtime's are `runtimeEvents`). */
export const Events = {
  runConfig: Channel.event("run-config", Schema.toCodecJson(RunConfig), "the run's `RunConfig`, once, by the first leader"),
  policy: Channel.event("policy", Schema.toCodecJson(PolicyRecord), "one `PolicyRecord` per policy step, before its actions run"),
  step: Channel.event("step", StepMetrics, "each step's `StepMetrics`, by the core trainer"),
  runDone: Channel.event("run-done", RunDoneSchema, "the run's summary (`RunSummary`), after the last `StepDone`")
}

// ---- roles and the topology -----------------------------------------------------------------

/** A NATS role: what a user holding it may host, address, publish, subscribe and write. */
export interface RoleSpec {
  /** Kinds whose asks it answers (`any`: every kind, for actor types Gyre does not know). */
  readonly hosts: ReadonlyArray<Kind.AnyKind> | "any"
  /** Kinds it asks and tells (the node kind always). */
  readonly talksTo: ReadonlyArray<Kind.AnyKind> | "any"
  readonly publishes: ReadonlyArray<Channel.SubjectChannel<any>>
  readonly subscribes: ReadonlyArray<Channel.SubjectChannel<any>>
  /** Object stores it creates, writes and purges. */
  readonly writes: ReadonlyArray<Channel.ObjectChannel>
  /** Why, for the docs. */
  readonly doc: string
}

/** What a hosted run spawns of a kind: one actor of this id, one per device of the node, or a candidate standing by for the run's lease. */
export type Spawn = { readonly _tag: "Singleton"; readonly id: string } | { readonly _tag: "PerDevice" } | { readonly _tag: "Leased" }
export const singleton = (id: string): Spawn => ({ _tag: "Singleton", id })
export const perDevice: Spawn = { _tag: "PerDevice" }
export const leased: Spawn = { _tag: "Leased" }

/** Kinds keyed by their own names (the compiler checks the key is the kind). */
export type Kinds<K> = { readonly [N in keyof K]: Kind.AnyKind & { readonly kind: N } }

export interface Topology<K extends Readonly<Record<string, Kind.AnyKind>>, Ro extends string, H extends keyof K & string> {
  readonly kinds: K
  /** `observer` reads only; every other role also hosts (creates streams, heartbeats, system events). */
  readonly roles: { readonly [R in Ro]: RoleSpec }
  /** Users besides one per role: the unions Gyre's commands connect as. */
  readonly users: Readonly<Record<string, ReadonlyArray<NoInfer<Ro>>>>
  readonly channels: ReadonlyArray<Channel.SubjectChannel<any> | Channel.ObjectChannel>
  readonly events: ReadonlyArray<Channel.EventChannel<any>>
  readonly hosted: { readonly [N in H]: Spawn }
}

export type AnyTopology = Topology<any, string, string>
export type RoleOf<T> = T extends Topology<any, infer Ro, any> ? Ro : never

const kindsOfRole = (spec: RoleSpec, kinds: Readonly<Record<string, Kind.AnyKind>>, role: string) => {
  for (const k of [spec.hosts, spec.talksTo].flatMap((ks) => (ks === "any" ? [] : ks)))
    if (kinds[k.kind] !== k) throw new Error(`role ${role} names kind ${k.kind}, which is not in the topology`)
}

/** A topology, checked: every kind a role names is one of its kinds. */
export const make = <const K extends Kinds<K>, const Ro extends string, const H extends keyof K & string>(t: Topology<K, Ro, H>): Topology<K, Ro, H> => {
  for (const [role, spec] of Object.entries<RoleSpec>(t.roles)) kindsOfRole(spec, t.kinds, role)
  return t
}

/** `base` with more kinds, roles, users, channels, events and hosted kinds. */
export const extend = <
  K extends Readonly<Record<string, Kind.AnyKind>>,
  Ro extends string,
  H extends keyof K & string,
  const K2 extends Kinds<K2>,
  const Ro2 extends string,
  const H2 extends keyof (K & K2) & string
>(
  base: Topology<K, Ro, H>,
  more: {
    readonly kinds: K2
    readonly roles: { readonly [R in Ro2]: RoleSpec }
    readonly users?: Readonly<Record<string, ReadonlyArray<NoInfer<Ro | Ro2>>>>
    readonly channels?: ReadonlyArray<Channel.SubjectChannel<any> | Channel.ObjectChannel>
    readonly events?: ReadonlyArray<Channel.EventChannel<any>>
    readonly hosted: { readonly [N in H2]: Spawn }
  }
): Topology<K & K2, Ro | Ro2, H | H2> =>
  make<any, Ro | Ro2, any>({
    kinds: { ...base.kinds, ...more.kinds },
    roles: { ...base.roles, ...more.roles } as { readonly [R in Ro | Ro2]: RoleSpec },
    users: { ...base.users, ...more.users },
    channels: [...base.channels, ...(more.channels ?? [])],
    events: [...base.events, ...(more.events ?? [])],
    hosted: { ...base.hosted, ...more.hosted } as { readonly [N in H | H2]: Spawn }
  }) as Topology<K & K2, Ro | Ro2, H | H2>

/** The topology of a Gyre training run. */
export const RunTopology = make({
  kinds: { scheduler: Scheduler, device: Device, gateway: Gateway, "harness-runner": HarnessRunner, "rollout-worker": RolloutWorker },
  roles: {
    "rollout-worker": {
      hosts: [RolloutWorker, Device], talksTo: [Gateway, Scheduler, Device], publishes: [Tokens], subscribes: [], writes: [KvHandoff],
      doc: "answers generations (the only role in the workers' queue group), streams tokens, hands KV contexts over, reports to the scheduler"
    },
    trainer: {
      hosts: [Device], talksTo: [Scheduler, Device], publishes: [MicroBatches], subscribes: [], writes: [Weights, Batches, Gradients, KvHandoff],
      doc: "publishes micro-batches, gradients and weights; talks to the core and the scheduler"
    },
    scheduler: {
      hosts: [Scheduler], talksTo: [Device, HarnessRunner, Scheduler], publishes: [], subscribes: [], writes: [],
      doc: "dispatches executions to runners, steps to devices; its records are `sys` events"
    },
    gateway: {
      hosts: [Gateway], talksTo: [RolloutWorker, Device, Gateway], publishes: [Calls], subscribes: [Tokens], writes: [KvHandoff],
      doc: "the only writer of call records; routes calls to workers and reads their token streams; long prompts and answers travel through the transfer store"
    },
    "harness-runner": {
      hosts: [HarnessRunner], talksTo: [Gateway], publishes: [Outcomes], subscribes: [], writes: [],
      doc: "the only writer of outcomes; opens and closes executions at the gateway"
    },
    observer: { hosts: [], talksTo: [], publishes: [], subscribes: [], writes: [], doc: "reads streams and buckets through consumers; publishes nothing" },
    "actor-host": {
      hosts: "any", talksTo: "any", publishes: [], subscribes: [], writes: [],
      doc: "the runtime's generic role for actor types Gyre does not know (tests, user modules)"
    }
  },
  users: {
    serve: ["gateway", "rollout-worker"],
    "device-node": ["rollout-worker", "trainer"],
    train: ["rollout-worker", "trainer", "scheduler", "gateway", "harness-runner"]
  },
  channels: [Calls, Outcomes, MicroBatches, Tokens, Weights, Batches, Gradients, KvHandoff],
  events: [...runtimeEvents, Events.runConfig, Events.policy, Events.step, Events.runDone],
  hosted: { gateway: singleton("main"), "harness-runner": singleton("main"), device: perDevice, scheduler: leased }
})

/** A NATS role of a Gyre run. */
export type NatsRole = RoleOf<typeof RunTopology>

// ---- derivations ----------------------------------------------------------------------------

/** Every kind's protocol, the node's included: what the journal is decoded with. */
export const protocolsOf = (t: AnyTopology): Readonly<Record<string, RpcGroup.RpcGroup<any>>> =>
  Object.fromEntries([...Object.values<Kind.AnyKind>(t.kinds), Node].map((k) => [k.kind, k.protocol as RpcGroup.RpcGroup<any>]))

/** The roles that host actors of `kind` (a kind the topology does not know needs `actor-host`). */
export const rolesOfKind = <T extends AnyTopology>(t: T, kind: string): ReadonlyArray<RoleOf<T>> => {
  const roles = Object.entries<RoleSpec>(t.roles).filter(([, s]) => s.hosts !== "any" && s.hosts.some((k) => k.kind === kind)).map(([r]) => r as RoleOf<T>)
  return roles.length > 0 ? roles : ["actor-host" as RoleOf<T>]
}

/** The addresses a hosted run starts on its node: singletons, and one per device id given (candidates for a lease stand by instead). */
export const spawnPlan = (t: AnyTopology, devices: ReadonlyArray<string>): ReadonlyArray<{ readonly kind: string; readonly id: string }> =>
  Object.entries<Spawn>(t.hosted).flatMap(([kind, s]) =>
    s._tag === "Singleton" ? [{ kind, id: s.id }] : s._tag === "PerDevice" ? devices.map((id) => ({ kind, id })) : []
  )

/** The ids of a hosted kind's singleton actors (the harness runners a scheduler dispatches to). */
export const hostedIds = <K extends Readonly<Record<string, Kind.AnyKind>>, H extends keyof K & string>(t: Topology<K, any, H>, kind: H): ReadonlyArray<string> => {
  const s: Spawn = t.hosted[kind]
  return s._tag === "Singleton" ? [s.id] : []
}

/** One implementation per hosted kind, speaking that kind's protocol. */
export type Implementations<T> =
  T extends Topology<infer K, any, infer H> ? { readonly [N in H]: ActorType<Kind.RequestsOf<K[N]>, any, any> } : never

/** The actor types a hosted run's node offers, one per hosted kind, in the topology's order. */
export const implement = <T extends AnyTopology, I extends Implementations<T>>(t: T, impls: I): ReadonlyArray<I[keyof I]> =>
  Object.keys(t.hosted).map((kind) => {
    const impl = impls[kind as keyof I]
    if ((impl as ActorType<any, any, any>).kind !== kind) throw new Error(`the implementation of ${kind} is a ${(impl as ActorType<any, any, any>).kind}`)
    return impl
  })

const rolesWhere = (t: AnyTopology, has: (s: RoleSpec) => boolean) =>
  Object.entries<RoleSpec>(t.roles).filter(([, s]) => has(s)).map(([r]) => r).join(", ")

/**
 * ARCHITECTURE.md's table of a run's channels (run `R`): each kind's ask and tell subjects with
 * its requests and the roles answering them, each channel with where it travels and who writes
 * it, each system event. test/topology/table.test.ts checks the document holds it as written here.
 */
export const channelTable = (t: AnyTopology): string => {
  const kinds = Object.values<Kind.AnyKind>(t.kinds).map((k) => {
    const requests = [...k.protocol.requests.keys()].join(", ")
    return `| \`gyre.R.{ask,tell}.${k.kind}.<id>\` | asks (core NATS), tells (journal) | ${rolesWhere(t, (s) => s.hosts !== "any" && s.hosts.includes(k))} | ${requests} |`
  })
  const channels = t.channels.map((c) =>
    c._tag === "Subjects"
      ? `| \`gyre.R.${c.token}.${c.key}\` | ${c.stream === undefined ? "core NATS" : `stream \`GYRE_R_${c.stream}\`${c.transport === "work-queue" ? " (work queue)" : ""}`} | ${rolesWhere(t, (s) => s.publishes.includes(c))} | ${c.doc} |`
      : `| \`GYRE_R_${c.bucket}\` | object store: \`${c.object}\` | ${rolesWhere(t, (s) => s.writes.includes(c))} | ${c.format} |`
  )
  const events = t.events.map((e) => `| \`gyre.R.sys.${e.name}\` | journal | any host | ${e.doc} |`)
  return ["| subject or store | travels | roles (answering a kind, writing a channel) | contents |", "| --- | --- | --- | --- |", ...kinds, ...channels, ...events].join("\n")
}
