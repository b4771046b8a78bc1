/**
 * Re-placement: an actor whose entry liveness declared `dead` is placed again on a live node, as
 * the placement policy of its type says, and resumes there from its snapshot and its durable
 * consumer (both are keyed by address, not by node).
 *
 * A policy is a value: `spread` (the live node hosting the fewest actors), `onNode(name)`, or
 * `onDevice(id)` (the live node that lists that device). Every node sweeps its view of the
 * registry: for each `dead` entry of a kind in its own catalogue whose restart type is not
 * `temporary`, it chooses among the live nodes (a `running` `node/<name>` entry that changed
 * within `deadAfterMs`, not draining, listing the kind) and writes a `placing` entry naming the
 * chosen node, with a compare-and-set on the dead entry's revision, so exactly one node
 * re-places it; it publishes a `placed` system event. A node that sees a `placing` entry naming
 * itself spawns the actor, and its claim turns the entry into `running` there. A placement nobody
 * takes up is declared dead again by liveness after `deadAfterMs` and placed anew. Stopped and
 * failed actors are never re-placed; a dead one that no live node can take stays dead until one
 * can.
 *
 * A group (`GroupSpec`, spawned by `SpawnGroup`) is placed again as a group: its node claims
 * `group/<name>` beside its members and renews it with the spec of the members it still hosts
 * (`load.group`). When that entry is dead, one node writes it `placing` on a live node that has
 * every member's kind (the first restartable member's policy decides) and that node spawns the
 * group again, so one-for-all members stay together. A member of a dead node's group is left
 * to its group; a member that died while its node lives is placed again alone, as above.
 */
import { Duration, Effect, Schedule, Schema, type Scope } from "effect"
import type { AnyActorType } from "./actor.ts"
import { Placed, PlacedEvent } from "./events.ts"
import { address, type ActorAddress } from "./names.ts"
import { encodeJson } from "./protocol.ts"
import type { RegistryEntry, RegistryView } from "./registry.ts"
import type { ActorSystemShape } from "./system.ts"

/** Where an actor goes when it is placed again. */
export const Placement = Schema.Union([
  Schema.TaggedStruct("Spread", {}),
  Schema.TaggedStruct("Node", { node: Schema.String }),
  Schema.TaggedStruct("Device", { device: Schema.String })
])
export type Placement = typeof Placement.Type

export const spread: Placement = { _tag: "Spread" }
export const onNode = (node: string): Placement => ({ _tag: "Node", node })
export const onDevice = (device: string): Placement => ({ _tag: "Device", device })

/** What a node reports as the load of its `node/<name>` entry. */
export const NodeLoad = Schema.Struct({
  actors: Schema.Number,
  types: Schema.Array(Schema.String),
  devices: Schema.optional(Schema.Array(Schema.String)),
  draining: Schema.optional(Schema.Boolean)
})
export type NodeLoad = typeof NodeLoad.Type

/** A live node that could host an actor. */
export interface Candidate {
  readonly node: string
  readonly actors: number
  readonly types: ReadonlyArray<string>
  readonly devices: ReadonlyArray<string>
}

/** A group of actors spawned together: one-for-all restarts them all when one is restarted. */
export const GroupSpec = Schema.Struct({
  name: Schema.String,
  strategy: Schema.Literals(["one-for-one", "one-for-all"]),
  members: Schema.Array(Schema.Struct({ kind: Schema.String, id: Schema.String }))
})
export type GroupSpec = typeof GroupSpec.Type

const groupKind = "group"

/** The registry address a group's node claims for it (`group` is a reserved kind, as `node` is). */
export const groupAddress = (name: string): ActorAddress => address(groupKind, name)

/** What a group's entry carries: the members its node hosts (or, while `placing`, is to host). */
const decodeGroupLoad = Schema.decodeUnknownOption(Schema.Struct({ group: GroupSpec }))

/** The node `policy` picks for actors of `kinds` (all on one node) among `candidates`, or undefined when none fits. */
export const choose = (policy: Placement, kinds: ReadonlyArray<string>, candidates: ReadonlyArray<Candidate>): string | undefined => {
  const able = candidates.filter((c) => kinds.every((k) => c.types.includes(k)))
  switch (policy._tag) {
    case "Node":
      return able.some((c) => c.node === policy.node) ? policy.node : undefined
    case "Device":
      return able.find((c) => c.devices.includes(policy.device))?.node
    case "Spread":
      return [...able].sort((a, b) => a.actors - b.actors || (a.node < b.node ? -1 : a.node > b.node ? 1 : 0))[0]?.node
  }
}

