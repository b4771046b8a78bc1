/**
 * Reading a run's log from outside the run, shared by `gyre replay`, `runs`, `status` and `report`:
 * where the log is (`NATS_URL`, or a stopped embedded store read through a private server on a
 * copy of it, so the original is never touched), which runs a server holds, and the journal as
 * typed entries, positioned (`--from`, `--to`, `--last`) and filtered (`--type`, `--actor`,
 * `--execution`). Nothing here writes to a run's streams or buckets: reads are ordered
 * (ephemeral, unacknowledged) consumers.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer, Schema, Stream } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { PolicyRecord, StepMetrics } from "../protocols/scheduler.ts"
import { Events, RunTopology, protocolsOf } from "../protocols/topology.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { readJournal, type JournalEntry, type JournalSource } from "../runtime/journal.ts"
import { layout } from "../runtime/names.ts"
import { Nats, type NatsShape } from "../runtime/nats.ts"
import type { StartAt } from "../runtime/stream-reader.ts"
import { runDoneJournaled } from "../scheduling/records.ts"

/** The run is not on the server (or not in the store). */
export class RunNotFound extends Schema.TaggedError<RunNotFound>()("RunNotFound", {
  run: Schema.String,
  known: Schema.Array(Schema.String)
}) {}

/** `--store DIR` is not a stopped embedded store. */
export class StoreUnreadable extends Schema.TaggedError<StoreUnreadable>()("StoreUnreadable", {
  dir: Schema.String,
  message: Schema.String
}) {}

/** Every actor kind's protocol (the run's topology's, and the node's), to decode tells and asks as the actors saw them. */
export const runProtocols: Readonly<Record<string, RpcGroup.RpcGroup<any>>> = protocolsOf(RunTopology)

/** Copies a stopped store's JetStream directory to a temporary one (removed when the scope closes). */
const copyStore = (dir: string) =>
  Effect.acquireRelease(
    Effect.try({
      try: () => {
        const source = path.join(dir, "jetstream")
        if (!fs.existsSync(source)) throw new Error(`no jetstream directory in ${dir}`)
        const copy = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-replay-store-"))
        fs.cpSync(source, path.join(copy, "jetstream"), { recursive: true })
        return copy
      },
      catch: (e) => new StoreUnreadable({ dir, message: messageOf(e) })
    }),
    (copy) => Effect.sync(() => fs.rmSync(copy, { recursive: true, force: true }))
  )

export interface LogLocation {
  /** A stopped embedded store (`--store`); else `url`. */
  readonly store?: string | undefined
  readonly url?: string | undefined
  readonly credsFile?: string | undefined
}

/** The NATS connection a reader uses: `url`, or a private server on a copy of `store` (one server: replicas 1, whatever GYRE_REPLICAS says). */
export const readerNats = (where: LogLocation) =>
  where.store !== undefined
    ? Layer.unwrap(Effect.map(copyStore(where.store), (copy) => Nats.layer({ storeDir: copy, name: "gyre-replay", replicas: 1 })))
    : Nats.layer({ url: where.url, credsFile: where.credsFile, name: "gyre-replay" })

const JOURNAL = /^GYRE_(.+)_JOURNAL$/

/** The runs a server holds (one journal stream each), sorted by name. */
export const listRuns = (nats: NatsShape): Effect.Effect<Array<string>, TransportError> =>
  Effect.tryPromise({
    try: async () => {
      const runs: Array<string> = []
      for await (const name of nats.jsm.streams.names()) {
        const m = JOURNAL.exec(name)
        if (m !== null) runs.push(m[1]!)
      }
      return runs.sort()
    },
    catch: (e) => new TransportError({ operation: "list streams", message: messageOf(e) })
  })

/** The run's log on `nats`, once its journal is known to exist. */
export const openRun = (nats: NatsShape, run: string): Effect.Effect<JournalSource, RunNotFound | TransportError> =>
  Effect.gen(function* () {
    const runs = yield* listRuns(nats)
    if (!runs.includes(run)) return yield* Effect.fail(new RunNotFound({ run, known: runs }))
    return { run, nats, layout: layout(run) }
  })

