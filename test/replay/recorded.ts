/**
 * A short recorded run for the replay tests: the live scheduler with the scheduling tests'
 * scripted devices and harness runner (test/scheduling), on a real embedded nats-server whose
 * store is a directory that stays after the server stops, so `gyre replay --store` reads a stopped
 * store. Beside the run, two tampered copies of its journal in the same store: `<run>-altered`
 * (one record's actions changed) and `<run>-gapped` (one policy record deleted).
 */
import { execFile } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { headers as natsHeaders } from "@nats-io/transport-node"
import { Effect, Layer, Stream } from "effect"
import { layout } from "../../src/runtime/names.ts"
import { Nats, type NatsShape } from "../../src/runtime/nats.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { observed } from "../scheduling/fakes.ts"
import { runConfig, runDone, schedulerOptions, standingBy, startFakes, switchesSettled } from "../scheduling/run.ts"

export const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname

/** One journal message as stored. */
export interface Stored {
  readonly seq: number
  readonly subject: string
  readonly json: any
}

export interface Recorded {
  readonly run: string
  readonly store: string
  readonly journal: ReadonlyArray<Stored>
  /** The trajectory stream's call records and outcomes, as stored (JSON). */
  readonly calls: ReadonlyArray<any>
  readonly outcomes: ReadonlyArray<any>
  /** The altered copy: the record index changed and the journal sequence it sits at. */
  readonly altered: { readonly run: string; readonly index: number; readonly seq: number }
  readonly gapped: { readonly run: string; readonly index: number; readonly seq: number }
}

const readAll = (nats: NatsShape, run: string) =>
  readStored(nats, layout(run).journalStream).pipe(
    Stream.map((m) => ({ seq: m.seq, subject: m.subject, json: m.json<any>(), headers: m.headers, data: m.data })),
    Stream.runCollect,
    Effect.map((c) => [...c])
  )

/** Copies `run`'s journal to `copy`, message by message (headers kept), `edit` changing a payload. */
const copyJournal = (nats: NatsShape, run: string, copy: string, edit: (m: Stored) => unknown) =>
  Effect.gen(function* () {
    const names = layout(copy)
    yield* Effect.promise(() => nats.jsm.streams.add({ name: names.journalStream, subjects: names.journalSubjects }))
    for (const m of yield* readAll(nats, run)) {
      const h = natsHeaders()
      for (const [k, v] of m.headers ?? []) for (const x of v) h.append(k, x)
      const data = edit(m)
      yield* Effect.promise(() => nats.js.publish(m.subject.replace(`gyre.${run}.`, `gyre.${copy}.`), data === undefined ? m.data : JSON.stringify(data), { headers: h }))
    }
  })

/** Records the run into a fresh store directory and stops its server. */
export const recordRun = (run: string): Promise<Recorded> => {
  const store = mkdtempSync(join(tmpdir(), "gyre-replay-test-"))
  const program = Effect.gen(function* () {
    const system = yield* ActorSystem
    const seen = observed()
    const fakes = yield* startFakes(seen, { devices: 2 })
    const node = yield* standingBy(schedulerOptions(runConfig(run)))
    yield* runDone(system)
    yield* switchesSettled(system)
    yield* node.drain
    yield* fakes.drain
    const journal = (yield* readAll(system.nats, run)).map(({ seq, subject, json }) => ({ seq, subject, json }))
    const trajectories = yield* readStored(system.nats, `GYRE_${run}_TRAJECTORIES`).pipe(Stream.map((m) => ({ subject: m.subject, json: m.json<any>() })), Stream.runCollect)
    const records = journal.filter((m) => m.subject.endsWith(".sys.policy"))
    const acting = records.find((m) => m.json.actions.length > 0)!
    yield* copyJournal(system.nats, run, `${run}-altered`, (m) => (m.seq === acting.seq ? { ...m.json, actions: [] } : undefined))
    const dropped = records[5]!
    yield* copyJournal(system.nats, run, `${run}-gapped`, () => undefined)
    yield* Effect.promise(() => system.nats.jsm.streams.deleteMessage(layout(`${run}-gapped`).journalStream, dropped.seq))
    return {
      run,
      store,
      journal,
      calls: [...trajectories].filter((m) => m.subject.includes(".calls.")).map((m) => m.json),
      outcomes: [...trajectories].filter((m) => m.subject.includes(".outcomes.")).map((m) => m.json),
      altered: { run: `${run}-altered`, index: acting.json.index, seq: acting.seq },
      gapped: { run: `${run}-gapped`, index: dropped.json.index, seq: dropped.seq }
    }
  })
  const layer = ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({ storeDir: store })))
  return Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(layer)))
}

export interface CliResult {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/** Runs `gyre ...` as a child process. */
export const gyreCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}): Promise<CliResult> =>
  new Promise((resolve) =>
    execFile("node", [gyre, ...args], { encoding: "utf8", env: { ...process.env, ...env }, timeout: 120_000, maxBuffer: 64 << 20 }, (e, stdout, stderr) =>
      resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : 1, stdout, stderr })
    )
  )

export const jsonLines = (out: string): Array<any> => out.trim().split("\n").filter((l) => l !== "").map((l) => JSON.parse(l))
