/**
 * `npm run bench:xlong`: extremely long executions end to end. Executions of the `long` suite
 * (task train-0; full scale: 300+ calls, over 1,000,000 distinct tokens, contexts to ~59k
 * tokens in a 65,536-token window (`--env LONG_WINDOW=524288`: the suite's own, to ~430k); random tiny-long weights unless `--checkpoint`) run through the whole loop as a one-step `gyre train` run: the run host of
 * `src/cli/run-host.ts` in this process (gateway, harness runner, scheduler) on an embedded
 * nats-server, its devices in `gyre node --devices 1` child processes (rollout, then training:
 * one AdamW step, the weights published). Not a test: a table per stage, then one JSON line.
 *
 * Measured from outside the senders:
 * - every message the server carries (a subscriber to `>`) and every message the run's streams
 *   hold, object-store chunks included: `max_message_bytes`; the trajectory stream's call
 *   records: `record_max_bytes`, `record_mean_bytes`;
 * - `Generate` asks whose `base` is null after the execution's first (the whole prompt in one
 *   message): `full_resends`;
 * - the harness's per-call usage, through the scorer's details: `cached_fraction` (prompt tokens
 *   served from a device's KV cache over the calls that continue a history, i.e. outside
 *   compactions: each call's new tool output is prefilled, so with ~3k new tokens a call it is at
 *   most ~1 - 3k / the mean context), `refusals` (calls answered with a 4xx) and the first
 *   refusal's message; `cached_fraction_seen`: the gateway's cached prompt tokens over the prompt
 *   tokens the execution had already sent or received (each call's shared prefix with an earlier
 *   call: `total_tokens - unique_tokens`), i.e. how much of what a cache could serve it served;
 * - the trees rebuilt from the trajectory stream (`executionStats`): calls, tokens, dedup, bytes;
 * - the step's metrics and the journal's audit: trained tokens (the loss's), executions trained
 *   twice; `reprefill_tokens`: tokens prefilled again at role switches (the audit) and after
 *   KV-pool evictions (the gateway's totals, asked when the last outcome is in; the table also
 *   shows the gateway's own count of full resends beside the wire's); `train_tokens_per_s` is the trained
 *   executions' tree tokens over the step's compute seconds; `gyre replay --trees`' check;
 * - peak RSS from /proc: this process (gateway, harness runner, scheduler) as `gateway`, each
 *   device process until the last outcome as `device` and after it as `trainer`;
 * - `attention_pairs_per_s_*`: `measureAttention` of bench:attention (tiny-long, one training
 *   pass of one path, T(T+1)/2 attention pairs over its seconds) at 4,096 tokens and at the
 *   longest path recorded (at most `--attention-max-tokens`), in chunks of the micro-batch budget.
 * `wall_s` runs from the start to the end of the replay check (the attention measurement after
 * it is not part of the run).
 *
 * A stage that fails is reported with the limit or message that stopped it; a run that does
 * not finish within `--timeout-min` is reported in the stage it was in, with the dead letters
 * and the device processes' last error lines.
 */
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as readline from "node:readline"
import { Duration, Effect, Layer, Option, Stream } from "effect"
import type { Msg, MsgHdrs } from "@nats-io/transport-node"
import { parseFlagsAs } from "../src/cli/args.ts"
import type { RunConfig } from "../src/protocols/run.ts"
import type { CallTotals } from "../src/protocols/gateway.ts"
import type { StepMetrics } from "../src/protocols/scheduler.ts"
import type { TreeCheck } from "../src/replay/trees.ts"
import type { NatsShape } from "../src/runtime/nats.ts"
import type { RunAudit } from "../src/scheduling/audit.ts"
import type { ExecutionOutcome } from "../src/tree/outcome.ts"
import type { ExecutionStats } from "../src/tree/stats.ts"
import { configFrom } from "../suites/long/world.mjs"
import type { AttentionRate } from "./attention.ts"
import { atLeast, benchFlags, refuse } from "./flags.ts"

