/**
 * `gyre train`: the elastic RL loop on the embedded default (a private nats-server, one node), or
 * across machines with `NATS_URL` and `gyre node --devices K` on each (the scheduler uses every
 * device that joins).
 *
 * 1. The initial weights: `--checkpoint`, else the suite's cached supervised warm start.
 * 2. Held-out score of the initial weights (`evaluate.ts`, a run of its own).
 * 3. The run: `--devices` device actors on this node, the gateway, a harness runner and a
 *    scheduler candidate (`scheduler/main` while it holds the run's lease) run `--steps` RL steps
 *    under `--policy`; a progress line per step from the trainer's `StepMetrics`. Candidates on
 *    other machines (`gyre node --scheduler`) stand by to take over; with `--no-scheduler` this
 *    process hosts none and the run's scheduler lives on them.
 * 4. Held-out score of the final checkpoint, and a summary counted from the run's journal
 *    (`src/scheduling/audit.ts`); with `--json` the last line is one JSON object.
 * 5. The run's HTML report (`src/replay/report.ts`): `<store>/report.html` on the embedded
 *    default, `.gyre/reports/<run>.html` with NATS_URL; its path is the summary's last line (`report`).
 *
 * Progress (`progress.ts`): bars and a status screen on a terminal, plain lines otherwise; none
 * with `--quiet` or `--json`.
 *
 * `--resume RUN` continues a stopped run (its processes killed, its store kept): the run's
 * configuration comes from its journal (the flags that shape the run are ignored), a new scheduler
 * takes the lapsed lease and replays the journal through the policy, the devices join as new
 * cells (the old ones are lost), executions that were running are run again, and the step in
 * progress starts again as a new attempt on a core that loads the newest weights and the optimizer
 * state stored beside them. Finished executions are not run again and no step is trained twice:
 * the summary counts both from the journal.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { loadSuite, trainTaskIds } from "../harness/suites.ts"
import { Engine } from "../engine/engine.ts"
import { fixedPolicies } from "../policy/index.ts"
import { TrainingSettings, type RunConfig } from "../protocols/run.ts"
import { auditRun } from "../scheduling/audit.ts"
import { readRunConfig, runDoneJournaled } from "../scheduling/records.ts"
import { buildReport, renderReport } from "../replay/report.ts"
import { trainingErrors } from "../replay/status.ts"
import { trainFromExport } from "../replay/from-export.ts"
import { Nats, natsOptionsFromEnv } from "../runtime/nats.ts"
import { repoRoot } from "../runtime/nats-server.ts"
import { ActorSystem } from "../runtime/system.ts"
import { UsageError, parseConfigured, type Command, type Flags } from "./args.ts"
import { embeddedNats } from "./auth.ts"
import { checkCheckpoint, checkListen, checkSuite, checkTasks, type ListenAddress } from "./checks.ts"
import { parseEnv } from "./eval.ts"
import { evaluate, evaluationConcurrency, heldoutGain, parseTaskList } from "./evaluate.ts"
import { followRun, RunProgress } from "./progress.ts"
import { joinLines, joinOf } from "./join.ts"
import { checkKvFlags, kvFlags } from "./kv.ts"
import { checkPaceFlag, paceFlag, paceLine, paceSummary } from "./pace.ts"
import { hostRun } from "./run-host.ts"
import { publishInitialCheckpoint } from "./shared-checkpoint.ts"
import { warmStartedCheckpoint } from "./warm-start.ts"
import { chatFormatFor, toolFormatFlag } from "./tool-format.ts"

export const trainFlags = {
  suite: { kind: "string", doc: "suite name (a folder of --suites)", default: "toy" },
  suites: { kind: "string", doc: "directory holding the suites", default: path.join(repoRoot, "suites") },
  policy: { kind: "string", doc: "scheduling policy", default: "elastic", choices: ["async", ...Object.keys(fixedPolicies)] },
  steps: { kind: "integer", doc: "RL steps", default: 8 },
  devices: { kind: "integer", doc: "device actors on this node (CPU devices split the cores: floor(cores / K) threads each; 0: only other nodes' devices, `gyre node --devices K`)", default: 2 },
  run: { kind: "string", doc: "run id", default: `train-${Date.now().toString(36)}` },
  store: { kind: "string", doc: "JetStream store of the embedded nats-server (default .gyre/runs/<run>)" },
  checkpoint: { kind: "string", doc: "initial weights (default: the suite's cached warm start)" },
  resume: { kind: "string", doc: "continue the stopped run RUN from its journal and last checkpoint" },
  json: { kind: "boolean", doc: "the last line is one JSON object", default: false },
  "executions-per-step": { kind: "integer", doc: "executions in a batch (B)", default: 16 },
  "group-size": { kind: "integer", doc: "executions of one task in a batch (a GRPO group)", default: 4 },
  slots: { kind: "integer", doc: "concurrent executions one cell serves in rollout", default: 8 },
  "max-staleness": { kind: "integer", doc: "batch k may start once version k - max_staleness is published", default: 1 },
  "rollout-cells": { kind: "integer", doc: "async only: cells that stay in rollout", default: 1 },
  horizon: { kind: "integer", doc: "decisions per toy execution (TOY_STEPS)", default: 24 },
  env: { kind: "string", doc: "more suite knobs, KEY=VALUE,KEY=VALUE", default: "" },
  // 64 tasks: one 16-task figure moves by about +-2 points at temperature 1, a 10-point gain's size.
  heldout: { kind: "string", doc: "held-out tasks scored before and after (16 at a time)", default: "heldout-0..heldout-63" },
  lr: { kind: "number", doc: "AdamW learning rate", default: 3e-4 },
  "ppo-epochs": { kind: "integer", doc: "updates per step over its micro-batches (PPO epochs): the first on every training device, the rest on the core, clipped against the step's weights", default: 2 },
  "lr-warmup": { kind: "integer", doc: "steps of linear learning-rate warm-up (0: none)", default: 4 },
  advantage: { kind: "string", doc: "advantage estimator", default: "grpo", choices: ["grpo", "dr-grpo", "rloo"] },
  credit: { kind: "string", doc: "a call trains with its execution's score, or its own reward (the scorer's per-call rewards) against the group's calls (call) or against the group's calls that answered the same input (state)", default: "state", choices: ["execution", "call", "state"] },
  mode: { kind: "string", doc: "exact tree training or bounded dedup sampling", default: "exact", choices: ["exact", "sampled"] },
  "max-paths": { kind: "integer", doc: "J_max of sampled mode", default: 5 },
  loss: { kind: "string", doc: "decoupled PPO-clip or truncated IS", default: "ppo", choices: ["ppo", "is"] },
  "tool-format": toolFormatFlag,
  temperature: { kind: "number", doc: "sampling temperature of every rollout call, whatever the harness sends (it replaces the request's temperature and top_p; top-p is 1); the loss takes the policy's log-probs at the same temperature (> 0)", default: 1 },
  ...kvFlags,
  ...paceFlag,
  "micro-batch-tokens": { kind: "integer", doc: "tokens per micro-batch (a path longer than it is trained as a micro-batch of its own, in chunks)", default: 4096 },
  "checkpoint-every": { kind: "integer", doc: "checkpoint every N steps (and after the last)", default: 4 },
  seed: { kind: "integer", doc: "seed of the plan, sampling and the warm start", default: 1 },
  "demo-tasks": { kind: "integer", doc: "warm start: train tasks the oracle demonstrates", default: 60 },
  "sft-steps": { kind: "integer", doc: "warm start: supervised steps", default: 150 },
  "sft-lr": { kind: "number", doc: "warm start: peak learning rate", default: 4e-3 },
  quiet: { kind: "boolean", doc: "no progress lines", default: false },
  "no-scheduler": { kind: "boolean", doc: "host no scheduler candidate here: the run's scheduler lives on `gyre node --scheduler` nodes (the run waits for one)", default: false },
  listen: { kind: "string", doc: "the embedded nats-server listens on HOST[:PORT] (default port 4222, 0: any free one; 0.0.0.0: every interface) instead of loopback, and the lines to join the run from another machine are printed" },
  "from-export": { kind: "string", doc: "train one step of an exported run (gyre replay RUN --export DIR) offline, with its recorded tokens" },
  "export-step": { kind: "integer", doc: "--from-export: the step to train (its weights: the run's checkpoint of that version)", default: 0 }
} as const

export type TrainFlags = Flags<typeof trainFlags>

/** The suite knobs every harness of the run gets (and the warm start's demonstrations). */
const suiteEnv = (f: TrainFlags) => ({ TOY_STEPS: String(f.horizon), TOY_TOOL_MS: "20", TOY_TEMPERATURE: "1", ...parseEnv("train", f.env) })

