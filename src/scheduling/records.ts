/**
 * The scheduler's part of the run's journal (system events on `GYRE_<run>_JOURNAL`):
 *
 * | subject | written | contents |
 * | --- | --- | --- |
 * | `gyre.<run>.sys.run-config` | once, by the first leader | `RunConfig` (src/protocols/run.ts) |
 * | `gyre.<run>.sys.policy` | one per policy step, before its actions run | `PolicyRecord` (src/protocols/scheduler.ts) |
 * | `gyre.<run>.sys.run-done` | after the last `StepDone` | `RunSummary` |
 *
 * (`gyre.<run>.sys.step`, each step's `StepMetrics`, is the core trainer's.)
 *
 * Records are fenced: each is published with the sequence of the record before it as the
 * subject's expected last sequence, so of two schedulers that believe they lead, only one
 * extends the records; the other's write fails with `JournalFenced` (message ids
 * `policy-<term>-<index>` make a retried write of one record idempotent). A write that fails
 * (no acknowledgement) and finds its own record last (by that message id) was stored: its
 * acknowledgement was lost, as when the scheduler's server is killed (test/chaos/cluster.test.ts:
 * the leader took its own record for another's and stopped, and the run stalled).
 */
import { Effect, Schema, Stream } from "effect"
import type { TransportError } from "../runtime/errors.ts"
import { readLast, readStored } from "../runtime/stream-reader.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { JournalSource } from "../runtime/journal.ts"
import type { PolicyRecord } from "../protocols/scheduler.ts"
import type { RunConfig } from "../protocols/run.ts"
import { Events } from "../protocols/topology.ts"
import type { RunAudit } from "./audit.ts"

/** Another scheduler wrote a record after the last one this one knows: it no longer leads. */
export class JournalFenced extends Schema.TaggedError<JournalFenced>()("JournalFenced", {
  index: Schema.Number,
  term: Schema.Number,
  expectedSeq: Schema.Number,
  foundSeq: Schema.Number
}) {}

/** A journaled record cannot be read or does not replay to what it says. */
export class JournalDiverged extends Schema.TaggedError<JournalDiverged>()("JournalDiverged", {
  index: Schema.Number,
  reason: Schema.String
}) {}

/** The run's end (`gyre.<run>.sys.run-done`): the journal's audit (src/scheduling/audit.ts) with the run's name, policy and wall time. */
export interface RunSummary extends RunAudit {
  readonly run: string
  readonly policy: string
  /** From the run's start to its last step's end (the policy clock). */
  readonly wallS: number
}

const decodeConfig = Schema.decodeUnknownExit(Schema.fromJsonString(Events.runConfig.codec))

const subjects = (system: JournalSource) => ({
  config: Events.runConfig.subject(system.run),
  policy: Events.policy.subject(system.run),
  done: Events.runDone.subject(system.run)
})

export interface StoredRecord {
  readonly seq: number
  readonly record: PolicyRecord
}

/** Every policy record the journal holds now, in order. */
export const readRecords = (system: JournalSource): Effect.Effect<Array<StoredRecord>, TransportError | JournalDiverged> =>
  readStored(system.nats, system.layout.journalStream, undefined, subjects(system).policy).pipe(
    Stream.mapEffect((m) => {
      const decoded = Events.policy.decode(m.json())
      return decoded._tag === "Success"
        ? Effect.succeed({ seq: m.seq, record: decoded.value })
        : Effect.fail(new JournalDiverged({ index: -1, reason: `record at journal sequence ${m.seq} does not decode: ${String(decoded.cause)}` }))
    }),
    Stream.runCollect,
    Effect.map((chunk) => [...chunk])
  )

/** Writes records after the one at journal sequence `lastSeq` (0: none yet), fenced as the module says. */
export const recordWriter = (system: ActorSystemShape, lastSeq: number) => {
  const subject = subjects(system).policy
  let last = lastSeq
  return Effect.fn("Scheduler.journal")(function* (record: PolicyRecord) {
    const expected = last
    const msgID = `policy-${record.term}-${record.index}`
    const ack: { readonly seq: number } = yield* system.publishEvent(Events.policy, record, { msgId: msgID, expectLastSeq: expected }).pipe(
      Effect.catchTag("TransportError", (e) =>
        readLast(system.nats, system.layout.journalStream, subject).pipe(
          Effect.flatMap((m): Effect.Effect<{ readonly seq: number }, TransportError | JournalFenced> => {
            if (m === undefined || m.seq === expected) return Effect.fail(e)
            // This very record, stored with its acknowledgement lost (a connection cut while the
            // server stored it): written, not fenced.
            if (m.header?.get("Nats-Msg-Id") === msgID) return Effect.succeed({ seq: m.seq })
            return Effect.fail(new JournalFenced({ index: record.index, term: record.term, expectedSeq: expected, foundSeq: m.seq }))
          })
        )
      )
    )
    last = ack.seq
  })
}

/** The run's configuration as journaled, or undefined while none is. */
export const readRunConfig = (system: JournalSource) =>
  readLast(system.nats, system.layout.journalStream, subjects(system).config).pipe(
    Effect.flatMap((m) => {
      if (m === undefined) return Effect.succeed(undefined)
      const decoded = decodeConfig(m.string())
      return decoded._tag === "Success"
        ? Effect.succeed(decoded.value)
        : Effect.fail(new JournalDiverged({ index: -1, reason: `the journaled run configuration does not decode: ${String(decoded.cause)}` }))
    })
  )

/** The run's configuration as journaled: the one already there, else `config`, written now. */
export const journalRunConfig = Effect.fn("Scheduler.runConfig")(function* (system: ActorSystemShape, config: RunConfig) {
  const read = readRunConfig(system)
  const journaled = yield* read
  if (journaled !== undefined) return journaled
  const written = yield* system.publishEvent(Events.runConfig, config, { msgId: "run-config", expectLastSeq: 0 }).pipe(Effect.as(config), Effect.result)
  if (written._tag === "Success") return written.success
  // Another leader wrote it between our read and our write: theirs is the run's.
  const theirs = yield* read
  return theirs === undefined ? yield* Effect.fail(written.failure) : theirs
})

/** Whether the run's end is journaled. */
export const runDoneJournaled = (system: JournalSource) =>
  readLast(system.nats, system.layout.journalStream, subjects(system).done).pipe(Effect.map((m) => m !== undefined))

export const journalRunDone = (system: ActorSystemShape, summary: RunSummary) =>
  system.publishEvent(Events.runDone, summary, { msgId: "run-done" }).pipe(Effect.asVoid)