const BENCH = "bench:xlong"
const f = benchFlags(BENCH, "extremely long executions of the long suite through gateway, devices, JetStream, trainer and weights", {
  scale: { kind: "string", doc: "LONG_SCALE of the suite: 1 is full scale (300+ calls, >1M distinct tokens); 1/16 checks the loop in a minute or two", default: "1" },
  executions: { kind: "integer", doc: "executions of task train-0, one group of one step", default: 1 },
  devices: { kind: "integer", doc: "device processes (each `gyre node --devices 1`)", default: 1 },
  env: { kind: "string", doc: "more suite knobs, KEY=VALUE,... (LONG_WINDOW, LONG_CALLS, LONG_TOOL_TOKENS, ...)", default: "" },
  "micro-batch-tokens": { kind: "integer", doc: "the trainer's micro-batch budget (gyre train --micro-batch-tokens)", default: 4096 },
  "kv-blocks": { kind: "integer", doc: "KV-cache blocks of 16 tokens per device (default: 2.5 x the suite's window, at least gyre train's default)" },
  "kv-dtype": { kind: "string", doc: "how the devices' KV caches store K and V", default: "f32", choices: ["f32", "f16"] },
  mode: { kind: "string", doc: "exact tree training or bounded dedup sampling", default: "exact", choices: ["exact", "sampled"] },
  checkpoint: { kind: "string", doc: "initial weights (default: random tiny-long)" },
  "attention-max-tokens": { kind: "integer", doc: "longest path the long attention rate is measured on", default: 16384 },
  "timeout-min": { kind: "integer", doc: "give up on the run after this many minutes, reporting the stage it was in", default: 120 }
})
const EXECUTIONS = atLeast(BENCH, "executions", f.executions, 1)
const DEVICES = atLeast(BENCH, "devices", f.devices, 1)
const ATTENTION_MAX = atLeast(BENCH, "attention-max-tokens", f["attention-max-tokens"], 4096)
const suiteEnv = (): Record<string, string> => {
  const env: Record<string, string> = { LONG_SCALE: f.scale }
  for (const item of f.env.split(",").filter((x) => x !== "")) {
    const eq = item.indexOf("=")
    if (eq <= 0) refuse(BENCH, `--env takes KEY=VALUE items, got '${item}'`)
    env[item.slice(0, eq)] = item.slice(eq + 1)
  }
  return env
}
/**
 * The window unless `--env LONG_WINDOW=...` sets it: the suite's (524,288 x scale^2), at most
 * 65,536. Training attention costs each token its context (pairs ~ unique tokens x mean context):
 * contexts to ~430k at full scale make it ~7x the 64k window's, hours on 2 cores.
 */
const BENCH_WINDOW = 65_536
const ENV = suiteEnv()
const LONG = (() => {
  try {
    const suite = configFrom(ENV)
    if (ENV.LONG_WINDOW !== undefined || suite.window <= BENCH_WINDOW) return suite
    ENV.LONG_WINDOW = String(BENCH_WINDOW)
    return configFrom(ENV)
  } catch (e) {
    return refuse(BENCH, (e as Error).message)
  }
})()

// The run's modules, loaded once the flags are good: a bad flag is refused without loading them.
const [
  { hostRun },
  { runConfigOf, trainFlags },
  { saveCheckpoint },
  { Engine },
  { presets },
  { GatewayProtocol },
  { rlLayout },
  { readTrajectories },
  { checkTrees },
  { DEFAULT_KV_BLOCKS, KV_BLOCK_TOKENS },
  { Nats },
  { repoRoot },
  { readStored },
  { address },
  { ActorSystem, refOf },
  { auditRun },
  { executionStats },
  { measureAttention },
  { printResult }
] = await Promise.all([
  import("../src/cli/run-host.ts"),
  import("../src/cli/train.ts"),
  import("../src/engine/checkpoint.ts"),
  import("../src/engine/engine.ts"),
  import("../src/engine/presets.ts"),
  import("../src/protocols/gateway.ts"),
  import("../src/protocols/layout.ts"),
  import("../src/protocols/trajectories.ts"),
  import("../src/replay/trees.ts"),
  import("../src/serving/rollout-role.ts"),
  import("../src/runtime/nats.ts"),
  import("../src/runtime/nats-server.ts"),
  import("../src/runtime/stream-reader.ts"),
  import("../src/runtime/names.ts"),
  import("../src/runtime/system.ts"),
  import("../src/scheduling/audit.ts"),
  import("../src/tree/stats.ts"),
  import("./attention.ts"),
  import("./results.ts")
])

