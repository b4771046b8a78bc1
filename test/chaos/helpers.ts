/**
 * Chaos-test helpers: temporary directories, process liveness, a client system connected to
 * a node's embedded server as one of the credentials directory's users, the starts of a run's
 * executions as their runner marked them, and the fault record the chaos suite's summary line
 * is made of.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Duration, Effect, Layer, Scope, Stream } from "effect"
import { rlLayout } from "../../src/protocols/layout.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { seedFile } from "../../src/runtime/auth.ts"
import type { JournalSource } from "../../src/runtime/journal.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { ActorSystem } from "../../src/runtime/system.ts"

export const tempDir = (name: string) => fs.mkdtempSync(path.join(os.tmpdir(), `gyre-chaos-${name}-`))

export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** Waits until `pid` is gone; its time in ms, or undefined after `timeoutMs`. */
export const goneWithin = async (pid: number, timeoutMs: number): Promise<number | undefined> => {
  const started = Date.now()
  while (Date.now() - started < timeoutMs) {
    if (!alive(pid)) return Date.now() - started
    await new Promise((r) => setTimeout(r, 25))
  }
  return undefined
}

/** The system of `run` at `url`, connected as `user` of credentials directory `authDir` (none when absent). */
export const clientLayer = (run: string, url: string, authDir?: string, user = "actor-host") =>
  ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({ url, ...(authDir !== undefined ? { nkeyFile: seedFile(authDir, user) } : {}) })))

/** Runs `effect` in the system of `run` at `url`. */
export const asClient = <A, E>(run: string, url: string, authDir: string | undefined, effect: Effect.Effect<A, E, ActorSystem | Nats | Scope.Scope>) =>
  Effect.runPromise(Effect.scoped(effect).pipe(Effect.provide(clientLayer(run, url, authDir))) as Effect.Effect<A, E>)

export const sleep = (ms: number) => Effect.sleep(Duration.millis(ms))

/** Starts of each execution of the run, as its harness runner marked them (`Gyre-Execution-Start` on its calls subject). */
export const executionStarts = (system: JournalSource) =>
  Effect.gen(function* () {
    const starts = new Map<string, number>()
    const names = rlLayout(system.run)
    yield* readStored(system.nats, names.trajectoryStream, { seq: 1 }, names.allCalls).pipe(
      Stream.runForEach((m) =>
        Effect.sync(() => {
          if (!m.headers?.has("Gyre-Execution-Start")) return
          const execution = m.subject.slice(names.calls("").length)
          starts.set(execution, (starts.get(execution) ?? 0) + 1)
        })
      )
    )
    return starts
  })

/** One injected fault and what the suite saw after it. */
export interface FaultRecord {
  readonly fault: string
  readonly recovered: boolean
  readonly recoveryS: number
  readonly executionsLost: number
  /** Run-level faults (`train-faults.chaos.ts`): executions trained in more than one step. */
  readonly trainedTwice?: number
  /** Running executions the scheduler asked for again (at each `CellLost`). */
  readonly executionsRedispatched?: number
  /** Of those, the ones the runner did not run again (it joined the running one). */
  readonly duplicatesSuppressed?: number
  /** What the fault hit at that moment (e.g. the killed device's role). */
  readonly detail?: string
}

/** Whether `npm run test:chaos -- --long` runs this: the fuzzers then run their long forms. */
export const chaosLong = () => process.env.GYRE_CHAOS_LONG === "1"

/** Appends a fuzzer's figures to the suite's summary (`$GYRE_CHAOS_FUZZ`, when set). */
export const recordFuzz = (r: { readonly fuzzer: string; readonly cases: number; readonly crashes: number }) => {
  const file = process.env.GYRE_CHAOS_FUZZ
  if (file !== undefined) fs.appendFileSync(file, `${JSON.stringify(r)}
`)
}

/** Where each chaos test appends its faults (the suite's summary reads them). */
export const faultsFile = () => process.env.GYRE_CHAOS_FAULTS

export const recordFault = (r: FaultRecord) => {
  const file = faultsFile()
  if (file !== undefined) fs.appendFileSync(file, `${JSON.stringify(r)}\n`)
}
