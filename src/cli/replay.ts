/**
 * `gyre replay RUN`: reads a run's log from a stopped embedded store (`--store DIR`, read
 * through a private server on a copy), else from the server that holds it (`NATS_URL`), else from
 * the run's own store (`.gyre/runs/<run>`, `withRun` in runs.ts), never touching it, and prints its entries (human lines, or `--json` lines), positioned and filtered.
 * `--verify`, `--trees`, `--export DIR` and `--what-if POLICY` check, rebuild, export or re-run
 * the run instead (src/replay/). Exit codes: 0 ok, 1 a check failed or the run cannot be read,
 * 2 a bad flag.
 */
import { writeFile } from "node:fs/promises"
import { Cause, Duration, Effect, Fiber, Stream } from "effect"
import { entryJson, entryLine, tagged } from "../replay/format.ts"
import { exportRun, type ExportFailed } from "../replay/export.ts"
import { checkTrees, type NodeDifference } from "../replay/trees.ts"
import { verified, verifyRun, type Verification } from "../replay/verify.ts"
import { whatIf } from "../replay/what-if.ts"
import { readRunConfig, type JournalDiverged } from "../scheduling/records.ts"
import { messageOf, type TransportError } from "../runtime/errors.ts"
import { parsePosition, readEntries, type EntryFilter, type Position, type ReadOptions } from "../replay/read.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { UsageError, parseFlags, type Command, type Flags } from "./args.ts"
import { failed, withRun } from "./runs.ts"

const flags = {
  run: { kind: "string", doc: "the run (or give it as the first word: gyre replay RUN)" },
  store: { kind: "string", doc: "a stopped embedded store directory (default: the server at NATS_URL, else the run's own store .gyre/runs/<run>)" },
  from: { kind: "string", doc: "first entry: a stream sequence, an ISO time, or step:K" },
  to: { kind: "string", doc: "last entry: a stream sequence, an ISO time, or step:K (its StepDone)" },
  last: { kind: "integer", doc: "only the last N entries that pass the filters" },
  type: { kind: "string", doc: "entry types, comma-separated (an event tag, a request, a system event; policy = every record)" },
  actor: { kind: "string", doc: "KIND or KIND/ID: tells and asks to it (and records naming it as a cell's device)" },
  execution: { kind: "string", doc: "entries about one execution (b<batch>-x<n>)" },
  follow: { kind: "boolean", doc: "keep printing new entries until interrupted or the run's end (run-done)", default: false },
  pace: { kind: "string", doc: "original: wait between entries as the run did; instant: no wait", default: "instant", choices: ["original", "instant"] },
  json: { kind: "boolean", doc: "JSON lines instead of human lines", default: false },
  verify: { kind: "boolean", doc: "check the log's integrity, then replay its policy records through the run's policy (exit 1 on a divergence)", default: false },
  "keep-going": { kind: "boolean", doc: "--verify: report every divergence, not only the first", default: false },
  trees: { kind: "boolean", doc: "rebuild every execution's tree from its call records and check it (and the packed micro-batches) against the trainer's record (exit 1 on a mismatch)", default: false },
  export: { kind: "string", doc: "write the run as JSON lines to this directory (format in ARCHITECTURE.md)" },
  "what-if": { kind: "string", doc: "simulate the run's recorded executions under this policy (elastic, elastic-published, colocate, async, async:R)" },
  cells: { kind: "integer", doc: "--what-if: on this many cells (default: the run's)" },
  "scenario-out": { kind: "string", doc: "--what-if: also write the scenario it simulated (the run's executions and measured costs) to this JSON file, for gyre sim --scenario" }
} as const

type ReplayFlags = Flags<typeof flags>

const position = (name: string, text: string | undefined): Position | undefined => {
  if (text === undefined) return undefined
  const p = parsePosition(text)
  if (p === undefined) throw new UsageError(`gyre replay: --${name} must be a sequence, an ISO time or step:K, got '${text}'`)
  return p
}

