/**
 * `npm run bench:elastic`: the same suite, seed, checkpoint and steps under each scheduling policy
 * on this machine (each a `gyre train --json` child process, one after another), then each run's
 * journal read back from its store. The runs' HTML report side by side (`.gyre/bench-elastic.html`,
 * src/replay/report.ts; its path printed first), a table, then one JSON line:
 *
 * - `elastic_s`, `async_s`, `colocate_s`: the runs' makespans (node start to `run-done`), and the
 *   ratios `elastic_over_async` / `elastic_over_colocate` (> 1: elastic is faster);
 * - `utilization` per policy: useful cell-time over cells x makespan, as the simulator defines it
 *   (execution durations / slots per cell + trained execution tokens / the measured training rate);
 * - `switch_control_p50_ms` / `_p99_ms`: stopping admission and pausing generations, per switch;
 *   `kv_transfer_p50_ms`: whole switches to training (the KV hand-off); `reprefill_tokens`;
 * - `sim_over_live` per policy: the simulator fed this run's measured execution durations and tokens,
 *   training rate, switch costs and weight-sync times, its makespan over the live one;
 * - `lower_bound_s` per policy: the makespan no policy can beat on that run's executions and rates
 *   (src/sim/bound.ts), and `async_over_bound`: the async makespan over the bound of the elastic
 *   run's executions, the most `elastic_over_async` could be on this workload.
 *
 * Flags: --steps N (8), --devices K (2), --checkpoint DIR (default: the cached warm start),
 * --policies a,b,c, --horizon, --executions-per-step, --group-size, --slots, --rounds R (1);
 * `--help` lists them, and a bad one is one line and exit 2 (bench/flags.ts).
 * With R rounds the policies run in turn R times (a, b, c, a, b, c, ...: each sees the same
 * drift of the machine) and every figure per policy is the median of its R runs (the ratios
 * are the medians' ratios); the table has a row per run and `runs_s` lists each policy's
 * makespans. One run of a policy moves by 10-30% here, more than the policies differ.
 *
 * `--paced`: devices that own their compute, as accelerators do (ARCHITECTURE.md, "Paced
 * devices"). Without it the CPU devices share the machine's cores, so moving a cell into
 * rollout adds slots but no compute and every policy that keeps the cores busy sits near the
 * same bound. With it each of `--devices` (4) devices computes for real and then completes its
 * work no earlier than `--pace` (default `PACE`, below: chosen from the real per-work cost of 4
 * devices on 2 shared cores; `pace_overrun_share_max` says whether a run's devices kept to it)
 * allows, and the workload is one where elasticity matters:
 * - the `tail` suite (`suites/tail`: the toy walk, its horizon per execution `--horizon` (2) x
 *   Pareto(1, 1.2) capped at 8x, drawn from the run's seed and the execution's id, so every
 *   policy gets the same executions), with no tool sleeps, subagents or failed tool calls and
 *   replies of at most 16 tokens:
 *   an execution's length is the generation it needs, heavy-tailed. Chosen over `suites/long`
 *   at a small scale because the long suite's script has one shape for every execution (no
 *   tail), and over the toy suite because its tail is a tool's sleep, which a paced device
 *   does not make slower or faster;
 * - training comparable to the rollout tail: one PPO epoch (a second one runs on the core
 *   alone, serial work no policy overlaps), `train` paced so that a step's micro-batches take
 *   a few cells about as long as its batch's longest execution; micro-batches of 512 tokens, so
 *   that a step's ~3,600 tree tokens make more micro-batches than there are cells (a cell claims
 *   a whole micro-batch: with 4,096 a step was 2 micro-batches and a third or fourth training
 *   cell had nothing to do — the simulator models that limit, `micro_batch_tokens`);
 * - 4 slots a cell (the batch of 8 and the next one open at once need every cell in rollout),
 *   and async with `--rollout-cells` (half the devices) in rollout.
 * The JSON line adds `pace`, `pace_overruns` and `paced_work` (over every run), and
 * `pace_overrun_share_max` (the largest share of one device's paced work that overran);
 * `sim_over_live` is the simulator fed the paced run's measured durations and rates.
 */
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { trainFlags } from "../src/cli/train.ts"
import { warmStartedCheckpoint } from "../src/cli/warm-start.ts"
import { Engine } from "../src/engine/engine.ts"
import { asyncSplit, fixedPolicies } from "../src/policy/index.ts"
import { auditRun, type RunAudit } from "../src/scheduling/audit.ts"
import { buildReport, renderReport, type RunReport } from "../src/replay/report.ts"
import { Nats } from "../src/runtime/nats.ts"
import { repoRoot } from "../src/runtime/nats-server.ts"
import { ActorSystem } from "../src/runtime/system.ts"
import { runScenario } from "../src/replay/what-if.ts"
import { lowerBound } from "../src/sim/bound.ts"
import { executionsOf } from "../src/sim/scenario.ts"
import { simulate } from "../src/sim/simulate.ts"
import { formatPace, parsePace, type Pace } from "../src/protocols/pace.ts"
import { atLeast, benchFlags, listOf, refuse } from "./flags.ts"
import { printResult } from "./results.ts"

