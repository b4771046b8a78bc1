/**
 * Who may publish and subscribe to what: the NATS permissions of each role of a run, from the
 * runtime's layout (`src/runtime/names.ts`) and the RL layout (`layout.ts`).
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
 * ARCHITECTURE.md has the same table with the reasons.
 *
 * With `run` = `*` the permissions cover every run; names that embed the run inside one token
 * (`GYRE_<run>_JOURNAL`) then match any stream of that API verb.
 */
import type { Permissions, UserSpec } from "../runtime/auth.ts"

export const ROLES = ["rollout-worker", "trainer", "scheduler", "gateway", "harness-runner", "observer", "actor-host"] as const
export type Role = (typeof ROLES)[number]

interface Grant {
  readonly pub: ReadonlyArray<string>
  readonly sub: ReadonlyArray<string>
}

/** Actor kinds whose asks a role answers, and kinds it asks or tells. */
const KINDS: Record<Role, { readonly hosts: ReadonlyArray<string>; readonly talksTo: ReadonlyArray<string> }> = {
  "rollout-worker": { hosts: ["rollout-worker", "device"], talksTo: ["gateway", "scheduler", "device"] },
  trainer: { hosts: ["device"], talksTo: ["scheduler", "device"] },
  scheduler: { hosts: ["scheduler"], talksTo: ["device", "harness-runner", "scheduler"] },
  gateway: { hosts: ["gateway"], talksTo: ["rollout-worker", "device", "gateway"] },
  "harness-runner": { hosts: ["harness-runner"], talksTo: ["gateway"] },
  observer: { hosts: [], talksTo: [] },
  "actor-host": { hosts: ["*"], talksTo: ["*"] }
}

/** The roles that host actors of `kind` (a kind Gyre does not know needs `actor-host`). */
export const rolesOfKind = (kind: string): ReadonlyArray<Role> => {
  const roles = ROLES.filter((r) => r !== "actor-host" && KINDS[r].hosts.includes(kind))
  return roles.length > 0 ? roles : ["actor-host"]
}

/** A bucket's name, and the names of its stream (`KV_`/`OBJ_` + name); `*` for every run. */
const bucket = (run: string, name: string) => (run === "*" ? "*" : `GYRE_${run}_${name}`)
const kvStream = (run: string, name: string) => (run === "*" ? "*" : `KV_GYRE_${run}_${name}`)
const objStream = (run: string, name: string) => (run === "*" ? "*" : `OBJ_GYRE_${run}_${name}`)
const STREAMS = ["JOURNAL", "DEAD", "TRAJECTORIES", "MICROBATCHES"]
const streamsOf = (run: string) => (run === "*" ? ["*"] : STREAMS.map((n) => `GYRE_${run}_${n}`))
const storedOf = (run: string) =>
  run === "*" ? ["*"] : [...streamsOf(run), ...["registry", "state"].map((n) => kvStream(run, n)), ...["weights", "batches", "grads", "kv"].map((n) => objStream(run, n))]

/** Reading what is stored: every role, the observer included. */
const reader = (run: string): Grant => ({
  pub: [
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    ...storedOf(run).flatMap((s) => [
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

const host = (run: string, kinds: (typeof KINDS)[Role]): Grant => {
  const base = `gyre.${run}`
  const own = (verb: string) => kinds.hosts.map((k) => (k === "*" ? `${base}.${verb}.>` : `${base}.${verb}.${k}.>`))
  const to = (verb: string) => [...kinds.talksTo, "node"].map((k) => (k === "*" ? `${base}.${verb}.>` : `${base}.${verb}.${k}.>`))
  return {
    pub: [
      ...streamsOf(run).map((s) => `$JS.API.STREAM.CREATE.${s}`),
      // Durable consumers (an actor's tells, a step's micro-batches) are made and removed by hosts only.
      ...storedOf(run).flatMap((s) => [`$JS.API.CONSUMER.DURABLE.CREATE.${s}.*`, `$JS.API.CONSUMER.DELETE.${s}.*`]),
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

/** What a role adds to `host` (or, for the observer, to `reader`). */
const extra = (run: string, role: Role): Grant => {
  const base = `gyre.${run}`
  const objects = (names: ReadonlyArray<string>) => names.flatMap((n) => [`$JS.API.STREAM.CREATE.${objStream(run, n)}`, `$JS.API.STREAM.PURGE.${objStream(run, n)}`, `$O.${bucket(run, n)}.>`])
  switch (role) {
    case "gateway":
      // The transfer store: prompts too long for one message go to the workers as objects.
      return { pub: [`${base}.calls.>`, ...objects(["kv"])], sub: [`${base}.tokens.>`] }
    case "harness-runner":
      return { pub: [`${base}.outcomes.>`], sub: [] }
    case "rollout-worker":
      return { pub: [`${base}.tokens.>`, ...objects(["kv"])], sub: [] }
    case "trainer":
      return { pub: [`${base}.mb.>`, ...objects(["weights", "batches", "grads", "kv"])], sub: [] }
    case "scheduler":
    case "observer":
    case "actor-host":
      return { pub: [], sub: [] }
  }
}

/**
 * Never granted to any role (the allow lists already leave them out; the deny list keeps a
 * wildcard from letting them in): deleting or changing a stream, deleting a message. Purging
 * is allowed only on the object stores a role writes (an object store replaces and deletes
 * objects by purging their chunks).
 */
const DENY = ["$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.MSG.DELETE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.ACCOUNT.PURGE.>"]

/** The permissions of a user holding every role in `roles` (their union). */
export const permissionsOf = (run: string, roles: ReadonlyArray<Role>): Permissions => {
  const grants = [reader(run), ...roles.flatMap((r) => (r === "observer" ? [] : [host(run, KINDS[r])])), ...roles.map((r) => extra(run, r))]
  const uniq = (xs: ReadonlyArray<string>) => [...new Set(xs)]
  return {
    publish: { allow: uniq(grants.flatMap((g) => g.pub)), deny: DENY },
    subscribe: { allow: uniq(grants.flatMap((g) => g.sub)), deny: [] }
  }
}

/** The users `gyre auth init` writes: one per role, and the unions Gyre's commands connect as. */
export const defaultUsers = (run: string): ReadonlyArray<UserSpec> => {
  const user = (name: string, roles: ReadonlyArray<Role>): UserSpec => ({ name, roles, permissions: permissionsOf(run, roles) })
  return [
    ...ROLES.map((r) => user(r, [r])),
    user("serve", ["gateway", "rollout-worker"]),
    user("device-node", ["rollout-worker", "trainer"]),
    user("train", ["rollout-worker", "trainer", "scheduler", "gateway", "harness-runner"])
  ]
}