/** The run named by the first word or `--run`, and the flags after it. */
const parse = (argv: ReadonlyArray<string>): { readonly run: string; readonly f: ReplayFlags } => {
  const named = argv[0] !== undefined && !argv[0].startsWith("--") ? argv[0] : undefined
  const f = parseFlags("replay", flags, named === undefined ? argv : argv.slice(1))
  const run = named ?? f.run
  if (run === undefined) throw new UsageError("gyre replay: name the run (gyre replay RUN)")
  const modes = [f.verify, f.trees, f.export !== undefined, f["what-if"] !== undefined].filter(Boolean).length
  if (modes > 1) throw new UsageError("gyre replay: --verify, --trees, --export and --what-if are one at a time")
  if (f.cells !== undefined && f.cells < 1) throw new UsageError(`gyre replay: --cells must be at least 1, got ${f.cells}`)
  for (const name of ["cells", "scenario-out"] as const)
    if (f[name] !== undefined && f["what-if"] === undefined) throw new UsageError(`gyre replay: --${name} goes with --what-if`)
  if (f.last !== undefined && f.last < 1) throw new UsageError(`gyre replay: --last must be at least 1, got ${f.last}`)
  if (f.actor !== undefined && !/^[A-Za-z0-9_-]+(\/[A-Za-z0-9_.-]+)?$/.test(f.actor)) throw new UsageError(`gyre replay: --actor must be KIND or KIND/ID, got '${f.actor}'`)
  return { run, f }
}

const readOptions = (f: ReplayFlags): ReadOptions => {
  const filter: EntryFilter = {
    ...(f.type === undefined ? {} : { types: f.type.split(",").map((t) => t.trim()) }),
    ...(f.actor === undefined ? {} : { actor: f.actor }),
    ...(f.execution === undefined ? {} : { execution: f.execution })
  }
  const from = position("from", f.from)
  const to = position("to", f.to)
  return { filter, follow: f.follow, ...(from === undefined ? {} : { from }), ...(to === undefined ? {} : { to }), ...(f.last === undefined ? {} : { last: f.last }) }
}

/** Prints the entries, waiting between them as the run did under `--pace original`. */
const show = (log: JournalSource, f: ReplayFlags) => {
  let previous: number | undefined
  return readEntries(log, readOptions(f)).pipe(
    Stream.runForEach((e) =>
      Effect.gen(function* () {
        const t = e.time.getTime()
        if (f.pace === "original" && previous !== undefined && t > previous) yield* Effect.sleep(Duration.millis(t - previous))
        previous = t
        console.log(f.json ? entryJson(e) : entryLine(e))
      })
    ),
    Effect.as(0)
  )
}

const verifyLines = (v: Verification): Array<string> => {
  const lines = v.integrity.map((f) => `integrity ${f.check} at sequence ${f.seq}: ${f.message}`)
  if (v.unverifiable !== undefined) lines.push(`not verified: ${v.unverifiable}`)
  for (const d of v.divergences) {
    lines.push(`divergence at sequence ${d.seq}, record #${d.index} (${d.what}): ${tagged(d.event)}`)
    lines.push(`  expected: ${JSON.stringify(d.expected)}`, `  recorded: ${JSON.stringify(d.recorded)}`)
    for (const x of d.diff) lines.push(`  ${x.path}: expected ${JSON.stringify(x.expected) ?? "(none)"}, recorded ${JSON.stringify(x.recorded) ?? "(none)"}`)
  }
  lines.push(`${verified(v) ? "verified" : "FAILED"}: ${v.records} policy records of ${v.entries} entries, ${v.integrity.length} integrity findings, ${v.divergences.length} divergences`)
  return lines
}

const verify = (log: JournalSource, f: ReplayFlags) =>
  Effect.map(verifyRun(log, f["keep-going"]), (v) => {
    console.log(f.json ? JSON.stringify({ ok: verified(v), ...v }) : verifyLines(v).join("\n"))
    return verified(v) ? 0 : 1
  })

const exportTo = (log: JournalSource, dir: string, f: ReplayFlags) =>
  Effect.map(exportRun(log, dir), (counts) => {
    console.log(f.json ? JSON.stringify({ dir, ...counts }) : `exported ${log.run} to ${dir}: ${counts.events} events, ${counts.actions} actions, ${counts.calls} calls, ${counts.outcomes} outcomes, ${counts.steps} steps`)
    return 0
  })