/** What the progress line says while a run hosted with `--devices 0` waits for other nodes' devices. */
const noDevicesHint = (run: string) => `no devices yet: waiting for gyre node --devices K --run ${run}`

/** The flags' values checked together, before anything starts (`command`: `train`, or `demo` that runs it). */
const check = (f: TrainFlags, command: string) => {
  if (f.devices < 0) throw new UsageError(`gyre ${command}: --devices must be at least 0, got ${f.devices}`)
  const positive = ["steps", "executions-per-step", "group-size", "slots", "micro-batch-tokens", "checkpoint-every", "max-paths", "ppo-epochs"] as const
  for (const name of positive) if (f[name] < 1) throw new UsageError(`gyre ${command}: --${name} must be at least 1, got ${f[name]}`)
  if (!(f.temperature > 0) || !Number.isFinite(f.temperature)) throw new UsageError(`gyre ${command}: --temperature must be a number > 0 (greedy sampling has no log-probs the trainer can correct for), got ${f.temperature}`)
  checkKvFlags(command, f)
  checkPaceFlag(command, f.pace)
  if (f["lr-warmup"] < 0) throw new UsageError(`gyre ${command}: --lr-warmup must be at least 0, got ${f["lr-warmup"]}`)
  if (f["executions-per-step"] % f["group-size"] !== 0) {
    throw new UsageError(`gyre ${command}: --executions-per-step ${f["executions-per-step"]} must be a multiple of --group-size ${f["group-size"]}`)
  }
  if (f.checkpoint !== undefined) checkCheckpoint(command, f.checkpoint)
  if (f.resume === undefined) checkSuite(command, f.suites, f.suite)
  if (f.resume !== undefined && f.checkpoint !== undefined) throw new UsageError(`gyre ${command}: --resume continues from the run's own weights; --checkpoint cannot be given with it`)
  parseEnv(command, f.env)
  const heldout = parseTaskList(f.heldout)
  if (heldout.length === 0) throw new UsageError(`gyre ${command}: --heldout names no task`)
  if (f.resume === undefined) checkTasks(command, "--heldout", f.suites, f.suite, heldout)
}