const BENCH = "bench:elastic"
/**
 * --paced's default rates: a decode step 125 ms, 1 ms a prompt token, 12.5 ms a trained token.
 * Real compute of the tiny preset, 4 devices at once on 1 thread each of the 2 shared cores at a
 * load average of ~14: a decode step of 16 sequences 30 ms (p50; up to ~140 ms), 0.3-0.5 ms a
 * prompt token in 256-token chunks (up to 2 ms), 2.3-3 ms a trained token. Inside a whole run
 * (harness processes, gateway, NATS beside the devices) at a load average of 15-21, the rates
 * 2.5x faster (decode=20,prefill=250,train=120) overran on 25% of the work, decode=8,prefill=150,
 * train=80 on 2.6%; these at a load average of 4-7 on 0.9% (2.9% on the worst device). A prefill
 * rate far above the decode rate, as on an accelerator, keeps a call's prompt from stalling the
 * sequences decoding beside it (ARCHITECTURE.md, "Paced devices").
 */
const PACE = "decode=8,prefill=1000,train=80"
/** The tail suite's horizon: the base horizon x Pareto(1, 1.2), capped at 8x. */
const TAIL_ALPHA = 1.2
const TAIL_MAX = 8
/** The toy knobs of a --paced run: no tool sleeps, no subagents or failed tool calls (an execution's calls follow its horizon), replies of at most 16 tokens. */
const PACED_ENV = `TOY_TOOL_MS=0,TOY_TAIL_ALPHA=0,TOY_MAX_TOKENS=16,TOY_FORK_EVERY=0,TOY_FAIL_RATE=0,TAIL_ALPHA=${TAIL_ALPHA},TAIL_MAX=${TAIL_MAX}`
const f = benchFlags(BENCH, "the same suite, seed, checkpoint and steps under each scheduling policy, side by side", {
  steps: { kind: "integer", doc: "RL steps a run (default 8; --paced: 2)" },
  devices: { kind: "integer", doc: "CPU devices a run (default 2; --paced: 4)" },
  paced: { kind: "boolean", doc: "paced devices on the tail suite (the module doc: what runs, and why)", default: false },
  pace: { kind: "string", doc: `--paced: the devices' rates, decode=STEPS/s,prefill=TOKENS/s,train=TOKENS/s (default ${PACE})` },
  "rollout-cells": { kind: "integer", doc: "async: cells that stay in rollout (default 1; --paced: half the devices)" },
  policies: { kind: "string", doc: "the policies, comma-separated", default: "elastic,async,colocate" },
  rounds: { kind: "integer", doc: "runs of each policy, alternated; every figure the median of a policy's runs", default: 1 },
  checkpoint: { kind: "string", doc: "initial weights (default: the cached warm start)" },
  horizon: { kind: "integer", doc: "turns of a toy task (TOY_STEPS; default 24; --paced: the tail suite's base horizon, 2)" },
  "executions-per-step": { kind: "integer", doc: "executions in a batch", default: 8 },
  "group-size": { kind: "integer", doc: "executions of one task in a batch", default: 4 },
  slots: { kind: "integer", doc: "concurrent executions a cell serves in rollout (default 8; --paced: 4)" },
  "micro-batch-tokens": { kind: "integer", doc: "tokens per micro-batch (gyre train's; default 4096; --paced: 512, so that a step has a micro-batch for each of its cells)" }
})
const paced = f.paced
const steps = atLeast(BENCH, "steps", f.steps ?? (paced ? 2 : 8), 1)
const devices = atLeast(BENCH, "devices", f.devices ?? (paced ? 4 : 2), 1)
const policies = listOf(BENCH, "policies", f.policies, trainFlags.policy.choices)
const rounds = atLeast(BENCH, "rounds", f.rounds, 1)
const rolloutCells = atLeast(BENCH, "rollout-cells", f["rollout-cells"] ?? (paced ? Math.max(1, Math.floor(devices / 2)) : 1), 1)
const pace = paced ? parsedPace(f.pace ?? PACE) : undefined
const knobs = {
  horizon: String(atLeast(BENCH, "horizon", f.horizon ?? (paced ? 2 : 24), 1)),
  "executions-per-step": String(atLeast(BENCH, "executions-per-step", f["executions-per-step"], 1)),
  "group-size": String(atLeast(BENCH, "group-size", f["group-size"], 1)),
  slots: String(atLeast(BENCH, "slots", f.slots ?? (paced ? 4 : 8), 1)),
  "micro-batch-tokens": String(atLeast(BENCH, "micro-batch-tokens", f["micro-batch-tokens"] ?? (paced ? 512 : 4096), 1))
}