export { PlacedEvent }

const decodeNodeLoad = Schema.decodeUnknownOption(NodeLoad)

/** The live nodes of the view, as candidates. */
export const liveNodes = (view: RegistryView, deadAfterMs: number): Array<Candidate> => {
  const now = performance.now()
  const out: Array<Candidate> = []
  for (const [key, s] of view.entries()) {
    if (!key.startsWith("node/") || s.entry.status !== "running" || now - s.at >= deadAfterMs) continue
    const load = decodeNodeLoad(s.entry.load)
    if (load._tag === "None" || load.value.draining === true) continue
    out.push({ node: s.entry.node, actors: load.value.actors, types: load.value.types, devices: load.value.devices ?? [] })
  }
  return out
}

export interface PlacementOptions {
  /** This node. */
  readonly node: string
  readonly types: ReadonlyMap<string, AnyActorType>
  readonly deadAfterMs: number
  readonly checkEveryMs?: number
  /** Spawns an actor on this node (idempotent). */
  readonly spawn: (kind: string, id: string) => Effect.Effect<unknown, unknown>
  /** Spawns a group on this node. */
  readonly spawnGroup: (group: GroupSpec) => Effect.Effect<unknown, unknown>
  /** False while this node is draining: it neither places nor takes placements. */
  readonly accepting: () => boolean
}

/** A dead entry as it is placed: the kinds its node must have, the policy that picks it, what its `placing` entry carries. */
interface Placeable {
  readonly kinds: ReadonlyArray<string>
  readonly policy: Placement
  readonly load: Readonly<Record<string, unknown>>
}

/** The members of the groups in the view that still stand (not stopped or failed), by `kind/id`. */
const groupMembers = (view: RegistryView): Set<string> => {
  const out = new Set<string>()
  for (const [key, s] of view.entries()) {
    if (!key.startsWith(`${groupKind}/`) || s.entry.status === "stopped" || s.entry.status === "failed") continue
    const load = decodeGroupLoad(s.entry.load)
    if (load._tag === "Some") for (const m of load.value.group.members) out.add(`${m.kind}/${m.id}`)
  }
  return out
}

/** One node's placer: the registry it sweeps, and the revisions of entries it has tried (placed or taken up) and warned about. */
interface Placer {
  readonly system: ActorSystemShape
  readonly view: RegistryView
  readonly options: PlacementOptions
  readonly tried: Map<string, number>
  readonly warned: Map<string, number>
}

const warnOnce = (p: Placer, key: string, revision: number, message: string) =>
  p.warned.get(key) === revision ? Effect.void : Effect.logWarning(message).pipe(Effect.andThen(Effect.sync(() => p.warned.set(key, revision))))

/** Places `dead` on one of `candidates` (not on `exclude`), counting it there for the rest of the sweep. */
const place = (p: Placer, key: string, dead: RegistryEntry, revision: number, what: Placeable, candidates: Array<Candidate>, exclude: string | undefined) =>
  Effect.gen(function* () {
    const to = choose(what.policy, what.kinds, candidates.filter((c) => c.node !== exclude))
    if (to === undefined) return yield* warnOnce(p, key, revision, `${key} is dead and no live node can take it (${what.policy._tag})`)
    p.tried.set(key, revision)
    const placing: RegistryEntry = { ...dead, node: to, status: "placing", heartbeatAt: Date.now(), load: { ...what.load, from: dead.node, by: p.options.node } }
    const won = yield* Effect.promise(() => p.system.registry.update(key, encodeJson(placing), revision).then(() => true, () => false))
    if (!won) return
    const chosen = candidates.find((c) => c.node === to)!
    candidates[candidates.indexOf(chosen)] = { ...chosen, actors: chosen.actors + what.kinds.length }
    const event: PlacedEvent = { kind: dead.kind, id: dead.id, from: dead.node, to, incarnation: dead.incarnation, by: p.options.node }
    yield* Effect.logInfo(`${key}: placed again on ${to} (was on ${dead.node})`)
    yield* p.system.publishEvent(Placed, event).pipe(Effect.catchCause((c) => Effect.logWarning("placed event not published", c)))
  })