/**
 * Room for the longest context the script keeps and a subagent's beside it: a subagent forked
 * near the window grows its own context while the parent's waits, so 1.25 windows evicted the
 * parent's (LRU) and it was prefilled again when the subagent returned.
 */
const KV_BLOCKS = atLeast(BENCH, "kv-blocks", f["kv-blocks"] ?? Math.max(DEFAULT_KV_BLOCKS, Math.ceil((2.5 * (LONG.window + LONG.outputTokens)) / KV_BLOCK_TOKENS)), 1)
const MB = 1024 * 1024
const RUN = `xlong-${Date.now().toString(36)}`
const sum = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0)
const round = (x: number, digits = 3) => Number(x.toFixed(digits))
const started = Date.now()
const elapsed = () => (Date.now() - started) / 1000

// ---- processes and memory ------------------------------------------------------------------

/** VmRSS and VmHWM of a process, bytes (0 when it is gone). */
const memoryOf = (pid: number | "self") => {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, "utf8")
    const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? 0) * 1024
    return { rss: kb("VmRSS"), hwm: kb("VmHWM") }
  } catch {
    return { rss: 0, hwm: 0 }
  }
}

/** Resets this process's peak RSS (Linux: clear_refs 5), so setup does not count as the gateway's. */
const resetPeak = () => {
  try {
    fs.writeFileSync("/proc/self/clear_refs", "5")
  } catch {
    // not Linux, or not allowed: the peak includes setup
  }
}

interface DeviceProcess {
  readonly child: ChildProcess
  /** Its last stderr lines. */
  readonly tail: Array<string>
  /** Its distinct warnings and errors (the first 10 kinds: the entry's first lines, and how often that kind came). */
  readonly problems: Map<string, { readonly text: string; count: number }>
  /** Peak RSS while rolling out (until the last outcome) and after. */
  readonly peak: { rollout: number; train: number }
  /** How it ended, once it has. */
  readonly exited: Promise<string>
}

const keep = (xs: Array<string>, x: string, n: number) => {
  xs.push(x)
  if (xs.length > n) xs.shift()
}