const paceOf = (f: TrainFlags) => {
  const pace = checkPaceFlag("train", f.pace)
  return pace === undefined ? {} : { pace }
}

/** The run configuration `gyre train` asks for (a resumed run's journal has the one that counts). */
export const runConfigOf = (f: TrainFlags, run: string, checkpoint: string, checkpointDir: string): RunConfig => ({
  run,
  policy: f.policy,
  ...(f.policy === "async" ? { rolloutCells: f["rollout-cells"] } : {}),
  policyConfig: { slots_per_cell: f.slots, executions_per_step: f["executions-per-step"], steps: f.steps, max_staleness: f["max-staleness"] },
  suite: f.suite,
  groupSize: f["group-size"],
  env: suiteEnv(f),
  seed: f.seed,
  training: TrainingSettings.make({
    advantage: f.advantage as RunConfig["training"]["advantage"],
    credit: f.credit as NonNullable<RunConfig["training"]["credit"]>,
    mode: f.mode as RunConfig["training"]["mode"],
    maxPaths: f["max-paths"],
    loss: f.loss as RunConfig["training"]["loss"],
    clipLow: 0.2,
    clipHigh: 0.28,
    isCap: 2,
    lr: f.lr,
    lrWarmup: f["lr-warmup"],
    ppoEpochs: f["ppo-epochs"],
    microBatchTokens: f["micro-batch-tokens"],
    checkpointEvery: f["checkpoint-every"]
  }),
  sampling: { temperature: f.temperature },
  ...(f["tool-format"] === undefined ? {} : { toolFormat: f["tool-format"] }),
  checkpoint,
  kvDtype: f["kv-dtype"] as NonNullable<RunConfig["kvDtype"]>,
  kvBlocks: f["kv-blocks"],
  ...paceOf(f),
  checkpointDir,
  startedAt: Date.now()
})

const round = (x: number, digits = 4) => Number(x.toFixed(digits))