// ---- typed entries ------------------------------------------------------------------------

/** A journal entry with its policy record or step metrics decoded (`error` says when that failed). */
export interface Entry extends JournalEntry {
  /** The policy record of a `sys.policy` entry. */
  readonly record?: PolicyRecord
  /** The metrics of a `sys.step` entry. */
  readonly metrics?: StepMetrics
}

/** Adds the decoded record or metrics to a journal entry the read just made (added, not copied: no one else holds it). */
const typed = (entry: JournalEntry): Entry => {
  if (entry.via !== "event" || entry.error !== undefined) return entry
  const e = entry as { -readonly [K in keyof Entry]: Entry[K] }
  if (entry.name === Events.policy.name) {
    const r = Events.policy.decode(entry.payload)
    if (r._tag === "Success") e.record = r.value
    else e.error = `policy record: ${String(r.cause)}`
  } else if (entry.name === Events.step.name) {
    const m = Events.step.decode(entry.payload)
    if (m._tag === "Success") e.metrics = m.value
    else e.error = `step metrics: ${String(m.cause)}`
  }
  return e
}

/** What `--type` matches: a policy record's event tag, a tell's or ask's request, a system event's name. */
export const entryType = (e: Entry): string => e.record?.event._tag ?? e.name

/** The execution ids an entry concerns (a record's execution is named as the plan names it). */
const executionsOf = (e: Entry): ReadonlyArray<string> => {
  if (e.record !== undefined) {
    const ev = e.record.event
    return "execution" in ev ? [`b${ev.batch}-x${ev.execution}`, String(ev.execution)] : []
  }
  if (e.metrics !== undefined) return e.metrics.trainedExecutions
  const p = e.payload as { execution?: unknown; ref?: { execution?: unknown } } | undefined
  const id = p?.execution ?? p?.ref?.execution
  return typeof id === "string" ? [id] : []
}

export interface EntryFilter {
  /** Any of these types (`entryType`, or the raw name: `policy` selects every record). */
  readonly types?: ReadonlyArray<string>
  /** `kind` or `kind/id`: tells and asks to it, and records of a cell event naming it as the device. */
  readonly actor?: string
  /** An execution id (`b<b>-x<n>`) or its number. */
  readonly execution?: string
}

const actorOf = (e: Entry): string | undefined =>
  e.actor !== undefined ? `${e.actor.kind}/${e.actor.id}` : e.record?.device

/** Whether `e` passes every filter given. */
export const matches = (filter: EntryFilter) => (e: Entry): boolean => {
  if (filter.types !== undefined && !filter.types.includes(entryType(e)) && !filter.types.includes(e.name)) return false
  if (filter.actor !== undefined) {
    const a = actorOf(e)
    if (a === undefined || (a !== filter.actor && !a.startsWith(`${filter.actor}/`))) return false
  }
  if (filter.execution !== undefined && !executionsOf(e).includes(filter.execution)) return false
  return true
}

// ---- positions ----------------------------------------------------------------------------

/** A journal position: a stream sequence, a time, or a training step (`step:K`). */
export type Position = { readonly seq: number } | { readonly time: Date } | { readonly step: number }

/** Parses `SEQ`, `step:K` or an ISO time; undefined when it is none of them. */
export const parsePosition = (text: string): Position | undefined => {
  if (/^\d+$/.test(text)) return { seq: Number(text) }
  const step = /^step:(\d+)$/.exec(text)
  if (step !== null) return { step: Number(step[1]) }
  const t = Date.parse(text)
  return /^\d{4}-\d\d-\d\d/.test(text) && Number.isFinite(t) ? { time: new Date(t) } : undefined
}

const stepOf = (r: PolicyRecord): number | undefined => {
  const e = r.event
  if (e._tag === "ExecutionStarted" || e._tag === "ExecutionFinished") return e.batch
  if (e._tag === "MicroStepDone" || e._tag === "StepDone") return e.step
  return undefined
}

/**
 * The journal sequence of step `step`'s start (its first record: a start, finish or progress of
 * its batch) or end (its `StepDone` record); undefined when the journal holds none.
 */