/** A `gyre node --devices 1` child joining run `run` on `natsUrl`. */
const startDevice = (natsUrl: string, run: string, i: number): DeviceProcess => {
  const child = spawn(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "node", "--devices", "1", "--run", run, "--name", `dev${i}`], {
    cwd: repoRoot,
    env: { ...process.env, NATS_URL: natsUrl },
    stdio: ["ignore", "ignore", "pipe"]
  })
  const exited = new Promise<string>((resolve) => child.once("exit", (code, signal) => resolve(signal === null ? `exit code ${code}` : `signal ${signal}`)))
  const d: DeviceProcess = { child, tail: [], problems: new Map(), peak: { rollout: 0, train: 0 }, exited }
  let entry: Array<string> = []
  const flush = () => {
    if (entry.length > 0 && /^\[[^\]]*\] (WARN|ERROR|FATAL)/.test(entry[0]!)) notice(d.problems, entry.join(" / ").replace(/^\[[^\]]*\] /, "").replace(/ \(#\d+\)/, ""))
    entry = []
  }
  const lines = readline.createInterface({ input: child.stderr! })
  lines.on("line", (line) => {
    keep(d.tail, line, 40)
    // A log entry is a line starting with its time, then indented lines (its cause, a stack).
    if (/^\[\d/.test(line)) flush()
    if (entry.length < 3 && (entry.length > 0 || /^\[\d/.test(line))) entry.push(line.trim().slice(0, 300))
  })
  lines.on("close", flush)
  return d
}

/** Counts a warning or error by its kind (its text with the numbers taken out). */
const notice = (problems: DeviceProcess["problems"], text: string) => {
  const kind = text.replace(/\d+/g, "N")
  const seen = problems.get(kind)
  if (seen !== undefined) seen.count++
  else if (problems.size < 10) problems.set(kind, { text, count: 1 })
}

const stopDevice = (d: DeviceProcess) =>
  new Promise<void>((resolve) => {
    if (d.child.exitCode !== null || d.child.signalCode !== null) return resolve()
    const kill = setTimeout(() => d.child.kill("SIGKILL"), 15_000)
    d.child.once("exit", () => {
      clearTimeout(kill)
      resolve()
    })
    d.child.kill("SIGTERM")
  })

// ---- the wire ------------------------------------------------------------------------------

interface Wire {
  messages: number
  bytes: number
  maxBytes: number
  maxSubject: string
  generates: number
  fullResends: number
  fullResendTokens: number
}

const headerBytes = (h: MsgHdrs | undefined) => {
  if (h === undefined) return 0
  let n = 12 // NATS/1.0 line and the blank line
  for (const k of h.keys()) for (const v of h.values(k)) n += k.length + v.length + 4
  return n
}

/**
 * Every message the server carries, as a subscriber to `>` receives it: counts, the largest,
 * and the `Generate` asks that send a whole prompt (base null) for an execution already served.
 */
const wiretap = (nats: NatsShape, run: string) => {
  const wire: Wire = { messages: 0, bytes: 0, maxBytes: 0, maxSubject: "", generates: 0, fullResends: 0, fullResendTokens: 0 }
  const served = new Set<string>()
  const asks = `gyre.${run}.ask.`
  const decoder = new TextDecoder()
  const sub = nats.nc.subscribe(">", {
    callback: (err, msg: Msg) => {
      if (err !== null) return
      const size = msg.data.length + headerBytes(msg.headers)
      wire.messages++
      wire.bytes += size
      if (size > wire.maxBytes) Object.assign(wire, { maxBytes: size, maxSubject: msg.subject })
      if (!msg.subject.startsWith(asks) || msg.headers?.get("Gyre-Request") !== "Generate") return
      const ask = JSON.parse(decoder.decode(msg.data)) as { execution: string; base: unknown; prompt: string; promptObject?: { count: number } }
      wire.generates++
      if (ask.base === null && served.has(ask.execution)) {
        wire.fullResends++
        wire.fullResendTokens += ask.promptObject?.count ?? Math.floor((ask.prompt.length * 3) / 4 / 4)
      }
      served.add(ask.execution)
    }
  })
  return { wire, stop: () => sub.unsubscribe() }
}

/** Sizes of every message the run's streams hold now (object-store chunks included), and of the call records. */
const storedSizes = (nats: NatsShape, run: string) =>
  Effect.gen(function* () {
    const names = yield* Effect.promise(async () => {
      const out: Array<string> = []
      for await (const name of nats.jsm.streams.names()) out.push(name)
      return out
    })
    const calls = rlLayout(run).calls("")
    const s = { messages: 0, maxBytes: 0, maxSubject: "", records: 0, recordBytes: 0, recordMax: 0 }
    for (const name of names) {
      yield* readStored(nats, name).pipe(
        Stream.runForEach((m) =>
          Effect.sync(() => {
            const size = m.data.length + headerBytes(m.headers)
            s.messages++
            if (size > s.maxBytes) Object.assign(s, { maxBytes: size, maxSubject: m.subject })
            if (!m.subject.startsWith(calls) || m.data.length === 0) return
            s.records++
            s.recordBytes += m.data.length
            s.recordMax = Math.max(s.recordMax, m.data.length)
          })
        ),
        Effect.orElseSucceed(() => undefined)
      )
    }
    return s
  })

/** Dead letters of the run: subject and reason. */
const deadLetters = (nats: NatsShape, run: string) =>
  readStored(nats, `GYRE_${run}_DEAD`).pipe(
    Stream.map((m) => `${m.subject}: ${m.headers?.get("Gyre-Dead-Reason") ?? "?"}`.slice(0, 300)),
    Stream.take(10),
    Stream.runCollect,
    Effect.map((c) => Array.from(c)),
    Effect.orElseSucceed((): Array<string> => [])
  )

// ---- the model -----------------------------------------------------------------------------

/** Random tiny-long weights (2^20 positions): what an untrained policy writes. */
const writeCheckpoint = (dir: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const engine = yield* Engine
      const model = yield* engine.createModel(presets["tiny-long"], { seed: 1, initStd: 0.2 })
      yield* saveCheckpoint(dir, model)
    })
  )