/** The journaled configuration of the stopped run `run` that `--resume` continues. */
const resumedConfig = (command: string, run: string, store: string) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const config = yield* readRunConfig(system)
    if (config === undefined) return yield* Effect.fail(new UsageError(`gyre ${command}: --resume ${run}: the store ${store} holds no journaled run ${run}`))
    if (yield* runDoneJournaled(system)) return yield* Effect.fail(new UsageError(`gyre ${command}: --resume ${run}: the run is finished (see its journal)`))
    return config
  }).pipe(Effect.provide(ActorSystem.layer({ run })))

export const runTraining = (f: TrainFlags, command = "train") => {
  check(f, command)
  const run = f.resume ?? f.run
  const nats = natsOptionsFromEnv("gyre-train")
  const store = nats.storeDir ?? f.store ?? path.join(repoRoot, ".gyre", "runs", run)
  // Before the embedded server's layer is built: it would make an empty store there.
  if (f.resume !== undefined && !fs.existsSync(store) && nats.url === undefined) {
    throw new UsageError(`gyre ${command}: --resume ${run}: no store ${store} (give --store, or NATS_URL of the server that holds the run)`)
  }
  return Effect.gen(function* () {
    const listen = f.listen === undefined ? undefined : yield* Effect.tryPromise({ try: () => checkListen(command, f.listen!), catch: (e) => e as UsageError })
    const options = yield* embeddedNats({ name: "gyre-train", run, node: "main", kinds: TRAIN_KINDS, store, listen })
    const where = { run, store, external: nats.url, listen, auth: options.auth }
    return yield* trainRun(f, command, where).pipe(Effect.provide(Layer.merge(Layer.fresh(Nats.layer(options)), Engine.layer)))
  })
}

/** Where a run lives: its store (or the external server `external`), and where its embedded server listens for other machines. */
interface RunPlace {
  readonly run: string
  readonly store: string
  readonly external: string | undefined
  readonly listen: ListenAddress | undefined
  readonly auth: { readonly dir: string } | undefined
}

/** Says how another machine joins (`--listen`), and shares the initial checkpoint with machines that may join. */
const openToOthers = (place: RunPlace, initial: string, log: (line: string) => void) =>
  Effect.gen(function* () {
    const connection = yield* Nats
    if (place.listen !== undefined && connection.server !== undefined) {
      const join = yield* joinOf({ urls: connection.server.urls, host: place.listen.host, run: place.run, auth: place.auth })
      for (const line of joinLines(join)) log(line)
    }
    if (place.listen !== undefined || place.external !== undefined) yield* publishInitialCheckpoint(connection, place.run, initial)
  })

/** Where the run's lines go: `log` (nothing with --quiet or --json), and the progress display (none then either). */
const outputOf = (f: TrainFlags, run: string) => {
  const quiet = f.quiet || f.json
  const log = quiet ? () => undefined : (line: string) => console.log(line)
  const progress = quiet ? undefined : new RunProgress({ tty: process.stdout.isTTY === true, write: log, ...(f.devices === 0 ? { noDevices: noDevicesHint(run) } : {}) }, f["executions-per-step"])
  return { quiet, log, progress }
}

/**
 * Step 1: the initial weights and the run's configuration (the journal's when resuming), its
 * tool format checked against the checkpoint's template; the run opened to other machines.
 */
const prepareRun = (f: TrainFlags, command: string, place: RunPlace, out: ReturnType<typeof outputOf>, clock: PhaseClock) =>
  Effect.gen(function* () {
    const { run, store } = place
    const { log, progress } = out
    const warm = { suite: f.suite, env: suiteEnv(f), tasks: f["demo-tasks"], steps: f["sft-steps"], lr: f["sft-lr"], seed: f.seed, fresh: false, log, ...(progress ? { onStep: progress.warmStart(f["sft-steps"]) } : {}) }
    const resumed = f.resume === undefined ? undefined : yield* resumedConfig(command, run, store)
    const initial = resumed?.checkpoint ?? f.checkpoint ?? (yield* warmStartedCheckpoint(warm))
    clock.lap("warm_start")
    const config = resumed ?? runConfigOf(f, run, initial, path.join(store, "checkpoints"))
    // a tool format the checkpoint's template does not render is refused before anything runs
    yield* Effect.tryPromise({ try: () => chatFormatFor(command, initial, config.toolFormat), catch: (e) => e })
    if (resumed !== undefined) log(`resuming ${run}: ${resumed.policy}, ${resumed.policyConfig.steps} steps (the journal's configuration)`)
    // The join lines go to stderr when stdout is kept for the JSON line: another machine needs them either way.
    yield* openToOthers(place, initial, out.quiet ? (line) => console.error(line) : log)
    return { resumed, initial, config }
  })

