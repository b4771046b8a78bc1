/**
 * An actor kind's definition apart from its implementation: a name and the protocol every actor
 * of the kind speaks. The definition gives typed references (`Device.ref("main.cpu0")`) to
 * whoever talks to the kind; `implement` turns it into an actor type (state, behaviour,
 * lifecycle: `Actor.make`) where the kind is hosted. A definition imports no implementation, so
 * protocols and the run's topology (`src/protocols/topology.ts`) hold definitions only.
 *
 * ```ts
 * const Counter = Kind.make("counter", CounterProtocol)    // where both sides can import it
 * const ref = Counter.ref("c1")                            // ActorRef<typeof CounterProtocol's requests>
 * const type = Counter.implement({ state, behaviour })     // where it is hosted
 * ```
 */
import type { Rpc, RpcGroup } from "effect/rpc"
import * as Actor from "./actor.ts"
import { InvalidAddress, address, checkKind, formatAddress, parseAddress, type ActorAddress } from "./names.ts"
import { refOf, type ActorRef } from "./system.ts"

/** What `implement` needs besides the kind and its protocol. */
export type Implementation<R extends Rpc.Any, S, Req> = Omit<Actor.ActorDefinition<R, S, Req>, "kind" | "protocol">

export interface Kind<R extends Rpc.Any, N extends string = string> {
  readonly kind: N
  readonly protocol: RpcGroup.RpcGroup<R>
  /** The address of actor `id` of this kind (throws `InvalidAddress` for an id that is not one). */
  readonly address: (id: string) => ActorAddress
  /** A typed reference to actor `id`. */
  readonly ref: (id: string) => ActorRef<R>
  /**
   * A reference from a stored `kind/id` key (a registry key, a cell's device in a policy
   * record); throws `InvalidAddress` when the key is not one or names another kind.
   */
  readonly refOfKey: (key: string) => ActorRef<R>
  /** The key `kind/id` of actor `id`. */
  readonly key: (id: string) => string
  /** The actor type hosting this kind. */
  readonly implement: <S, Req = never>(impl: Implementation<R, S, Req>) => Actor.ActorType<R, S, Actor.Requirements<Req>>
}

/** Any kind, its protocol erased (a topology's list of kinds). */
export interface AnyKind {
  readonly kind: string
  /** The protocol, its type erased (an `RpcGroup` of this kind's requests). */
  readonly protocol: { readonly requests: ReadonlyMap<string, unknown> }
  readonly key: (id: string) => string
}

/** The requests of a kind's protocol. */
export type RequestsOf<K> = K extends { readonly protocol: RpcGroup.RpcGroup<infer R> } ? R : never

export const make = <const N extends string, R extends Rpc.Any>(kind: N, protocol: RpcGroup.RpcGroup<R>): Kind<R, N> => {
  checkKind(kind)
  const at = (id: string) => address(kind, id)
  return {
    kind,
    protocol,
    address: at,
    ref: (id) => refOf(protocol, at(id)),
    key: (id) => formatAddress(at(id)),
    refOfKey: (key) => {
      const a = parseAddress(key)
      if (a.kind !== kind) throw new InvalidAddress({ address: key, message: `'${key}' is not a ${kind}` })
      return refOf(protocol, a)
    },
    implement: (impl) => Actor.make({ ...impl, kind, protocol })
  }
}