// ---- the run -------------------------------------------------------------------------------

/** The one-step run `gyre train` would configure for these flags. */
const runConfig = (run: string, checkpoint: string, checkpointDir: string): RunConfig => {
  const env = Object.entries(ENV).map(([k, v]) => `${k}=${v}`).join(",")
  const argv = ["--suite", "long", "--steps", "1", "--executions-per-step", String(EXECUTIONS), "--group-size", String(EXECUTIONS), "--slots", String(EXECUTIONS)]
  argv.push("--credit", "call", "--ppo-epochs", "1", "--lr-warmup", "0", "--checkpoint-every", "1", "--mode", f.mode, "--kv-dtype", f["kv-dtype"])
  argv.push("--micro-batch-tokens", String(f["micro-batch-tokens"]), "--kv-blocks", String(KV_BLOCKS), "--env", env)
  return runConfigOf(parseFlagsAs(BENCH, trainFlags, argv), run, checkpoint, checkpointDir)
}

interface Observed {
  outcomes: number
  /** The gateway's own counts once the rollout is over. */
  gateway: CallTotals | undefined
  rolloutS: number | undefined
  metrics: StepMetrics | undefined
  trainS: number | undefined
}

/** Hosts the run with devices in child processes; samples their memory; returns what it saw, and whether it finished. */
const hostWithDevices = (config: RunConfig, devices: Array<DeviceProcess>, observed: Observed, wire: Wire) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const names = rlLayout(config.run)
    const gatewayRef = refOf(GatewayProtocol, address("gateway", "main"))
    const outcomes = system.nats.nc.subscribe(names.allOutcomes, {
      callback: () => {
        observed.outcomes++
        if (observed.outcomes !== EXECUTIONS) return
        observed.rolloutS = elapsed()
        // Every call is answered: the gateway's totals are final.
        Effect.runPromise(system.ask(gatewayRef, "Status", undefined)).then(
          (s) => (observed.gateway = s.totals),
          () => undefined
        )
      }
    })
    const sampler = setInterval(() => {
      for (const d of devices) {
        const { rss, hwm } = memoryOf(d.child.pid!)
        if (observed.rolloutS === undefined) d.peak.rollout = Math.max(d.peak.rollout, rss, hwm)
        else d.peak.train = Math.max(d.peak.train, rss)
      }
    }, 200)
    yield* Effect.addFinalizer(() => Effect.sync(() => (clearInterval(sampler), outcomes.unsubscribe())))
    const hosted = hostRun({
      config,
      trainTasks: ["train-0"],
      devices: 0,
      suitesDir: path.join(repoRoot, "suites"),
      onProgress: (p) => {
        observed.metrics = p.metrics
        observed.trainS = elapsed()
      }
    })
    // A device process that exits ends the wait: the run cannot go on without it.
    const deviceExit = Effect.promise(() => Promise.race(devices.map((d, i) => d.exited.then((how) => `device process ${i} ended (${how}); its last lines:\n  ${d.tail.slice(-12).join("\n  ")}`))))
    const progress = setInterval(() => console.log(progressLine(observed, devices, wire)), 60_000)
    yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(progress)))
    return yield* Effect.raceFirst(
      hosted.pipe(
        Effect.timeoutOption(Duration.minutes(f["timeout-min"])),
        Effect.map((h) => (Option.isSome(h) ? { done: true as const } : { done: false as const, why: `no run-done within --timeout-min ${f["timeout-min"]}` }))
      ),
      deviceExit.pipe(Effect.map((why) => ({ done: false as const, why })))
    )
  })

/** One line of how far the run is, every minute. */
const progressLine = (o: Observed, devices: ReadonlyArray<DeviceProcess>, wire: Wire) =>
  `[${elapsed().toFixed(0)} s] ${stoppedIn(o)}: ${wire.generates} Generate asks, ${o.outcomes}/${EXECUTIONS} outcomes; device RSS ${devices.map((d) => Math.round(memoryOf(d.child.pid!).rss / MB)).join(", ")} MB`

