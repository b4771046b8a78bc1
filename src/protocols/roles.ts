/**
 * Who may publish and subscribe to what: the NATS permissions of each role of a run, derived
 * from the run's topology (`topology.ts`: each role's hosted and addressed kinds, the channels
 * it publishes and subscribes, the object stores it writes) and the runtime's layout
 * (`src/runtime/names.ts`).
 *
 * Every role that hosts actors shares `host`: the JetStream API it needs to create its run's
 * streams and consumers and to read them (never to delete or purge a stream or a message),
 * the registry and state buckets, system events, dead letters and ask copies, and asks/tells to
 * the nodes (spawning). On top, each role may receive asks only for the kinds it hosts (so no
 * other user can join their queue group `gyre`) and address only the kinds it talks to, and
 * only the gateway publishes call records, only the harness runner outcomes, only the trainer
 * micro-batches, gradients and weights. The observer (replay, audits) reads streams and
 * buckets and publishes nothing else. `actor-host` is the runtime's generic role for actor
 * types Gyre does not know (tests, user modules): it may host and address any kind.
 * ARCHITECTURE.md has the same table with the reasons. A topology extended with a kind and a
 * role (`extend`) gets that role's permissions from the same functions.
 *
 * With `run` = `*` the permissions cover every run; names that embed the run inside one token
 * (`GYRE_<run>_JOURNAL`) then match any stream of that API verb.
 */
import type { Permissions, UserSpec } from "../runtime/auth.ts"
import type { ObjectChannel } from "../runtime/channel.ts"
import { RunTopology, rolesOfKind as rolesOfKindIn, type AnyTopology, type NatsRole, type RoleOf, type RoleSpec } from "./topology.ts"

export type { NatsRole } from "./topology.ts"

/** The roles of a Gyre run. */
export const ROLES = Object.keys(RunTopology.roles) as ReadonlyArray<NatsRole>

interface Grant {
  readonly pub: ReadonlyArray<string>
  readonly sub: ReadonlyArray<string>
}

/** The roles that host actors of `kind` (a kind Gyre does not know needs `actor-host`). */
export const rolesOfKind = (kind: string): ReadonlyArray<NatsRole> => rolesOfKindIn(RunTopology, kind)

/** A bucket's name, and the names of its stream (`KV_`/`OBJ_` + name); `*` for every run. */
const bucket = (run: string, name: string) => (run === "*" ? "*" : `GYRE_${run}_${name}`)
const kvStream = (run: string, name: string) => (run === "*" ? "*" : `KV_GYRE_${run}_${name}`)
const objStream = (run: string, name: string) => (run === "*" ? "*" : `OBJ_GYRE_${run}_${name}`)
/** The runtime's streams (journal, dead letters), then the topology's channels' streams and object stores. */
const streamNames = (t: AnyTopology) => [...new Set(["JOURNAL", "DEAD", ...t.channels.flatMap((c) => (c._tag === "Subjects" && c.stream !== undefined ? [c.stream] : []))])]
const objectStores = (t: AnyTopology) => t.channels.filter((c): c is ObjectChannel => c._tag === "Objects")
const streamsOf = (t: AnyTopology, run: string) => (run === "*" ? ["*"] : streamNames(t).map((n) => `GYRE_${run}_${n}`))
const storedOf = (t: AnyTopology, run: string) =>
  run === "*"
    ? ["*"]
    : [...streamsOf(t, run), ...["registry", "state"].map((n) => kvStream(run, n)), ...objectStores(t).map((o) => objStream(run, o.bucket))]

/** Reading what is stored: every role, the observer included. */
const reader = (t: AnyTopology, run: string): Grant => ({
  pub: [
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    ...storedOf(t, run).flatMap((s) => [
      `$JS.API.STREAM.INFO.${s}`,
      `$JS.API.STREAM.MSG.GET.${s}`,
      `$JS.API.DIRECT.GET.${s}`,
      `$JS.API.DIRECT.GET.${s}.>`,
      `$JS.API.CONSUMER.CREATE.${s}`,
      `$JS.API.CONSUMER.CREATE.${s}.>`,
      `$JS.API.CONSUMER.INFO.${s}.*`,
      `$JS.API.CONSUMER.MSG.NEXT.${s}.*`
    ]),
    "$JS.ACK.>",
    "$JS.FC.>"
  ],
  sub: []
})

