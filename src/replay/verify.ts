/**
 * `gyre replay --verify`: first the log's integrity (sequence gaps, duplicated message ids,
 * two writers of one record index or a stale term writing after a newer one, messages that fail
 * their schema), then the recorded `PolicyEvent`s fed through the policy the run used, from its
 * recorded configuration, each record checked exactly as a standby checks it on takeover
 * (`checkRecord`, src/scheduling/takeover.ts): the same actions, the same state digest. A
 * divergence carries the stream sequence, the event, the expected and recorded values and a
 * field-level difference.
 */
import { Effect, Schema, Stream } from "effect"
import type { PolicyEvent } from "../policy/vocabulary.ts"
import { RunConfig } from "../protocols/run.ts"
import type { PolicyRecord } from "../protocols/scheduler.ts"
import type { TransportError } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { policyOf, type UnknownPolicy } from "../scheduling/driver.ts"
import { checkRecord, type RecordDivergence } from "../scheduling/takeover.ts"
import { readEntries, type Entry } from "./read.ts"

export type IntegrityCheck = "sequence-gap" | "record-gap" | "duplicate-id" | "two-writers" | "stale-term" | "schema"

export interface IntegrityFinding {
  readonly check: IntegrityCheck
  readonly seq: number
  readonly message: string
}

export interface Divergence extends RecordDivergence {
  readonly seq: number
  readonly event: PolicyEvent
}

export interface Verification {
  readonly entries: number
  readonly records: number
  readonly integrity: ReadonlyArray<IntegrityFinding>
  readonly divergences: ReadonlyArray<Divergence>
  /** Why the policy could not be replayed at all (no configuration, unknown policy). */
  readonly unverifiable?: string
}

const decodeConfig = Schema.decodeUnknownExit(Schema.toCodecJson(RunConfig))

/** Folds journal entries into integrity findings and the records in journal order. */
export class IntegrityScan {
  readonly findings: Array<IntegrityFinding> = []
  readonly records: Array<{ readonly seq: number; readonly record: PolicyRecord }> = []
  config: RunConfig | undefined
  entries = 0
  private lastSeq = 0
  private readonly ids = new Map<string, number>()
  /** The first record of each index, with its sequence (compared as JSON only when an index comes again). */
  private readonly byIndex = new Map<number, { readonly seq: number; readonly record: PolicyRecord }>()
  private newestTerm = 0

  private find(check: IntegrityCheck, seq: number, message: string) {
    this.findings.push({ check, seq, message })
  }

  add(e: Entry): void {
    this.entries++
    if (e.seq !== this.lastSeq + 1) this.find("sequence-gap", e.seq, `stream sequences ${this.lastSeq + 1}..${e.seq - 1} are missing`)
    this.lastSeq = e.seq
    if (e.msgId !== undefined) {
      const first = this.ids.get(e.msgId)
      if (first !== undefined) this.find("duplicate-id", e.seq, `message id ${e.msgId} already stored at sequence ${first}`)
      else this.ids.set(e.msgId, e.seq)
    }
    if (e.error !== undefined) return this.find("schema", e.seq, `${e.subject}: ${e.error.split("\n")[0]}`)
    if (e.via === "event" && e.name === "run-config" && this.config === undefined) {
      const c = decodeConfig(e.payload)
      if (c._tag === "Failure") return this.find("schema", e.seq, `run configuration: ${String(c.cause)}`)
      this.config = c.value
    }
    if (e.record !== undefined) this.addRecord(e.seq, e.record)
  }

  private addRecord(seq: number, record: PolicyRecord) {
    const seen = this.byIndex.get(record.index)
    if (seen !== undefined) {
      if (JSON.stringify(seen.record) !== JSON.stringify(record)) {
        const first = seen.record.term
        const who = first === record.term ? `a second writer under term ${record.term}` : `term ${record.term} (first written under term ${first})`
        this.find("two-writers", seq, `record ${record.index} written again by ${who}, differently (first at sequence ${seen.seq})`)
      }
      return
    }
    if (record.term < this.newestTerm) this.find("stale-term", seq, `record ${record.index} written under term ${record.term} after term ${this.newestTerm}`)
    this.newestTerm = Math.max(this.newestTerm, record.term)
    const expected = this.records.length === 0 ? 0 : this.records[this.records.length - 1]!.record.index + 1
    if (record.index !== expected) this.find("record-gap", seq, `policy record ${record.index} follows record ${expected - 1}: records ${expected}..${record.index - 1} are missing`)
    this.byIndex.set(record.index, { seq, record })
    this.records.push({ seq, record })
  }
}

/** Replays the scanned records through the run's policy; every divergence, or only the first. */
const replayPolicy = (scan: IntegrityScan, keepGoing: boolean): Effect.Effect<Array<Divergence>, UnknownPolicy> =>
  Effect.gen(function* () {
    const config = scan.config!
    const policy = yield* policyOf(config)
    let state = policy.initial(config.policyConfig)
    const divergences: Array<Divergence> = []
    for (const { seq, record } of scan.records) {
      const checked = checkRecord(policy, state, record)
      state = checked.state
      if (checked.divergence === undefined) continue
      divergences.push({ ...checked.divergence, seq, event: record.event })
      if (!keepGoing) break
    }
    return divergences
  })

/** Verifies the run's log as the module says. */
export const verifyRun = (log: JournalSource, keepGoing: boolean): Effect.Effect<Verification, TransportError> =>
  Effect.gen(function* () {
    const scan = new IntegrityScan()
    yield* readEntries(log).pipe(Stream.runForEach((e) => Effect.sync(() => scan.add(e))))
    const base = { entries: scan.entries, records: scan.records.length, integrity: scan.findings }
    if (scan.config === undefined) return { ...base, divergences: [], unverifiable: "the journal holds no run configuration (gyre.<run>.sys.run-config)" }
    return yield* replayPolicy(scan, keepGoing).pipe(
      Effect.map((divergences) => ({ ...base, divergences })),
      Effect.catchTag("UnknownPolicy", (e) => Effect.succeed({ ...base, divergences: [], unverifiable: `unknown policy '${e.policy}' (known: ${e.known.join(", ")})` }))
    )
  })

/** Whether the log passed. */
export const verified = (v: Verification): boolean => v.integrity.length === 0 && v.divergences.length === 0 && v.unverifiable === undefined