/** The stage a run that did not finish stopped in. */
const stoppedIn = (o: Observed) => (o.outcomes < EXECUTIONS ? "rollout" : o.metrics === undefined ? "train" : "publish")

const main = Effect.gen(function* () {
  const run = RUN
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-xlong-"))
  yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(work, { recursive: true, force: true })))
  const checkpoint = f.checkpoint ?? path.join(work, "initial")
  if (f.checkpoint === undefined) yield* writeCheckpoint(checkpoint)
  const config = runConfig(run, checkpoint, path.join(work, "checkpoints"))
  const system = yield* ActorSystem
  const nats = system.nats
  const tap = wiretap(nats, run)
  const devices = Array.from({ length: DEVICES }, (_, i) => startDevice(nats.servers, run, i))
  yield* Effect.addFinalizer(() => Effect.promise(() => Promise.all(devices.map(stopDevice))))
  const setupS = elapsed()
  resetPeak()
  const observed: Observed = { outcomes: 0, gateway: undefined, rolloutS: undefined, metrics: undefined, trainS: undefined }
  const hosted = yield* Effect.scoped(hostWithDevices(config, devices, observed, tap.wire))
  const runS = elapsed()
  const gatewayPeak = memoryOf("self").hwm
  tap.stop()
  const problems = hosted.done ? undefined : { stage: stoppedIn(observed), why: hosted.why, dead: yield* deadLetters(nats, run) }
  yield* Effect.promise(() => Promise.all(devices.map(stopDevice)))
  const trajectories = yield* readTrajectories(system)
  const stored = yield* storedSizes(nats, run)
  const audit = yield* auditRun(system, EXECUTIONS)
  const trees = hosted.done ? yield* checkTrees(system, config) : undefined
  const wallS = elapsed()
  const stats = [...trajectories.executions.values()].map((t) => ({ stats: executionStats(t.decoder.tree), bytes: t.decoder.tree.byteSize, outcome: t.outcome, rejected: t.rejected.length }))
  const longest = Math.max(0, ...stats.map((s) => s.stats.depth))
  // bench:attention's measurement: tiny-long, the trainer's chunks of the run's micro-batch budget, one pass each.
  const [attention4k, attentionLong] = yield* measureAttention({ tokens: [4096, Math.max(4096, Math.min(longest, ATTENTION_MAX))], chunk: f["micro-batch-tokens"], threads: os.availableParallelism(), runs: 1 })
  report({ setupS, runS, wallS, observed, gatewayPeak, devices, wire: tap.wire, stored, stats, audit, trees, problems, attention4k, attentionLong, malformed: trajectories.malformed.length })
})

// ---- the report ----------------------------------------------------------------------------

interface Details {
  readonly refused?: number
  readonly first_refusal?: string
  readonly continued_prompt_tokens?: number
  readonly continued_cached_tokens?: number
}

/** The scorer's details inside an outcome's `detail` (`score x: {...}`), when they are whole. */
const detailsOf = (detail: string | undefined): Details => {
  const m = /^score [^:]+: (\{.*\})/.exec(detail ?? "")
  try {
    return m === null ? {} : (JSON.parse(m[1]!) as Details)
  } catch {
    return {}
  }
}

/** Everything the run left, for the report. */
interface Figures {
  readonly setupS: number
  readonly runS: number
  /** To the end of the replay check (the attention measurement after it is not the run's). */
  readonly wallS: number
  readonly observed: Observed
  readonly gatewayPeak: number
  readonly devices: ReadonlyArray<DeviceProcess>
  readonly wire: Wire
  readonly stored: Effect.Success<ReturnType<typeof storedSizes>>
  readonly stats: ReadonlyArray<{ readonly stats: ExecutionStats; readonly bytes: number; readonly outcome: ExecutionOutcome | undefined; readonly rejected: number }>
  readonly audit: RunAudit
  readonly trees: TreeCheck | undefined
  readonly problems: { readonly stage: string; readonly why: string; readonly dead: ReadonlyArray<string> } | undefined
  readonly attention4k: AttentionRate
  readonly attentionLong: AttentionRate
  readonly malformed: number
}