/** `--pace`'s value, or one line and exit 2. */
function parsedPace(text: string): Pace {
  const parsed = parsePace(text)
  if (parsed === undefined || "error" in parsed) return refuse(BENCH, `--pace ${text}: ${parsed === undefined ? "empty" : parsed.error}`)
  return parsed
}

/**
 * What a --paced run adds to gyre train's flags: the tail suite without tool sleeps, one PPO
 * epoch (the step's update on the core alone stays small beside its distributed micro-batches),
 * and the pace.
 */
const pacedFlags = (p: Pace) => ["--suite", "tail", "--env", PACED_ENV, "--ppo-epochs", "1", "--pace", formatPace(p)]

interface PaceFigures {
  readonly overruns: number
  readonly work: number
  /** The largest share of a device's paced work that overran. */
  readonly worstShare: number
}

/** A run's pace counts from gyre train's summary (`pace_by_device`). */
const paceFigures = (summary: { readonly pace_by_device?: Record<string, { readonly paced: number; readonly overruns: number }> }): PaceFigures => {
  const devices = Object.values(summary.pace_by_device ?? {})
  return {
    overruns: devices.reduce((a, d) => a + d.overruns, 0),
    work: devices.reduce((a, d) => a + d.paced, 0),
    worstShare: Math.max(0, ...devices.map((d) => (d.paced === 0 ? 0 : d.overruns / d.paced)))
  }
}

const quantile = (xs: ReadonlyArray<number>, q: number) => {
  if (xs.length === 0) return 0
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!
}

/** The middle value (the mean of the two middle ones for an even count). */
const median = (xs: ReadonlyArray<number>) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

const readAudit = (store: string, run: string, executionsPerStep: number) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        return { audit: yield* auditRun(system, executionsPerStep), report: yield* buildReport(system) }
      }).pipe(Effect.provide(ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({ storeDir: store })))))
    )
  )