const counterfactual = (log: JournalSource, policy: string, f: ReplayFlags) =>
  Effect.gen(function* () {
    const config = yield* readRunConfig(log)
    if (config === undefined) return yield* failed("replay", "the journal holds no run configuration to simulate")
    const result = yield* whatIf(log, config, policy, f.cells)
    if (typeof result === "string") return yield* failed("replay", `--what-if ${policy}: ${result}`)
    const { scenario, ...w } = result
    const out = f["scenario-out"]
    if (out !== undefined) {
      const written = yield* Effect.tryPromise(() => writeFile(out, JSON.stringify(scenario, null, 2) + "\n")).pipe(
        Effect.match({ onFailure: (e) => messageOf(e.cause), onSuccess: () => undefined })
      )
      if (written !== undefined) return yield* failed("replay", `--scenario-out: ${written}`)
    }
    const s = (x: number) => `${x.toFixed(1)} s`
    console.log(
      f.json
        ? JSON.stringify(w)
        : [
            `run ${w.run}: ${w.policy} on ${w.cells} cells, ${w.executions} executions`,
            `  measured: training ${w.costs.train_tokens_per_s_per_cell.toFixed(0)} tokens/s a cell, switches ${s(w.costs.switch_to_train_s)} to training / ${s(w.costs.switch_to_rollout_s)} back, step update ${s(w.costs.step_update_s ?? 0)}, weight sync ${s(w.costs.weight_sync_s)}`,
            `  real makespan        ${s(w.realS)}`,
            `  simulated (${w.policy})  ${s(w.simulatedS)} (sim / real ${(w.simulatedS / Math.max(1e-9, w.realS)).toFixed(3)})`,
            `  what-if ${w.whatIf.policy} on ${w.whatIf.cells} cells: ${s(w.whatIf.makespanS)} (${(w.whatIf.makespanS / Math.max(1e-9, w.simulatedS)).toFixed(3)} x the simulated run)`,
            `  lower bound on ${w.whatIf.cells} cells: ${s(w.whatIf.lowerBoundS)} (no policy beats it${w.whatIf.cells === w.cells ? `; the simulated run is ${(w.simulatedS / Math.max(1e-9, w.whatIf.lowerBoundS)).toFixed(3)} x it` : ""})`
          ].join("\n")
    )
    return 0
  })

/** Where the first differing node is, in words. */
const nodeLine = (n: NodeDifference) => {
  const at = n.rebuilt === undefined
    ? "the rebuilt tree has no such node"
    : `tokens ${n.rebuilt.depth}..${n.rebuilt.depth + n.rebuilt.length - 1} (${n.rebuilt.length}), made by call ${n.rebuilt.call}`
  return `first differing node: #${n.index} in preorder, ${at}; rebuilt ${n.rebuiltNodes} nodes, recorded ${n.recordedNodes}`
}

const trees = (log: JournalSource, f: ReplayFlags) =>
  Effect.gen(function* () {
    const config = yield* readRunConfig(log)
    if (config === undefined) return yield* failed("replay", "the journal holds no run configuration (the trainer's settings)")
    const c = yield* checkTrees(log, config)
    const ok = c.mismatches.length === 0 && c.unrecorded.length === 0
    if (f.json) console.log(JSON.stringify({ ok, ...c }))
    else {
      for (const m of c.mismatches) {
        console.log(`mismatch in step ${m.step}${m.execution === undefined ? "" : `, execution ${m.execution}`}: ${m.what}: rebuilt ${JSON.stringify(m.expected)}, recorded ${JSON.stringify(m.recorded)}`)
        if (m.node !== undefined) console.log(`  ${nodeLine(m.node)}`)
      }
      if (c.unrecorded.length > 0) console.log(`not checked: steps ${c.unrecorded.join(", ")} journal no trees (a trainer before this check)`)
      console.log(`${ok ? "trees verified" : "FAILED"}: ${c.executions} executions, ${c.microBatches} micro-batches in ${c.steps} steps, ${c.mismatches.length} mismatches`)
    }
    return ok ? 0 : 1
  })

const act = (log: JournalSource, f: ReplayFlags): Effect.Effect<number, TransportError | ExportFailed | JournalDiverged> => {
  if (f.verify) return verify(log, f)
  if (f.trees) return trees(log, f)
  if (f.export !== undefined) return exportTo(log, f.export, f)
  if (f["what-if"] !== undefined) return counterfactual(log, f["what-if"], f)
  return show(log, f)
}

/** Runs `program` until it ends or the process is interrupted (Ctrl-C ends `--follow` cleanly). */
const runInterruptibly = (program: Effect.Effect<number, unknown>) =>
  new Promise<number>((resolve, reject) => {
    const fiber = Effect.runFork(program)
    const stop = () => void Effect.runFork(Fiber.interrupt(fiber))
    process.once("SIGINT", stop)
    fiber.addObserver((exit) => {
      process.off("SIGINT", stop)
      if (exit._tag === "Success") resolve(exit.value)
      else if (exit.cause.reasons.every((r) => r._tag === "Interrupt")) resolve(0)
      else reject(Cause.squash(exit.cause))
    })
  })

export const command: Command<typeof flags> = {
  summary: "read a run's log (--store, NATS_URL, else the run's own store): print, filter, follow, --verify, --trees, --export, --what-if",
  flags,
  run: async (argv) => {
    const { run, f } = parse(argv)
    return runInterruptibly(withRun("replay", run, f.store, (log) => act(log, f)))
  }
}
