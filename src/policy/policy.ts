/**
 * The one interface of every scheduling policy: a pure function `(state, event) -> (state,
 * actions)` with a Schema for its state, so a state can be snapshotted and a journal of events
 * replayed. No clock (time arrives in events), no I/O, no randomness.
 */
import type { Schema } from "effect"
import type { PolicyAction, PolicyConfig, PolicyEvent } from "./vocabulary.ts"

export interface Transition<S> {
  readonly state: S
  readonly actions: ReadonlyArray<PolicyAction>
}

export interface Policy<S = unknown> {
  /** The name `gyre sim --policy` knows it by. */
  readonly name: string
  /** One line saying how it schedules. */
  readonly summary: string
  /** Schema of its state (JSON-serialisable). */
  readonly State: Schema.Codec<S, unknown>
  readonly initial: (config: PolicyConfig) => S
  readonly step: (state: S, event: PolicyEvent) => Transition<S>
}

/** Feeds `events` through `policy` from its initial state; returns the actions of each event. */
export const replay = <S>(
  policy: Policy<S>,
  config: PolicyConfig,
  events: Iterable<PolicyEvent>
): Array<ReadonlyArray<PolicyAction>> => {
  let state = policy.initial(config)
  const out: Array<ReadonlyArray<PolicyAction>> = []
  for (const event of events) {
    const t = policy.step(state, event)
    state = t.state
    out.push(t.actions)
  }
  return out
}
