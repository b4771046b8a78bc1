/**
 * Takeover: a scheduler that has just won the lease rebuilds the run from the journal. The
 * records are replayed through the policy from its initial state; each must carry the next
 * index, a term no newer than the new leader's, the same actions the policy gives now and the
 * same state digest (`checkRecord`, which `gyre replay --verify` runs too), or the takeover stops
 * with `JournalDiverged`. Each record is folded into a
 * fresh book on the way, so the book ends as the last leader's was; the shell then re-executes
 * what has no completion yet (`Shell.resume`).
 */
import { Effect } from "effect"
import { jsonDiff, type FieldDifference } from "../common/json-diff.ts"
import type { Policy } from "../policy/policy.ts"
import type { RunConfig } from "../protocols/run.ts"
import type { PolicyRecord } from "../protocols/scheduler.ts"
import type { Book } from "./book.ts"
import { actionsJson, stateDigest, type DriverStart } from "./driver.ts"
import { JournalDiverged, type StoredRecord } from "./records.ts"

export interface Replayed extends DriverStart {
  /** Journal sequence of the last record (0: none), where the next write is fenced. */
  readonly lastSeq: number
  /** Terms that wrote the records, in order of appearance. */
  readonly terms: ReadonlyArray<number>
}

/** A record the policy does not replay to: its actions, or its state digest, differ. */
export interface RecordDivergence {
  readonly index: number
  readonly what: "actions" | "digest"
  /** What the policy gives now (actions as JSON values, or the digest). */
  readonly expected: unknown
  readonly recorded: unknown
  readonly diff: ReadonlyArray<FieldDifference>
  readonly reason: string
}

/**
 * Steps `policy` from `state` on the record's event and checks the record's actions and digest;
 * the state after the event (the policy's, also when the record diverges).
 */
export const checkRecord = (policy: Policy<unknown>, state: unknown, record: PolicyRecord): { readonly state: unknown; readonly divergence?: RecordDivergence } => {
  const t = policy.step(state, record.event)
  const replayed = actionsJson(t.actions)
  const recorded = actionsJson(record.actions)
  if (replayed !== recorded) {
    const [expected, was] = [JSON.parse(replayed) as unknown, JSON.parse(recorded) as unknown]
    const reason = `the policy answers ${replayed}, the record says ${recorded}`
    return { state: t.state, divergence: { index: record.index, what: "actions", expected, recorded: was, diff: jsonDiff(expected, was), reason } }
  }
  const digest = stateDigest(policy, t.state)
  if (digest !== record.digest) {
    const reason = `state digest ${digest}, the record says ${record.digest}`
    return { state: t.state, divergence: { index: record.index, what: "digest", expected: digest, recorded: record.digest, diff: [{ path: "digest", expected: digest, recorded: record.digest }], reason } }
  }
  return { state: t.state }
}

/** Replays `stored` through `policy` into `book`, checking every record (see the module comment). */
export const replayRecords = (
  policy: Policy<unknown>,
  config: RunConfig,
  book: Book,
  stored: ReadonlyArray<StoredRecord>,
  term: number
): Effect.Effect<Replayed, JournalDiverged> =>
  Effect.suspend(() => {
    let state = policy.initial(config.policyConfig)
    let at = 0
    const terms: Array<number> = []
    for (const [i, { record }] of stored.entries()) {
      const diverged = (reason: string) => Effect.fail(new JournalDiverged({ index: record.index, reason }))
      if (record.index !== i) return diverged(`record ${i} carries index ${record.index}`)
      if (record.term > term) return diverged(`written under term ${record.term}, after this leader's term ${term}`)
      if (terms.length > 0 && record.term < terms[terms.length - 1]!) return diverged(`term ${record.term} after term ${terms[terms.length - 1]}`)
      const checked = checkRecord(policy, state, record)
      if (checked.divergence !== undefined) return diverged(checked.divergence.reason)
      state = checked.state
      at = Math.max(at, record.event.at)
      if (terms[terms.length - 1] !== record.term) terms.push(record.term)
      book.apply(record)
    }
    return Effect.succeed({ state, index: stored.length, at, lastSeq: stored[stored.length - 1]?.seq ?? 0, terms })
  })