/** The run itself, on the connection and engine provided (the module doc's steps 1-5). */
const trainRun = (f: TrainFlags, command: string, place: RunPlace) =>
  Effect.gen(function* () {
    const { run, store } = place
    const out = outputOf(f, run)
    const { log, progress } = out
    const clock = phaseClock()
    const { resumed, initial, config } = yield* prepareRun(f, command, place, out, clock)
    const trainTasks = trainTaskIds(yield* loadSuite(f.suites, config.suite))
    const heldout = parseTaskList(f.heldout)
    // A resumed run scores under names of its own (the stopped run's evaluations are in the store).
    const attempt = resumed === undefined ? "" : `-r${Date.now().toString(36)}`
    const score = (checkpoint: string, name: string) =>
      evaluate({ checkpoint, suitesDir: f.suites, suite: config.suite, tasks: heldout, env: config.env, run: `${run}-${name}${attempt}`, concurrency: Math.min(evaluationConcurrency, heldout.length), toolFormat: config.toolFormat })
    const before = yield* score(initial, "heldout-before")
    log(`held-out before: ${before.meanScore.toFixed(3)} on ${heldout.length} tasks (${clock.lap("heldout_before")} s)`)
    const connection = yield* Nats
    // The policy clock starts with the run, not with the held-out evaluation before it (a
    // resumed run continues the journal's clock).
    const hosted = resumed ?? { ...config, startedAt: Date.now() }
    const result = yield* Effect.scoped(
      Effect.gen(function* () {
        if (progress !== undefined) yield* followRun(progress, connection, run)
        return yield* hostRun({ config: hosted, trainTasks, devices: f.devices, suitesDir: f.suites, scheduler: !f["no-scheduler"], onProgress: () => undefined }).pipe(Effect.provide(ActorSystem.layer({ run })))
      })
    )
    clock.lap("run")
    const after = yield* score(result.checkpoint, "heldout-after")
    const gain = heldoutGain(before.tasks, after.tasks)
    log(`held-out after:  ${after.meanScore.toFixed(3)} (before ${before.meanScore.toFixed(3)}: ${gainText(gain.gain, gain.ci95)} points, ${clock.lap("heldout_after")} s)`)
    const audit = yield* auditRun(result.system, config.policyConfig.executions_per_step)
    const report = place.external === undefined ? path.join(store, "report.html") : path.join(repoRoot, ".gyre", "reports", `${run}.html`)
    fs.mkdirSync(path.dirname(report), { recursive: true })
    fs.writeFileSync(report, renderReport([yield* buildReport(result.system)]))
    clock.lap("report")
    return summaryOf({ place, clock, result, audit, before, after, gain, heldoutTasks: heldout.length, initial, report })
  })

/** What a run's summary is counted from. */
interface RunFigures {
  readonly place: RunPlace
  readonly clock: PhaseClock
  readonly result: Effect.Success<ReturnType<typeof hostRun>>
  readonly audit: Effect.Success<ReturnType<typeof auditRun>>
  readonly before: { readonly meanScore: number }
  readonly after: { readonly meanScore: number }
  readonly gain: ReturnType<typeof heldoutGain>
  readonly heldoutTasks: number
  readonly initial: string
  readonly report: string
}

/** The run's summary: the JSON line's object (step 4). */
const summaryOf = ({ place, clock, result, audit, before, after, gain, heldoutTasks, initial, report }: RunFigures) => ({
  run: place.run,
  policy: result.config.policy,
  steps: audit.stepsDone,
  wall_s: clock.total(),
  run_s: round(result.runS, 1),
  phases_s: clock.laps,
  heldout_before: round(before.meanScore),
  heldout_after: round(after.meanScore),
  heldout_tasks: heldoutTasks,
  heldout_gain: round(gain.gain),
  heldout_gain_ci95: gain.ci95 === null ? null : round(gain.ci95),
  train_scores: audit.steps.map((s) => round(s.meanScore)),
  devices: audit.cells,
  switches: audit.switches,
  // at role switches (the journal) and after evictions from a full KV pool (this process's gateway)
  reprefill_tokens: audit.reprefillTokens + (result.calls?.reprefillTokens ?? 0),
  kv_handoff_bytes: audit.kvHandoffBytes,
  stale_dropped: audit.staleDropped,
  executions_lost: audit.executionsLost,
  trained_twice: audit.trainedTwice,
  training_errors: trainingErrors(audit.steps).length,
  ...paceSummary(result.config.pace, result.pace),
  store: place.external ?? place.store,
  warm_start_checkpoint: initial,
  checkpoint: result.checkpoint,
  report
})

