/**
 * Defining an actor type: a kind, a protocol (an effect `RpcGroup`), a state with its schema
 * and initial value, and a behaviour that builds the handlers.
 *
 * The behaviour runs once per incarnation, in the incarnation's scope (acquire resources
 * there: they are released when the incarnation stops or crashes), and returns one handler
 * per request of the protocol. A handler gets the decoded payload and returns an Effect of the
 * request's success or typed error; it reads and updates the actor's state through
 * `ctx.state` (a `Ref`). Handlers run one at a time unless the type declares `concurrency`.
 *
 * Lifecycle options: `restart` (OTP's restart type, supervisor.ts: is the actor started again
 * after it crashed, after it ended on its own with `ctx.stop`, or never; when its node dies it
 * is placed again on a live node as `placement` says, default `spread`, see placement.ts,
 * unless it is `temporary`), `supervision` (how often and how soon), `stopTimeoutMs` (how long
 * a stop waits for running handlers before interrupting them and handing their messages back),
 * `maxDeliveries` and `redelivery` (a tell whose handler crashes is handed back after the next
 * delay of `redelivery`, and dead-lettered once it has crashed `maxDeliveries` deliveries),
 * `corruptSnapshot` (a stored state that does not decode is quarantined to the dead-letter
 * stream; then the actor starts from its initial state, or its start fails and its supervisor
 * escalates by its policy), `maxQueuedAsks` and `maxQueuedAskBytes` (an ask that finds that
 * many waiting is refused at once with `ActorOverloaded`).
 *
 * ```ts
 * const Counter = Actor.make({
 *   kind: "counter",
 *   protocol: RpcGroup.make(Rpc.make("Add", { payload: { n: Schema.Number }, success: Schema.Number })),
 *   state: { schema: Schema.Struct({ total: Schema.Number }), initial: () => ({ total: 0 }) },
 *   behaviour: (ctx) => Effect.succeed({
 *     Add: ({ n }) => Ref.updateAndGet(ctx.state, (s) => ({ total: s.total + n })).pipe(Effect.map((s) => s.total))
 *   })
 * })
 * ```
 */
import { Duration, Schedule, type Effect, type Ref, type Schema, type Scope } from "effect"
import { cappedBackoff } from "../common/retry.ts"
import type { Rpc, RpcGroup } from "effect/rpc"
import { checkKind, type ActorAddress } from "./names.ts"
import { spread, type Placement } from "./placement.ts"
import type { CorruptSnapshotPolicy } from "./snapshot.ts"
import { defaultSupervision, type RestartType, type SupervisionPolicy } from "./supervisor.ts"
import type { ActorSystemShape } from "./system.ts"

/** Facts about the message being handled. */
export interface MessageMeta {
  /** `tell` (durable, from the journal) or `ask` (core NATS request). */
  readonly via: "tell" | "ask"
  readonly msgId: string
  /** Journal sequence of a tell (0 for an ask). */
  readonly seq: number
  /** How many times JetStream has delivered this tell (1 on first delivery). */
  readonly deliveryCount: number
  readonly sender: string | undefined
  /** The sender's incarnation (`Gyre-Incarnation`); `claim.isCurrent` says whether it is still the live one. */
  readonly senderIncarnation: number | undefined
}

/** What a behaviour sees of its actor. */
export interface ActorContext<S> {
  readonly address: ActorAddress
  /** Number of this activation of the address: the claim's, one more on every start (claim.ts). */
  readonly incarnation: number
  readonly node: string
  readonly state: Ref.Ref<S>
  readonly system: ActorSystemShape
  /** Load figures published with the next heartbeat in the registry. */
  readonly reportLoad: (load: Readonly<Record<string, unknown>>) => void
  /**
   * Ends this incarnation normally, as a requested stop does (intake stops, running handlers
   * finish, the last snapshot is written). A `permanent` actor is then started again; a
   * `transient` or `temporary` one stays stopped.
   */
  readonly stop: Effect.Effect<void>
}

export type Handler<R extends Rpc.Any> = (
  payload: Rpc.Payload<R>,
  meta: MessageMeta
) => Effect.Effect<Rpc.Success<R>, Rpc.Error<R>>

export type Handlers<R extends Rpc.Any> = {
  readonly [K in R as K["_tag"]]: Handler<K>
}

export interface Persistence {
  /** Snapshot the state after this many handled messages (acks wait for the snapshot). */
  readonly everyMessages: number
  /** ... or after this long, whichever comes first. */
  readonly maxDelayMs: number
}

