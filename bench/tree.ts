/**
 * `npm run bench:tree`: the trajectory processor on synthetic executions shaped like the
 * published workload: 500 calls and about 700k unique tokens per execution, a fifth of the
 * calls retries (9%), subagent calls (10%) or compactions (1%, plus one whenever the main
 * context passes 240k tokens), and one execution of about 1M unique tokens for the build
 * target (under 1 s on one core, under 16 bytes per unique token).
 *
 * Each execution's calls go through the real gateway path first (DeltaEncoder, then the
 * JSON wire form); what is timed is what the trainer and replay do: JSON text -> Schema
 * decode -> DeltaDecoder -> tree. Then a GRPO-sized group of 4 executions is turned into
 * exact training units and packed into micro-batches, and sampled with J_max = 5; the exact
 * units are packed again at budgets below their deepest path (carried tokens, long parts).
 * Prints a table and, last, one JSON line. Not a test: nothing here is asserted.
 */
import { Schema } from "effect"
import { DeltaDecoder } from "../src/tree/decoder.ts"
import { DeltaEncoder } from "../src/tree/encoder.ts"
import { packMicroBatches } from "../src/tree/pack.ts"
import { CallRecordJson, type ModelCall, untempered } from "../src/tree/record.ts"
import { mulberry32 } from "../src/tree/sample.ts"
import { executionStats, type ExecutionStats } from "../src/tree/stats.ts"
import { stepUnits } from "../src/tree/units.ts"
import { printResult } from "./results.ts"

const CALLS = 500
const WINDOW = 240_000
const BUDGET = 1 << 18
const J_MAX = 5
const GROUP = 4

/** A growable context of token ids; prompts are views of it. */
class Context {
  tokens = new Int32Array(1 << 16)
  length = 0
  constructor(from?: Int32Array) {
    if (from !== undefined) this.push(from)
  }
  push(values: Int32Array): void {
    if (this.length + values.length > this.tokens.length) {
      const grown = new Int32Array(Math.max(this.tokens.length * 2, this.length + values.length))
      grown.set(this.tokens.subarray(0, this.length))
      this.tokens = grown
    }
    this.tokens.set(values, this.length)
    this.length += values.length
  }
  view(): Int32Array {
    return this.tokens.subarray(0, this.length)
  }
}

/** The model calls of one synthetic execution, in completion order; `scale` multiplies tool results. */
function* syntheticCalls(seed: number, scale: number): Generator<ModelCall> {
  const random = mulberry32(seed)
  const between = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1))
  const text = (n: number) => Int32Array.from({ length: n }, () => between(3, 151_000))
  const system = text(8_000)
  let main = new Context(system)
  main.push(text(2_000))
  let lastPromptLength = main.length
  let subagent: { context: Context; callsLeft: number } | undefined
  let index = 0
  const call = (role: string, prompt: Int32Array, outputLength: number): { call: ModelCall; output: Int32Array } => {
    const output = text(outputLength)
    const version = Math.floor(index / 100)
    return {
      output,
      call: {
        callId: `call-${seed}-${index++}`,
        role,
        prompt,
        output,
        logprobs: Float32Array.from(output, () => -3 * random()),
        versions: new Int32Array(outputLength).fill(version),
        sampling: untempered,
        finishReason: "tool_calls",
        startedAt: index * 1000,
        finishedAt: index * 1000 + 800,
        toolCalls: { [`tool-${index}`]: '{"name":"bash","arguments":{"cmd":"make test"}}' }
      }
    }
  }
  const toolResult = () => text(Math.round(between(200, 2_000) * scale))
  while (index < CALLS) {
    const dice = random()
    if (subagent !== undefined || dice < 0.1) {
      // Subagent: forks from the main context; its last call summarises back to main.
      subagent ??= { context: new Context(main.view()), callsLeft: between(2, 6) }
      subagent.context.push(text(300))
      const last = --subagent.callsLeft === 0
      const { call: c, output } = call(last ? "subagent-summary" : "subagent", subagent.context.view(), between(100, 500))
      yield c
      subagent.context.push(output)
      subagent.context.push(toolResult())
      if (last) {
        main.push(output)
        subagent = undefined
      }
    } else if (dice < 0.19 && index > 0) {
      // Retry: the last main prompt again, a new output; the main context continues from it.
      main.length = lastPromptLength
      const { call: c, output } = call("main", main.view(), between(100, 500))
      yield c
      main.push(output)
      main.push(toolResult())
    } else if (dice < 0.2 || main.length > WINDOW) {
      // Compaction: summarise, then restart from the system prompt and the summary.
      main.push(text(200))
      const { call: c, output } = call("main-summary", main.view(), between(1_000, 2_000))
      yield c
      main = new Context(system)
      main.push(output)
      lastPromptLength = main.length
    } else {
      lastPromptLength = main.length
      const { call: c, output } = call("main", main.view(), between(100, 500))
      yield c
      main.push(output)
      main.push(toolResult())
    }
  }
}

