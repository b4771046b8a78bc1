/**
 * Adding an actor kind to a run: one typed edit of the topology.
 *
 * 1. Define the kind once, with its protocol (no implementation): `Kind.make`. Whoever talks to
 *    it imports this and gets typed references (`Echo.ref("main")`).
 * 2. Add it to the topology (here `extend`; in Gyre itself, one more entry of `RunTopology`'s
 *    `kinds`, a role that hosts it and a `hosted` spawn): its role's NATS permissions, replay's
 *    decoding of its messages, its spawn in a hosted run and its row in ARCHITECTURE.md's table
 *    follow from the value.
 * 3. Implement it where it is hosted: `Echo.implement({...})`. `implement(topology, {...})`
 *    refuses to compile until every hosted kind has an implementation speaking its protocol.
 *
 * test/topology/extend.test.ts runs this kind on a real nats-server as its derived user.
 */
import { Effect, Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import * as Topology from "../src/protocols/topology.ts"
import * as Kind from "../src/runtime/kind.ts"

/** 1. The definition: a kind and its protocol. `at` travels as an ISO string and is decoded back to a Date. */
export const EchoProtocol = RpcGroup.make(
  Rpc.make("Echo", { payload: { text: Schema.String, at: Schema.Date }, success: Schema.String }),
  Rpc.make("Note", { payload: { text: Schema.String, at: Schema.Date } })
)
export const Echo = Kind.make("echo", EchoProtocol)

/** 2. The run with it: a role that hosts it (and may address it), and one `echo/main` per hosted run. */
export const EchoRun = Topology.extend(Topology.RunTopology, {
  kinds: { echo: Echo },
  roles: {
    "echo-host": { hosts: [Echo], talksTo: [Echo], publishes: [], subscribes: [], writes: [], doc: "hosts the echo kind" }
  },
  hosted: { echo: Topology.singleton("main") }
})

/** 3. The implementation, where it is hosted. */
export const echo = Echo.implement({
  state: { schema: Schema.Struct({ notes: Schema.Number }), initial: () => ({ notes: 0 }) },
  behaviour: () =>
    Effect.succeed({
      Echo: ({ text, at }) => Effect.succeed(`${text} @ ${at.toISOString()}`),
      Note: () => Effect.void
    })
})