export const stepSequence = (log: JournalSource, step: number, edge: "start" | "end") =>
  readJournal(log).pipe(
    Stream.map(typed),
    Stream.filter((e) =>
      e.record !== undefined && (edge === "start" ? stepOf(e.record) === step : e.record.event._tag === "StepDone" && e.record.event.step === step)
    ),
    Stream.runHead,
    Effect.map((head) => (head._tag === "Some" ? head.value.seq : undefined))
  )

export interface ReadOptions {
  readonly from?: Position
  /** Last entry to include. */
  readonly to?: Position
  /** Only the last `last` entries that pass the filters (of those up to `to`). */
  readonly last?: number
  readonly filter?: EntryFilter
  /** Keep reading new entries until interrupted or the run's end (`run-done`, printed last). */
  readonly follow?: boolean
}

const startOf = (log: JournalSource, from: Position | undefined): Effect.Effect<StartAt | undefined, TransportError> => {
  if (from === undefined) return Effect.succeed({ seq: 1 })
  if (!("step" in from)) return Effect.succeed(from)
  return Effect.map(stepSequence(log, from.step, "start"), (seq) => (seq === undefined ? undefined : { seq }))
}

const endOf = (log: JournalSource, to: Position | undefined): Effect.Effect<(e: Entry) => boolean, TransportError> => {
  if (to === undefined) return Effect.succeed(() => true)
  if ("seq" in to) return Effect.succeed((e) => e.seq <= to.seq)
  if ("time" in to) return Effect.succeed((e) => e.time.getTime() <= to.time.getTime())
  return Effect.map(stepSequence(log, to.step, "end"), (seq) => (e: Entry) => seq === undefined || e.seq <= seq)
}

/** Keeps the last `n` values of a finite stream. */
const lastOf = <A, E>(n: number) => (stream: Stream.Stream<A, E>): Stream.Stream<A, E> =>
  Stream.unwrap(
    Effect.map(
      Stream.runFold(stream, () => [] as Array<A>, (kept, a) => {
        kept.push(a)
        if (kept.length > n) kept.shift()
        return kept
      }),
      Stream.fromIterable
    )
  )

/** The run's end: nothing the run does is journaled after it, so following stops there. */
const isRunDone = (e: Entry) => e.via === "event" && e.name === "run-done"

/**
 * The run's journal as typed entries, positioned and filtered as `options` say. A `step:K` start
 * the journal does not hold yet gives nothing (or, following, everything that comes). Following
 * ends at the run's `run-done` (at once when the journal holds it already: a stopped store, an
 * ended run).
 */
export const readEntries = (log: JournalSource, options: ReadOptions = {}): Stream.Stream<Entry, TransportError> =>
  Stream.unwrap(
    Effect.gen(function* () {
      const from = yield* startOf(log, options.from)
      const follow = options.follow === true && options.to === undefined && !(yield* runDoneJournaled(log))
      if (from === undefined && !follow) return Stream.empty
      const within = yield* endOf(log, options.to)
      const read = (start: StartAt, follow: boolean) =>
        readJournal(log, { from: start, protocols: runProtocols, follow }).pipe(
          Stream.map(typed),
          Stream.takeWhile(within),
          follow ? Stream.takeUntil(isRunDone) : (s) => s,
          Stream.filter(matches(options.filter ?? {}))
        )
      const start = from ?? { seq: 1 }
      if (options.last === undefined) return read(start, follow)
      if (!follow) return lastOf<Entry, TransportError>(options.last)(read(start, false))
      // Following: the last N of what is there now, then everything new.
      const now = yield* lastSeqOf(log)
      return Stream.concat(lastOf<Entry, TransportError>(options.last)(read(start, false)), read({ seq: now + 1 }, true))
    })
  )

/** The journal's last stream sequence now (0: empty). */
export const lastSeqOf = (log: JournalSource): Effect.Effect<number, TransportError> =>
  Effect.tryPromise({
    try: () => log.nats.jsm.streams.info(log.layout.journalStream).then((i) => i.state.last_seq),
    catch: (e) => new TransportError({ operation: `stream info ${log.layout.journalStream}`, message: messageOf(e) })
  })