const encodeJson = Schema.encodeSync(CallRecordJson)
const decodeJson = Schema.decodeUnknownSync(CallRecordJson)

/** The JSON payloads the gateway would publish for one execution. */
const gatewayRecords = (seed: number, scale: number): Array<string> => {
  const encoder = new DeltaEncoder({ run: "bench", task: "task-0", execution: `exec-${seed}` })
  return Array.from(syntheticCalls(seed, scale), (c) => encodeJson(encoder.encode(c)))
}

interface Built {
  readonly decoder: DeltaDecoder
  readonly seconds: number
  readonly records: number
  readonly recordBytes: Array<number>
  readonly stats: ExecutionStats
}

const decodeAndBuild = (seed: number, payloads: ReadonlyArray<string>): Built => {
  const start = performance.now()
  const decoder = new DeltaDecoder(`exec-${seed}`)
  for (const payload of payloads) {
    const report = decoder.add(decodeJson(payload))
    if (report.rejected.length > 0) throw report.rejected[0]
  }
  const seconds = (performance.now() - start) / 1000
  return { decoder, seconds, records: payloads.length, recordBytes: payloads.map((p) => Buffer.byteLength(p)), stats: executionStats(decoder.tree) }
}

const row = (cells: ReadonlyArray<string | number>) => console.log(cells.map((c) => String(c).padStart(13)).join(" "))
const fmt = (x: number, digits = 2) => x.toFixed(digits)

console.log("Trajectory processor bench: decode + build from gateway JSON records (timed), then pack and sample")
row(["execution", "calls", "unique", "call_tok", "dedup", "depth", "leaves", "build_s", "records/s", "tokens/s", "B/uniq_tok", "max_rec_KiB"])
const group: Array<Built> = []
const show = (name: string, b: Built) =>
  row([
    name,
    b.stats.calls,
    b.stats.uniqueTokens,
    b.stats.totalTokens,
    fmt(b.stats.dedupRatio, 1),
    b.stats.depth,
    b.stats.leaves,
    fmt(b.seconds, 3),
    Math.round(b.records / b.seconds),
    Math.round(b.stats.uniqueTokens / b.seconds),
    fmt(b.decoder.tree.byteSize / b.stats.uniqueTokens),
    fmt(Math.max(...b.recordBytes) / 1024, 0)
  ])
for (let seed = 1; seed <= GROUP; seed++) {
  const built = decodeAndBuild(seed, gatewayRecords(seed, 1))
  group.push(built)
  show(`700k #${seed}`, built)
}
const bigPayloads = gatewayRecords(100, 1.7)
const big = [0, 1, 2].map(() => decodeAndBuild(100, bigPayloads))
big.forEach((b, i) => show(`1M run ${i + 1}`, b))

const steps = group.map((b, i) => ({ execution: b.decoder.execution, tree: b.decoder.tree, advantage: i - 1.5 }))
const unitsStart = performance.now()
const exact = stepUnits(steps, { _tag: "exact" })
const unitsSeconds = (performance.now() - unitsStart) / 1000
const sampled = stepUnits(steps, { _tag: "sampled", maxPaths: J_MAX, seed: 1 })
const packStart = performance.now()
const packedExact = packMicroBatches(exact.units, BUDGET)
const packSeconds = (performance.now() - packStart) / 1000
const packedSampled = packMicroBatches(sampled.units, BUDGET)
const exactReport = packedExact.report
const sampledReport = packedSampled.report

