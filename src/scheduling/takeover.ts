/**
 * Takeover: a scheduler that has just won the lease rebuilds the run from the journal. The
 * records are replayed through the policy from its initial state; each must carry the next
 * index, a term no newer than the new leader's, the same actions the policy gives now and the
 * same state digest, or the takeover stops with `JournalDiverged`. Each record is folded into a
 * fresh book on the way, so the book ends as the last leader's was; the shell then re-executes
 * what has no completion yet (`Shell.resume`).
 */
import { Effect } from "effect"
import type { Policy } from "../policy/policy.ts"
import type { RunConfig } from "../protocols/run.ts"
import type { Book } from "./book.ts"
import { actionsJson, stateDigest, type DriverStart } from "./driver.ts"
import { JournalDiverged, type StoredRecord } from "./records.ts"

export interface Replayed extends DriverStart {
  /** Journal sequence of the last record (0: none), where the next write is fenced. */
  readonly lastSeq: number
  /** Terms that wrote the records, in order of appearance. */
  readonly terms: ReadonlyArray<number>
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
      const t = policy.step(state, record.event)
      const replayed = actionsJson(t.actions)
      if (replayed !== actionsJson(record.actions)) return diverged(`the policy answers ${replayed}, the record says ${actionsJson(record.actions)}`)
      const digest = stateDigest(policy, t.state)
      if (digest !== record.digest) return diverged(`state digest ${digest}, the record says ${record.digest}`)
      state = t.state
      at = Math.max(at, record.event.at)
      if (terms[terms.length - 1] !== record.term) terms.push(record.term)
      book.apply(record)
    }
    return Effect.succeed({ state, index: stored.length, at, lastSeq: stored[stored.length - 1]?.seq ?? 0, terms })
  })
