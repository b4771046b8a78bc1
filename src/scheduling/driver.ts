/**
 * The driver: the one place the policy is stepped. Each input, already a `PolicyEvent` with
 * its `at` (seconds since the run's `startedAt`, never decreasing, continued by a standby),
 * becomes one `PolicyRecord` (index, lease term, event, actions, digest of the policy state
 * after it), which is journaled first, then folded into the book, then handed to the shell to
 * carry out. After each event, dispatched executions start while rollout slots are free, each
 * start an `ExecutionStarted` record of its own, exactly as the simulator fills its slots.
 *
 * Nothing here decides: the policy decides, the book remembers, the shell acts.
 */
import { hash } from "node:crypto"
import { Effect, Schema } from "effect"
import { jsonWriter } from "../common/schema-json.ts"
import { asyncSplit, fixedPolicies, type Policy } from "../policy/index.ts"
import { PolicyAction, type PolicyEvent } from "../policy/vocabulary.ts"
import type { PolicyRecord } from "../protocols/scheduler.ts"
import type { RunConfig } from "../protocols/run.ts"
import type { Book, RecordContext } from "./book.ts"

export class UnknownPolicy extends Schema.TaggedError<UnknownPolicy>()("UnknownPolicy", {
  policy: Schema.String,
  known: Schema.Array(Schema.String)
}) {}

/** The policy a run configuration names. */
export const policyOf = (config: RunConfig): Effect.Effect<Policy<unknown>, UnknownPolicy> => {
  if (config.policy === "async") return Effect.succeed(asyncSplit(config.rolloutCells ?? 1) as Policy<unknown>)
  const policy = fixedPolicies[config.policy]
  return policy === undefined
    ? Effect.fail(new UnknownPolicy({ policy: config.policy, known: ["async", ...Object.keys(fixedPolicies)] }))
    : Effect.succeed(policy as Policy<unknown>)
}

/** `JSON.stringify` of the schema's JSON encoding of a value: written directly when the schema is plain, else through its codec. */
const encodedJson = (schema: Schema.Codec<unknown, unknown>): ((value: unknown) => string) => {
  const encode = Schema.encodeSync(Schema.toCodecJson(schema))
  const viaCodec = (value: unknown) => JSON.stringify(encode(value))
  const direct = jsonWriter(schema)
  return direct === undefined ? viaCodec : (value) => direct(value) ?? viaCodec(value)
}

const writers = new WeakMap<Policy<unknown>, (state: unknown) => string>()

/** sha256 (hex) of the JSON encoding of a policy state: what a record's `digest` holds. */
export const stateDigest = (policy: Policy<unknown>, state: unknown): string => {
  let write = writers.get(policy)
  if (write === undefined) writers.set(policy, (write = encodedJson(policy.State)))
  return hash("sha256", write(state))
}

/** The JSON of a list of actions, for comparing a replayed step with its record. */
export const actionsJson: (actions: ReadonlyArray<PolicyAction>) => string = encodedJson(Schema.Array(PolicyAction) as Schema.Codec<unknown, unknown>)

/** Where a driver starts: the initial state, or the state a replay of the journal left. */
export interface DriverStart {
  readonly state: unknown
  readonly index: number
  /** The last record's `at` (the clock never goes back past it). */
  readonly at: number
}

/** The policy clock: seconds since the run's `startedAt` (ms since the epoch), never less than `from` or any reading before. */
export const runClock = (startedAt: number, from: number) => {
  let at = from
  return () => (at = Math.max(at, (Date.now() - startedAt) / 1000))
}

/** What an input carries besides its event: the book's context and, for a cell event, the device and its incarnation (journaled). */
export type FeedContext = RecordContext & { readonly device?: string; readonly incarnation?: number }

export interface DriverOptions<E> {
  readonly policy: Policy<unknown>
  readonly book: Book
  readonly term: number
  readonly now: () => number
  readonly from: DriverStart
  readonly write: (record: PolicyRecord) => Effect.Effect<void, E>
  readonly execute: (record: PolicyRecord) => Effect.Effect<void>
}

export interface Driver<E> {
  /** Steps the policy on `event`, journals, applies and executes it, then starts executions. */
  readonly feed: (event: PolicyEvent, context?: FeedContext) => Effect.Effect<void, E>
  /** Starts dispatched executions while rollout slots are free. */
  readonly settle: Effect.Effect<void, E>
}

export const makeDriver = <E>(options: DriverOptions<E>): Driver<E> => {
  const { policy, book, term, now } = options
  let state = options.from.state
  let index = options.from.index

  const one = (event: PolicyEvent, context: FeedContext) =>
    Effect.gen(function* () {
      const t = policy.step(state, event)
      const record: PolicyRecord = {
        index,
        term,
        event,
        actions: t.actions,
        digest: stateDigest(policy, t.state),
        ...(context.device === undefined ? {} : { device: context.device }),
        ...(context.incarnation === undefined ? {} : { incarnation: context.incarnation })
      }
      yield* options.write(record)
      state = t.state
      index++
      book.apply(record, context)
      yield* options.execute(record)
    })

  const settle = Effect.gen(function* () {
    while (true) {
      const next = book.dispatcher.next(book.slots)
      if (next === undefined) return
      yield* one({ _tag: "ExecutionStarted", execution: next.n, batch: next.batch, at: now() }, {})
    }
  })

  return {
    feed: Effect.fn("Scheduler.feed")(function* (event: PolicyEvent, context: FeedContext = {}) {
      yield* one(event, context)
      yield* settle
    }),
    settle
  }
}