/** Tree tokens of the executions the step trained: what its micro-batches computed, forward and backward (exact packing adds the carried ancestors). */
const trainedTreeTokens = (r: Figures, m: StepMetrics) =>
  sum(r.stats.filter((s) => s.outcome !== undefined && m.trainedExecutions.includes(s.outcome.execution)).map((s) => s.stats.uniqueTokens))

/** The JSON line. */
const summaryOf = (r: Figures) => {
  const details = r.stats.map((s) => detailsOf(s.outcome?.detail))
  const continued = sum(details.map((d) => d.continued_prompt_tokens ?? 0))
  const m = r.observed.metrics
  const unique = sum(r.stats.map((s) => s.stats.uniqueTokens))
  // Prompt tokens the execution had already sent or received (each call's shared prefix with an earlier one): total - unique.
  const seen = sum(r.stats.map((s) => s.stats.totalTokens)) - unique
  return {
    calls: sum(r.stats.map((s) => s.stats.calls)),
    total_tokens: sum(r.stats.map((s) => s.stats.totalTokens)),
    unique_tokens: unique,
    max_context_tokens: Math.max(0, ...r.stats.map((s) => s.stats.depth)),
    record_max_bytes: r.stored.recordMax,
    record_mean_bytes: r.stored.records === 0 ? 0 : Math.round(r.stored.recordBytes / r.stored.records),
    max_message_bytes: Math.max(r.wire.maxBytes, r.stored.maxBytes),
    full_resends: r.wire.fullResends,
    reprefill_tokens: r.audit.reprefillTokens + (r.observed.gateway?.reprefillTokens ?? 0),
    cached_fraction: continued === 0 ? null : round(sum(details.map((d) => d.continued_cached_tokens ?? 0)) / continued, 4),
    cached_fraction_seen: seen <= 0 || r.observed.gateway === undefined ? null : round(r.observed.gateway.cachedTokens / seen, 4),
    dedup_ratio: unique === 0 ? null : round(sum(r.stats.map((s) => s.stats.totalTokens)) / unique, 2),
    tree_bytes_per_token: unique === 0 ? null : round(sum(r.stats.map((s) => s.bytes)) / unique, 2),
    trained_tokens: m?.tokensTrained ?? 0,
    trained_twice: r.audit.trainedTwice,
    train_tokens_per_s: m === undefined || m.computeMs === 0 ? null : Math.round(trainedTreeTokens(r, m) / (m.computeMs / 1000)),
    attention_pairs_per_s_4k: Math.round(r.attention4k.pairsPerS),
    attention_pairs_per_s_long: Math.round(r.attentionLong.pairsPerS),
    peak_rss_mb: {
      gateway: Math.round(r.gatewayPeak / MB),
      device: Math.round(Math.max(0, ...r.devices.map((d) => d.peak.rollout)) / MB),
      trainer: Math.round(Math.max(0, ...r.devices.map((d) => d.peak.train)) / MB)
    },
    refusals: sum(details.map((d) => d.refused ?? 0)),
    wall_s: round(r.wallS, 1)
  }
}