const kindNames = (ks: RoleSpec["hosts"]) => (ks === "any" ? ["*"] : ks.map((k) => k.kind))

const host = (t: AnyTopology, run: string, spec: RoleSpec): Grant => {
  const base = `gyre.${run}`
  const subject = (verb: string, k: string) => (k === "*" ? `${base}.${verb}.>` : `${base}.${verb}.${k}.>`)
  const own = (verb: string) => kindNames(spec.hosts).map((k) => subject(verb, k))
  const to = (verb: string) => [...kindNames(spec.talksTo), "node"].map((k) => subject(verb, k))
  return {
    pub: [
      ...streamsOf(t, run).map((s) => `$JS.API.STREAM.CREATE.${s}`),
      // Durable consumers (an actor's tells, a step's micro-batches) are made and removed by hosts only.
      ...storedOf(t, run).flatMap((s) => [`$JS.API.CONSUMER.DURABLE.CREATE.${s}.*`, `$JS.API.CONSUMER.DELETE.${s}.*`]),
      ...["registry", "state"].flatMap((n) => [`$JS.API.STREAM.CREATE.${kvStream(run, n)}`, `$KV.${bucket(run, n)}.>`]),
      `${base}.sys.>`,
      ...own("asked"),
      ...own("dead"),
      ...to("ask"),
      ...to("tell"),
      "$SRV.>"
    ],
    sub: [...own("ask"), `${base}.ask.node.>`, `${base}.sys.>`, "$SRV.>"]
  }
}

/** What a role adds to `host` (or, for the observer, to `reader`): its channels and object stores. */
const extra = (run: string, spec: RoleSpec): Grant => ({
  pub: [
    ...spec.publishes.map((c) => c.pattern(run)),
    ...spec.writes.flatMap((o) => [`$JS.API.STREAM.CREATE.${objStream(run, o.bucket)}`, `$JS.API.STREAM.PURGE.${objStream(run, o.bucket)}`, `$O.${bucket(run, o.bucket)}.>`])
  ],
  sub: spec.subscribes.map((c) => c.pattern(run))
})

/**
 * Never granted to any role (the allow lists already leave them out; the deny list keeps a
 * wildcard from letting them in): deleting or changing a stream, deleting a message. Purging
 * is allowed only on the object stores a role writes (an object store replaces and deletes
 * objects by purging their chunks).
 */
const DENY = ["$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.MSG.DELETE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.ACCOUNT.PURGE.>"]

/** The permissions of a user holding every role in `roles` (their union) in topology `t`. */
export const permissionsOf = <T extends AnyTopology = typeof RunTopology>(run: string, roles: ReadonlyArray<RoleOf<T>>, t: T = RunTopology as unknown as T): Permissions => {
  const spec = (r: string): RoleSpec => t.roles[r]!
  const grants = [reader(t, run), ...roles.flatMap((r) => (r === "observer" ? [] : [host(t, run, spec(r))])), ...roles.map((r) => extra(run, spec(r)))]
  const uniq = (xs: ReadonlyArray<string>) => [...new Set(xs)]
  return {
    publish: { allow: uniq(grants.flatMap((g) => g.pub)), deny: DENY },
    subscribe: { allow: uniq(grants.flatMap((g) => g.sub)), deny: [] }
  }
}

/** The users `gyre auth init` writes: one per role of `t`, and its unions (the users Gyre's commands connect as). */
export const defaultUsers = <T extends AnyTopology = typeof RunTopology>(run: string, t: T = RunTopology as unknown as T): ReadonlyArray<UserSpec> => {
  const user = (name: string, roles: ReadonlyArray<RoleOf<T>>): UserSpec => ({ name, roles, permissions: permissionsOf(run, roles, t) })
  return [
    ...(Object.keys(t.roles) as Array<RoleOf<T>>).map((r) => user(r, [r])),
    ...Object.entries<ReadonlyArray<string>>(t.users).map(([name, roles]) => user(name, roles as ReadonlyArray<RoleOf<T>>))
  ]
}