const sum = (f: (b: Built) => number) => group.reduce((a, b) => a + f(b), 0)
const flatTokens = sum((b) => b.stats.pathTokens)
const treeTokens = sum((b) => b.stats.uniqueTokens)
const sampledTokens = sampled.units.reduce((a, u) => a + u.length, 0)
const sampledPathTokens = [...sampled.samples.values()].reduce((a, s) => a + s.paths.reduce((b, p) => b + p.pathTokens, 0), 0)
const groupSeconds = sum((b) => b.seconds)
const bestBig = big.reduce((a, b) => (b.seconds < a.seconds ? b : a))

console.log("")
console.log(`group of ${GROUP} executions, micro-batch budget ${BUDGET} tokens:`)
row(["mode", "tokens", "trained", "batches", "fill", "carried", "split_units", "units_s", "pack_s"])
row(["flat paths", flatTokens, "-", "-", "-", "-", "-", "-", "-"])
row(["exact tree", exactReport.tokens, exactReport.trainedTokens, exactReport.microBatches, fmt(exactReport.fillRatio, 3), exactReport.carriedTokens, exactReport.splitUnits, fmt(unitsSeconds, 3), fmt(packSeconds, 3)])
row([`sampled J=${J_MAX}`, sampledReport.tokens, sampledReport.trainedTokens, sampledReport.microBatches, fmt(sampledReport.fillRatio, 3), sampledReport.carriedTokens, sampledReport.splitUnits, "-", "-"])
console.log(`sampled paths as separate sequences (the published form): ${sampledPathTokens} tokens`)
// Budgets below the deepest path: long parts are micro-batches of their own (trained in chunks).
const LONG_BUDGETS = [4_096, 16_384, 65_536]
const longReports = LONG_BUDGETS.map((budget) => packMicroBatches(exact.units, budget).report)
console.log("")
console.log(`exact tree, budgets below the deepest path (${Math.max(...exact.units.map((u) => u.positions.reduce((a, d) => Math.max(a, d), 0))) + 1} tokens):`)
row(["budget", "tokens", "batches", "long_batches", "largest", "carried", "max_carried", "split_units"])
for (const r of longReports) row([r.budget, r.tokens, r.microBatches, r.longMicroBatches, r.largest, r.carriedTokens, r.maxCarried, r.splitUnits])
console.log(`1M build target (< 1 s): best ${fmt(bestBig.seconds, 3)} s, first ${fmt(big[0]!.seconds, 3)} s for ${bestBig.stats.uniqueTokens} unique tokens`)

printResult("bench:tree", {
  bench: "tree",
  executions: GROUP,
  calls_per_execution: CALLS,
  records_per_s: Math.round(sum((b) => b.records) / groupSeconds),
  tokens_per_s: Math.round(treeTokens / groupSeconds),
  bytes_per_unique_token: Number(fmt(sum((b) => b.decoder.tree.byteSize) / treeTokens, 3)),
  dedup_ratio: Number(fmt(sum((b) => b.stats.totalTokens) / treeTokens, 2)),
  pack_fill_ratio: Number(fmt(exactReport.fillRatio, 4)),
  flat_tokens: flatTokens,
  tree_tokens: treeTokens,
  sampled_tokens: sampledTokens,
  sampled_path_tokens: sampledPathTokens,
  packed_tokens: exactReport.tokens,
  carried_tokens: exactReport.carriedTokens,
  long_budgets: LONG_BUDGETS,
  long_carried_tokens: longReports.map((r) => r.carriedTokens),
  long_micro_batches: longReports.map((r) => r.microBatches),
  long_largest: longReports.map((r) => r.largest),
  call_tokens: sum((b) => b.stats.totalTokens),
  max_record_bytes: Math.max(...group.flatMap((b) => b.recordBytes)),
  build_1m_s: Number(fmt(bestBig.seconds, 3)),
  build_1m_first_s: Number(fmt(big[0]!.seconds, 3)),
  unique_tokens_1m: bestBig.stats.uniqueTokens,
  bytes_per_unique_token_1m: Number(fmt(bestBig.decoder.tree.byteSize / bestBig.stats.uniqueTokens, 3))
})