const report = (r: Figures) => {
  const j = summaryOf(r)
  const o = r.observed
  const m = o.metrics
  const first = r.stats.map((s) => detailsOf(s.outcome?.detail).first_refusal).find((x) => x !== undefined)
  const row = (stage: string, seconds: number | undefined, status: string, figures: string) => console.log(`${stage.padEnd(8)} ${(seconds === undefined ? "-" : seconds.toFixed(1)).padStart(8)} s  ${status.padEnd(6)} ${figures}`)
  console.log(`bench:xlong: ${EXECUTIONS} execution(s) of long/train-0 at scale ${f.scale} (${LONG.calls} main calls, window ${LONG.window}, tool outputs ~${LONG.toolTokens} tokens), ${DEVICES} device process(es), micro-batches of ${f["micro-batch-tokens"]} tokens, KV pools of ${KV_BLOCKS} blocks`)
  console.log(`${"stage".padEnd(8)} ${"at".padStart(8)}    status figures`)
  row("setup", r.setupS, "ok", `checkpoint, embedded nats-server, ${DEVICES} device process(es) started`)
  const rolled = o.rolloutS !== undefined
  const gw = o.gateway
  row("rollout", o.rolloutS, rolled && j.refusals === 0 ? "ok" : "FAILED", `${j.calls} calls, ${j.unique_tokens} distinct / ${j.total_tokens} tokens (dedup ${j.dedup_ratio}), longest context ${j.max_context_tokens}; cached ${j.cached_fraction} outside compactions, ${j.cached_fraction_seen} of the prompt tokens seen before; ${j.full_resends} full resends on the wire (${r.wire.fullResendTokens} tokens; the gateway counted ${gw?.fullResends ?? "?"}), ${r.wire.generates} Generate asks; ${gw?.reprefillTokens ?? "?"} evicted tokens prefilled again; ${j.refusals} refused${first === undefined ? "" : ` (first: ${first})`}; scores ${r.stats.map((s) => s.outcome?.score ?? "-").join(" ")}`)
  row("record", o.rolloutS, r.malformed === 0 && sum(r.stats.map((s) => s.rejected)) === 0 ? "ok" : "FAILED", `${r.stored.records} call records, max ${j.record_max_bytes} B, mean ${j.record_mean_bytes} B (target max <= 65536); ${r.malformed} malformed, ${sum(r.stats.map((s) => s.rejected))} rejected; tree ${j.tree_bytes_per_token} B/token`)
  const generated = sum(r.stats.map((s) => s.stats.generatedTokens))
  const trainedAll = m !== undefined && (f.mode === "exact" ? m.tokensTrained === generated : m.tokensTrained > 0)
  row("train", o.trainS, trainedAll ? "ok" : "FAILED", m === undefined ? "no step metrics" : `${m.tokensTrained} of ${generated} generated tokens trained in ${m.microBatches} micro-batches (${j.train_tokens_per_s} tree tokens/s of compute), loss ${m.loss.toFixed(4)}, executions trained twice ${j.trained_twice}`)
  row("publish", r.runS, r.problems === undefined ? "ok" : "FAILED", m === undefined ? "-" : `weights v${m.version} published in ${m.publishMs} ms`)
  row("replay", undefined, r.trees !== undefined && r.trees.mismatches.length === 0 ? "ok" : "FAILED", r.trees === undefined ? "not run" : `${r.trees.executions} trees, ${r.trees.microBatches} micro-batches re-planned, ${r.trees.mismatches.length} mismatches`)
  console.log(`messages: largest on the wire ${r.wire.maxBytes} B (${r.wire.maxSubject}), in the streams ${r.stored.maxBytes} B (${r.stored.maxSubject}); target <= 1048576`)
  console.log(`memory: gateway ${j.peak_rss_mb.gateway} MB, device ${j.peak_rss_mb.device} MB, trainer ${j.peak_rss_mb.trainer} MB (peak RSS)`)
  console.log(`attention: ${j.attention_pairs_per_s_4k} pairs/s at 4096 tokens, ${j.attention_pairs_per_s_long} at ${r.attentionLong.tokens} (${r.attentionLong.seconds.toFixed(1)} s)`)
  if (r.problems !== undefined) {
    console.log(`STOPPED in ${r.problems.stage}: ${r.problems.why}`)
    for (const d of r.problems.dead) console.log(`  dead letter: ${d}`)
  }
  // What the devices logged as an error or warning (a stage that failed without stopping the run says why here).
  for (const [i, d] of r.devices.entries()) for (const p of d.problems.values()) console.log(`device ${i}${p.count > 1 ? ` (${p.count} times)` : ""}: ${p.text}`)
  printResult(BENCH, j)
}

await Effect.runPromise(
  Effect.scoped(main).pipe(
    Effect.provide(Layer.mergeAll(ActorSystem.layer({ run: RUN }).pipe(Layer.provideMerge(Nats.layer({}))), Engine.layer))
  )
)