type PhaseClock = ReturnType<typeof phaseClock>

/** Seconds of each phase of a run, in order, and in all. */
const phaseClock = () => {
  const started = Date.now()
  let last = started
  const laps: Record<string, number> = {}
  return {
    laps,
    /** Ends phase `name` now; its seconds. */
    lap: (name: string) => {
      const now = Date.now()
      laps[name] = round((now - last) / 1000, 1)
      last = now
      return laps[name]!
    },
    total: () => round((Date.now() - started) / 1000, 1)
  }
}

/** The actor kinds a `gyre train` process hosts (its NATS user has exactly their roles: `train`). */
export const TRAIN_KINDS = ["device", "gateway", "harness-runner", "scheduler", "rollout-worker"]

export type TrainSummary = Effect.Success<ReturnType<typeof runTraining>>

/** A gain in points with its 95% half-width: `+11.2 +- 2.4` (no interval under 2 tasks). */
export const gainText = (gain: number, ci95: number | null) => `${gain >= 0 ? "+" : ""}${(100 * gain).toFixed(1)}${ci95 === null ? "" : ` +- ${(100 * ci95).toFixed(1)}`}`

/** The human-readable end of a run (the JSON line follows it). */
export const summaryLines = (s: TrainSummary): Array<string> => [
  `held-out mean score: ${s.heldout_before.toFixed(3)} before, ${s.heldout_after.toFixed(3)} after ${s.steps} steps of ${s.policy} (${s.run_s} s of training, ${s.wall_s} s in all)`,
  `held-out gain: ${gainText(s.heldout_gain, s.heldout_gain_ci95)} points on ${s.heldout_tasks} tasks (95% interval, paired over the tasks)`,
  `train score by step: ${s.train_scores.map((x) => x.toFixed(2)).join(" ")}`,
  `${s.switches} role switches, ${s.kv_handoff_bytes} KV bytes handed off; ${s.reprefill_tokens} tokens prefilled again (switches and full KV pools)`,
  `executions lost ${s.executions_lost}, trained twice ${s.trained_twice}, stale tokens dropped ${s.stale_dropped}, not trained in full ${s.training_errors}`,
  ...(s.pace === null ? [] : [paceLine(s)]),
  `checkpoint ${s.checkpoint}; the run's store ${s.store}`,
  `report ${s.report}: one self-contained page, open file://${s.report} in a browser (on another machine: copy the file first)`
]

/** `--from-export DIR`: the step trained offline (src/replay/from-export.ts); exit 1 when the live checkpoint differs. */
const trainExport = async (dir: string, step: number) => {
  const out = path.join(dir, `trained-step-${step + 1}`)
  const r = await Effect.runPromise(Effect.scoped(trainFromExport(dir, step, out)).pipe(Effect.provide(Engine.layer)))
  const live = r.live === undefined ? "no live checkpoint of that version to compare" : `${r.live.identical ? "identical to" : "DIFFERENT from"} the live ${r.live.dir}`
  console.log(`step ${r.step} from the export: ${r.microBatches} micro-batches, gradient norm ${r.gradNorm.toPrecision(6)}, weights in ${r.out}, ${live}`)
  console.log(JSON.stringify(r))
  return r.live?.identical === false ? 1 : 0
}

export const command: Command<typeof trainFlags> = {
  summary: "train a policy with the elastic RL loop (held-out score before and after; --json: JSON last line)",
  configured: true,
  flags: trainFlags,
  run: async (argv) => {
    const f = parseConfigured("train", trainFlags, argv)
    if (f["from-export"] !== undefined) return trainExport(f["from-export"], f["export-step"])
    const summary = await Effect.runPromise(Effect.scoped(runTraining(f)))
    if (!f.json) for (const line of summaryLines(summary)) console.log(line)
    console.log(JSON.stringify(summary))
    return 0
  }
}