/**
 * A dead group as it is placed: its restartable members, when this node knows every
 * member's kind (another node may), under the first one's policy; undefined when there is
 * nothing to place here.
 */
const asGroup = (types: PlacementOptions["types"], entry: RegistryEntry): Placeable | undefined => {
  const load = decodeGroupLoad(entry.load)
  if (load._tag === "None") return undefined
  const spec = load.value.group
  const memberTypes = spec.members.map((m) => types.get(m.kind))
  if (memberTypes.some((t) => t === undefined)) return undefined
  const members = spec.members.filter((_, i) => memberTypes[i]!.restart !== "temporary")
  if (members.length === 0) return undefined
  return { kinds: members.map((m) => m.kind), policy: types.get(members[0]!.kind)!.placement, load: { group: { ...spec, members } } }
}

/** How a dead entry is placed; undefined when it is not (temporary, going with its group, a group with nothing to place here). */
const placeable = (types: PlacementOptions["types"], entry: RegistryEntry, type: AnyActorType | undefined, withGroup: boolean): Placeable | undefined => {
  if (entry.kind === groupKind) return asGroup(types, entry)
  if (type === undefined || type.restart === "temporary" || withGroup) return undefined
  return { kinds: [entry.kind], policy: type.placement, load: {} }
}

/** What a placement naming this node spawns: the actor, or the group its entry lists. */
const spawnFor = (options: PlacementOptions, key: string, entry: RegistryEntry): Effect.Effect<unknown, unknown> => {
  if (entry.kind !== groupKind) return options.spawn(entry.kind, entry.id)
  const group = decodeGroupLoad(entry.load)
  return group._tag === "Some" ? options.spawnGroup(group.value.group) : Effect.logWarning(`${key}: placed here without its members; not taken up`)
}

const takeUp = (options: PlacementOptions, key: string, entry: RegistryEntry) =>
  Effect.forkScoped(spawnFor(options, key, entry).pipe(Effect.catchCause((c) => Effect.logWarning(`${key}: placement not taken up`, c))))

/** One pass over the registry: takes up placements naming this node, places dead entries it can. */
const sweep = (p: Placer) =>
  Effect.gen(function* () {
    const { options, view, tried } = p
    if (!options.accepting()) return
    const candidates = liveNodes(view, options.deadAfterMs)
    const grouped = groupMembers(view)
    for (const [key, s] of [...view.entries()]) {
      const type = options.types.get(s.entry.kind)
      if ((type === undefined && s.entry.kind !== groupKind) || tried.get(key) === s.revision) continue
      if (s.entry.status === "placing" && s.entry.node === options.node) {
        tried.set(key, s.revision)
        yield* takeUp(options, key, s.entry)
      } else if (s.entry.status === "dead") {
        // Its own node lives only if it has beaten (running) since the actor was declared
        // dead: an actor's beats and its node's stop together, and the node's last one may
        // still look recent (a killed node got its actor placed back on itself), or the
        // change seen since may be its own death mark.
        const own = view.get(`node/${s.entry.node}`)
        const lives = own !== undefined && own.entry.status === "running" && own.at > s.at
        // A member of a dead node's group goes with its group.
        const what = placeable(options.types, s.entry, type, !lives && grouped.has(key))
        if (what !== undefined) yield* place(p, key, s.entry, s.revision, what, candidates, lives ? undefined : s.entry.node)
      }
    }
  })

/** Places dead actors of this node's types again and takes up placements naming this node, for the lifetime of the scope. */
export const replaceDead = (system: ActorSystemShape, view: RegistryView, options: PlacementOptions): Effect.Effect<void, never, Scope.Scope> =>
  Effect.suspend(() => {
    const p: Placer = { system, view, options, tried: new Map(), warned: new Map() }
    const every = Duration.millis(options.checkEveryMs ?? Math.max(50, Math.min(250, options.deadAfterMs / 4)))
    return Effect.forkScoped(sweep(p).pipe(Effect.repeat(Schedule.spaced(every)))).pipe(Effect.asVoid)
  })