export interface ActorType<R extends Rpc.Any, S, Req> {
  readonly kind: string
  readonly protocol: RpcGroup.RpcGroup<R>
  readonly stateSchema: Schema.Codec<S, any>
  readonly initialState: (id: string) => S
  readonly behaviour: (ctx: ActorContext<S>) => Effect.Effect<Handlers<R>, unknown, Req | Scope.Scope>
  /** How many messages may be handled at once (1 = in order). */
  readonly concurrency: number
  /** Snapshots of the state to the KV bucket; `undefined` = the state lives in memory only. */
  readonly persistence: Persistence | undefined
  readonly supervision: SupervisionPolicy
  /**
   * When the actor is started again: after a crash, after ending on its own, or never; and
   * whether it is placed again when its node dies (a node's death is a failure, never a normal
   * exit: `permanent` and `transient` actors are re-placed, `temporary` ones never).
   */
  readonly restart: RestartType
  /** How long a stop waits for running handlers before interrupting them. */
  readonly stopTimeoutMs: number
  /** A tell whose handler crashed on this many deliveries is dead-lettered. */
  readonly maxDeliveries: number
  /** Delay before a tell whose handler crashed is delivered again (step n after the n-th crash). */
  readonly redelivery: Schedule.Schedule<unknown>
  /** Where the actor is placed again when its node dies (placement.ts). */
  readonly placement: Placement
  /** A snapshot that does not decode, once quarantined: start from the initial state, or fail the start. */
  readonly corruptSnapshot: CorruptSnapshotPolicy
  /** Asks waiting in the mailbox beyond this many, or this many bytes, are refused with `ActorOverloaded`. */
  readonly maxQueuedAsks: number
  readonly maxQueuedAskBytes: number
}

/** An actor type with its protocol and requirements erased, as a node's catalogue holds it. */
export type AnyActorType = ActorType<any, any, any>

export type { RestartType } from "./supervisor.ts"

export interface ActorDefinition<R extends Rpc.Any, S, Req> {
  readonly kind: string
  readonly protocol: RpcGroup.RpcGroup<R>
  readonly state: { readonly schema: Schema.Codec<S, any>; readonly initial: (id: string) => S }
  readonly behaviour: (ctx: ActorContext<S>) => Effect.Effect<Handlers<R>, unknown, Req | Scope.Scope>
  readonly concurrency?: number
  /** `true` = snapshot after every message; or batching as `Persistence` says. */
  readonly persistence?: boolean | Persistence
  readonly supervision?: SupervisionPolicy
  /** Default `permanent`. */
  readonly restart?: RestartType
  /** Default 10 s. */
  readonly stopTimeoutMs?: number
  /** Default 5. */
  readonly maxDeliveries?: number
  /** Default: 100 ms doubling, at most 5 s. */
  readonly redelivery?: Schedule.Schedule<unknown>
  /** Default `spread`. */
  readonly placement?: Placement
  /** Default `initial`. */
  readonly corruptSnapshot?: CorruptSnapshotPolicy
  /** Default 1024. */
  readonly maxQueuedAsks?: number
  /** Default 32 MiB. */
  readonly maxQueuedAskBytes?: number
}

/** 100 ms, doubling, at most 5 s. */
export const defaultRedelivery: Schedule.Schedule<unknown> = cappedBackoff(Duration.millis(100), Duration.seconds(5))

/** The services an actor type requires of its node (its behaviour's requirements; the scope is the incarnation's). */
export type Requirements<Req> = Exclude<Req, Scope.Scope>

export const make = <R extends Rpc.Any, S, Req = never>(def: ActorDefinition<R, S, Req>): ActorType<R, S, Requirements<Req>> => ({
  kind: checkKind(def.kind),
  protocol: def.protocol,
  stateSchema: def.state.schema,
  initialState: def.state.initial,
  behaviour: def.behaviour as ActorType<R, S, Requirements<Req>>["behaviour"],
  concurrency: Math.max(1, def.concurrency ?? 1),
  persistence:
    def.persistence === true
      ? { everyMessages: 1, maxDelayMs: 0 }
      : def.persistence === false || def.persistence === undefined
        ? undefined
        : def.persistence,
  supervision: def.supervision ?? defaultSupervision,
  restart: def.restart ?? "permanent",
  stopTimeoutMs: def.stopTimeoutMs ?? 10_000,
  maxDeliveries: Math.max(1, def.maxDeliveries ?? 5),
  redelivery: def.redelivery ?? defaultRedelivery,
  placement: def.placement ?? spread,
  corruptSnapshot: def.corruptSnapshot ?? "initial",
  maxQueuedAsks: Math.max(1, def.maxQueuedAsks ?? 1024),
  maxQueuedAskBytes: Math.max(1, def.maxQueuedAskBytes ?? 32 * 1024 * 1024)
})