const main = async () => {
  const checkpoint =
    f.checkpoint ||
    (await Effect.runPromise(
      // gyre train's own warm start (its defaults), so the runs below find it cached
      warmStartedCheckpoint({
        suite: "toy",
        // the toy suite's (the tail suite's walks are the toy's), at the unpaced benchmark's horizon
        env: { TOY_STEPS: paced ? "24" : knobs.horizon, TOY_TOOL_MS: "20", TOY_TEMPERATURE: "1" },
        tasks: trainFlags["demo-tasks"].default,
        steps: trainFlags["sft-steps"].default,
        lr: trainFlags["sft-lr"].default,
        seed: trainFlags.seed.default,
        fresh: false
      }).pipe(Effect.provide(Engine.layer))
    ))
  const B = Number(knobs["executions-per-step"])
  const slots = Number(knobs.slots)
  const rows: Array<{ policy: string; runS: number; audit: RunAudit; simS: number; boundS: number; utilization: number; pace: PaceFigures }> = []
  const reports: Array<RunReport> = []
  for (const policy of Array.from({ length: rounds }, () => policies).flat()) {
    const store = fs.mkdtempSync(path.join(os.tmpdir(), `gyre-bench-${policy}-`))
    const run = `bench-${policy}-${Date.now().toString(36)}`
    const flags = Object.entries(knobs).flatMap(([k, v]) => [`--${k}`, v])
    const out = execFileSync(
      "node",
      [path.join(repoRoot, "bin", "gyre.js"), "train", "--policy", policy, "--checkpoint", checkpoint, "--steps", String(steps), "--devices", String(devices), "--run", run, "--store", store, "--heldout", "heldout-0..heldout-3", "--rollout-cells", String(rolloutCells), "--json", ...flags, ...(pace === undefined ? [] : pacedFlags(pace))],
      { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 1 << 26 }
    )
    const summary = JSON.parse(out.trim().split("\n").at(-1)!)
    const { audit, report } = await readAudit(store, run, B)
    reports.push(report)
    const scenario = runScenario(audit, { policyConfig: { slots_per_cell: slots, executions_per_step: B, steps, max_staleness: 1 } }, devices)
    const simPolicy = policy === "async" ? asyncSplit(rolloutCells) : fixedPolicies[policy]!
    const executions = executionsOf(scenario)
    const sim = simulate(scenario, executions, simPolicy)
    const useful = audit.executions.reduce((a, e) => a + e.duration_s / slots + e.tokens / scenario.train_tokens_per_s_per_cell, 0)
    rows.push({ policy, runS: summary.run_s, audit, simS: sim.makespan_s, boundS: lowerBound(scenario, executions).lower_bound_s, utilization: useful / (devices * summary.run_s), pace: paceFigures(summary) })
    const last = rows.at(-1)!
    console.error(`${BENCH}: ${policy} ${last.runS.toFixed(1)} s (simulated ${last.simS.toFixed(1)} s), pace overruns ${last.pace.overruns} of ${last.pace.work}`)
    fs.rmSync(store, { recursive: true, force: true })
  }
  // The policies side by side in one page (gyre report's, with every run's timeline).
  const page = path.join(repoRoot, ".gyre", "bench-elastic.html")
  fs.writeFileSync(page, renderReport(reports))
  console.log(`report ${page}`)
  // Per policy, the median of its runs' figures.
  const ran = policies.filter((p) => rows.some((r) => r.policy === p))
  const of = (p: string, figure: (r: (typeof rows)[number]) => number) => median(rows.filter((r) => r.policy === p).map(figure))
  const per = (figure: (r: (typeof rows)[number]) => number, digits: number) => Object.fromEntries(ran.map((p) => [p, Number(of(p, figure).toFixed(digits))]))
  const makespan = (p: string) => (ran.includes(p) ? of(p, (r) => r.runS) : undefined)
  console.log(`policy             makespan_s  sim_s   sim/live  bound_s  utilization  switches  reprefill  kv_bytes  overruns/paced`)
  for (const r of rows) {
    console.log(`${r.policy.padEnd(18)} ${r.runS.toFixed(1).padStart(10)}  ${r.simS.toFixed(1).padStart(6)}  ${(r.simS / r.runS).toFixed(3).padStart(8)}  ${r.boundS.toFixed(1).padStart(7)}  ${r.utilization.toFixed(3).padStart(11)}  ${String(r.audit.switches).padStart(8)}  ${String(r.audit.reprefillTokens).padStart(9)}  ${String(r.audit.kvHandoffBytes).padStart(8)}  ${r.pace.overruns}/${r.pace.work}`)
  }
  const elastic = makespan("elastic")
  const ratio = (other: string) => (elastic !== undefined && makespan(other) !== undefined ? Number((makespan(other)! / elastic).toFixed(3)) : null)
  const all = rows.flatMap((r) => r.audit.switchControlMs)
  printResult(BENCH, {
    steps,
    devices,
    rounds,
    pace: pace === undefined ? null : formatPace(pace),
    async_rollout_cells: rolloutCells,
    elastic_s: elastic ?? null,
    async_s: makespan("async") ?? null,
    colocate_s: makespan("colocate") ?? null,
    elastic_over_async: ratio("async"),
    elastic_over_colocate: ratio("colocate"),
    runs_s: Object.fromEntries(ran.map((p) => [p, rows.filter((r) => r.policy === p).map((r) => Number(r.runS.toFixed(1)))])),
    utilization: per((r) => r.utilization, 3),
    switch_control_p50_ms: Number(quantile(all, 0.5).toFixed(2)),
    switch_control_p99_ms: Number(quantile(all, 0.99).toFixed(2)),
    kv_transfer_p50_ms: Number(quantile(rows.flatMap((r) => r.audit.switchMs.training), 0.5).toFixed(1)),
    reprefill_tokens: rows.reduce((a, r) => a + r.audit.reprefillTokens, 0),
    pace_overruns: rows.reduce((a, r) => a + r.pace.overruns, 0),
    paced_work: rows.reduce((a, r) => a + r.pace.work, 0),
    pace_overrun_share_max: Number(Math.max(0, ...rows.map((r) => r.pace.worstShare)).toFixed(4)),
    sim_over_live: per((r) => r.simS / r.runS, 3),
    lower_bound_s: per((r) => r.boundS, 1),
    async_over_bound: elastic !== undefined && makespan("async") !== undefined ? Number((makespan("async")! / of("elastic", (r) => r.boundS)).toFixed(3)) : null
  })
}

await main()
