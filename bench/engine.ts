/**
 * Engine benchmark: for the presets (tiny, small), prefill tokens/s (16 sequences of 512),
 * decode tokens/s (16 sequences at context 512 and 4096), train tokens/s (4 x 256 tokens:
 * forward + backward + AdamW) and the GFLOP/s each achieves, against a plain-PyTorch Llama
 * (bench/llama_torch.py) with the same config, thread count and batch on Debian's
 * python3-torch + libopenblas0-pthread (installed with apt-get when missing), plus the
 * machine's sgemm rate and memory bandwidth (STREAM triad and a read-only sum, the better of
 * the two) measured through that PyTorch. Prints a table, then one JSON line.
 *
 *   npm run bench:engine [-- --presets tiny,small --threads N --quick --bf16-gb G --bf16-only]
 *
 * FLOPs are counted the same way for both sides: 2 per weight of every matmul (lm_head
 * included, embedding lookup not) per token forward, plus 4 x layers x hidden x keys for
 * attention (QK^T and PV); training counts 3x the forward. Each figure is the best of
 * repeated runs, over two rounds (engine, PyTorch, engine, PyTorch) so that a burst of load
 * from other processes does not favour one side. decode_over_torch is the lower of the two
 * contexts' ratios. The peer runs with the engine's environment (OMP_WAIT_POLICY included).
 *
 * decode_4096_over_bw_bound: the decode step's time at context 4096 over the time its bytes
 * take at the measured bandwidth; bytes per step = every matmul weight once (4 bytes each) +
 * every sequence's K and V up to its position (2 x layers x kv heads x head_dim x the KV
 * element size per key). Bandwidth is measured in every round, best kept, like the rates. A
 * step whose bytes fit the last-level cache (`last_level_cache_mib`, from sysfs or getconf; tiny's 138 MB
 * on a host with a 300 MiB L3) reads part of them from it, faster than memory: its line says
 * so, since its ratio is then no memory figure.
 *
 * 16-bit weights (CPU backend; `--bf16-gb`, 0 skips): a Llama-shaped model (hidden 2048, 16
 * heads of 128, 2 kv heads, intermediate 5504, tied) with as many layers as make its BF16
 * weights `--bf16-gb` GB (default: twice the last-level cache, at least 0.5 GB, so they are
 * read from memory), saved as a BF16 checkpoint and loaded twice: kept BF16 (memory-mapped) and
 * converted to F32. One sequence decodes at context 4096 (its K/V a synthetic hand-off): at 16
 * rows a step is bound by the cores' FMA rate, not memory (16 FLOPs per BF16 weight byte), at
 * one it is a memory figure. decode_4096_over_bw_bound_bf16: the BF16 step's time over its bytes
 * (2 per matmul weight + the K/V read) at the measured bandwidth; bf16_decode_over_f32: the F32
 * step's time over the BF16 step's; bf16_logits_equal_f32: one step's logits bit-identical.
 * `--bf16-only` runs this section alone (with the bandwidth probe it is measured against; the
 * JSON line then has its keys, stream_gb_s and last_level_cache_mib).
 *
 * On the CPU backend, decode at 4096 again with F16 KV storage (the same hand-off rounded into an
 * F16 cache): decode_4096_f16_tok_s, decode_4096_f16_over_f32 (its speed-up),
 * decode_4096_f16_over_bw_bound (against its own, halved KV bytes) and
 * decode_4096_f16_logits_rel_diff (one step's largest logit difference from F32 over the
 * largest F32 logit: the accuracy F16 storage costs).
 */
import { execFileSync, spawnSync } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { availableParallelism, tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Layer, Logger } from "effect"
import type { PackedBatch } from "../src/common/packed-batch.ts"
import { loadCheckpoint, saveCheckpoint } from "../src/engine/checkpoint.ts"
import { headDim, type KvDtype, type LlamaConfig, kvBytesPerToken } from "../src/engine/config.ts"
import { Engine, type Model } from "../src/engine/engine.ts"
import type { KvCache } from "../src/engine/kvcache.ts"
import { type PresetName, presets } from "../src/engine/presets.ts"
import { adamwDefaults } from "../src/engine/trainer.ts"
import { atLeast, benchFlags, listOf, refuse } from "./flags.ts"
import { lastLevelCacheBytes, printResult } from "./results.ts"
import { sizedLlama } from "./sized-llama.ts"

const BENCH = "bench:engine"
const f = benchFlags(BENCH, "the native engine against a plain-PyTorch Llama, the machine's SGEMM and its memory bandwidth", {
  presets: { kind: "string", doc: "the model presets, comma-separated", default: "tiny,small" },
  threads: { kind: "integer", doc: "compute threads, both sides", default: availableParallelism() },
  quick: { kind: "boolean", doc: "fewer steps, one round, shorter timings", default: false },
  "bf16-gb": { kind: "number", doc: "BF16 weight size of the 16-bit-weights model (default: twice the last-level cache, at least 0.5; 0 skips)" },
  "bf16-only": { kind: "boolean", doc: "the 16-bit-weights section alone, with its bandwidth probe (no presets, no SGEMM)", default: false }
})
const quick = f.quick
const threads = atLeast(BENCH, "threads", f.threads, 1)
const presetList = f["bf16-only"] ? [] : listOf(BENCH, "presets", f.presets, Object.keys(presets) as Array<PresetName>)
if (f["bf16-only"] && f["bf16-gb"] === 0) refuse(BENCH, "--bf16-only runs the 16-bit-weights section, which --bf16-gb 0 skips")
const python = "/usr/bin/python3"
const peerScript = new URL("./llama_torch.py", import.meta.url).pathname

const BATCH = 16
const PREFILL = 512
const CONTEXTS = [512, 4096] as const
const DECODE_STEPS = quick ? 4 : 8
const TRAIN_BATCH = 4
const TRAIN_SEQ = 256
const MIN_TIME = quick ? 0.3 : 1.0
const ROUNDS = quick ? 1 : 2

/* ---- the peer ---- */

const torchReady = () => spawnSync(python, ["-c", "import torch"], { stdio: "ignore" }).status === 0
const openblasReady = () => spawnSync("dpkg", ["-s", "libopenblas0-pthread"], { stdio: "ignore" }).status === 0

/** Installs python3-torch and libopenblas0-pthread with apt-get when either is missing. */
const ensurePeer = (): string | undefined => {
  if (torchReady() && openblasReady()) return undefined
  console.error("bench: installing python3-torch and libopenblas0-pthread (apt-get)")
  try {
    execFileSync("apt-get", ["update", "-qq"], { stdio: "inherit" })
    execFileSync("apt-get", ["install", "-y", "-qq", "python3-torch", "libopenblas0-pthread"], {
      stdio: "inherit",
      env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" }
    })
  } catch (e) {
    return `apt-get failed: ${e instanceof Error ? e.message : String(e)}`
  }
  return torchReady() ? undefined : "python3-torch still cannot be imported"
}

const peer = (cmd: ReadonlyArray<string>): Record<string, number> => {
  const out = execFileSync(python, [peerScript, ...cmd], { encoding: "utf8", maxBuffer: 1 << 26, env: { ...process.env, OMP_NUM_THREADS: String(threads) } })
  return JSON.parse(out.trim().split("\n").at(-1)!)
}

/* ---- FLOP counts ---- */

const llc = lastLevelCacheBytes()

const matmulParams = (c: LlamaConfig) => {
  const hd = headDim(c)
  const perLayer = c.hidden_size * hd * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) + 3 * c.hidden_size * c.intermediate_size
  return c.num_hidden_layers * perLayer + c.vocab_size * c.hidden_size
}
/** Forward FLOPs of one token that attends to `keys` keys. */
const tokenFlops = (c: LlamaConfig, keys: number) => 2 * matmulParams(c) + 4 * c.num_hidden_layers * c.num_attention_heads * headDim(c) * keys

/** Bytes one decode step of BATCH sequences moves at least, at `keys` keys each. */
const decodeBytes = (c: LlamaConfig, keys: number, dtype: KvDtype = "f32") =>
  4 * matmulParams(c) + BATCH * keys * kvBytesPerToken(c, dtype)

/* ---- ours ---- */

const best = <E, R>(run: Effect.Effect<void, E, R>, minTime = MIN_TIME) =>
  Effect.gen(function* () {
    yield* run // warm-up
    let fastest = Number.POSITIVE_INFINITY
    let spent = 0
    while (spent < minTime) {
      const t = performance.now()
      yield* run
      const dt = (performance.now() - t) / 1000
      fastest = Math.min(fastest, dt)
      spent += dt
    }
    return fastest
  })

const randomTokens = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (seed * 7919 + i * 104729) % 256)

const chains = (count: number, length: number): PackedBatch => {
  const n = count * length
  const tokens = Int32Array.from(randomTokens(n, 3))
  const parents = Int32Array.from({ length: n }, (_, i) => (i % length === 0 ? -1 : i - 1))
  const positions = Int32Array.from({ length: n }, (_, i) => i % length)
  return {
    length: n,
    tokens,
    parents,
    positions,
    weights: Float32Array.from(parents, (p) => (p < 0 ? 0 : 1 / (n - count))),
    advantages: new Float32Array(n),
    behaviourLogprobs: new Float32Array(n),
    proximalLogprobs: new Float32Array(n).fill(Number.NaN),
    versions: new Int32Array(n)
  }
}

const decodeSteps = (cache: KvCache, seqs: ReadonlyArray<number>) =>
  Effect.gen(function* () {
    for (let s = 0; s < DECODE_STEPS; s++) yield* cache.forward(seqs.map((seq) => ({ seq, tokens: [s + 1] })), "last")
  })

/**
 * Decode at context 4096 with F16 KV storage (CPU backend): the hand-off rounded into an F16
 * cache, one step of both caches with the same tokens compared (the largest logit difference
 * over the largest F32 logit), then the F16 steps timed. Leaves the F32 sequences one step on.
 */
const halfDecode = (model: Model, cache: KvCache, seqs: ReadonlyArray<number>, handoff: Uint8Array) =>
  Effect.scoped(
    Effect.gen(function* () {
      const half = yield* model.cache({ blockTokens: 16, numBlocks: (yield* cache.stats()).numBlocks, kvDtype: "f16" })
      const halfSeqs: Array<number> = []
      for (let s = 0; s < BATCH; s++) halfSeqs.push(yield* half.import(handoff))
      const step = (c: KvCache, ids: ReadonlyArray<number>) => c.forward(ids.map((seq) => ({ seq, tokens: [0] })), "last").pipe(Effect.map((r) => r.logits!))
      const wide = yield* step(cache, seqs)
      const narrow = yield* step(half, halfSeqs)
      const scale = wide.reduce((m, x) => Math.max(m, Math.abs(x)), 0)
      const diff = wide.reduce((m, x, i) => Math.max(m, Math.abs(x - narrow[i]!)), 0)
      return { decode_4096_f16_s: yield* best(decodeSteps(half, halfSeqs)), decode_4096_f16_logits_rel_diff: diff / scale }
    })
  )

const ours = (config: LlamaConfig) =>
  Effect.gen(function* () {
    const engine = yield* Engine
    yield* engine.setThreads(threads)
    const model = yield* engine.createModel(config, { seed: 1 })
    const out: Record<string, number> = {}
    // prefill: 16 sequences of 512 in one batched call (fresh sequences each run)
    const blocksPer = Math.ceil((CONTEXTS[1] + 8 * DECODE_STEPS + 16) / 16)
    const cache = yield* model.cache({ blockTokens: 16, numBlocks: BATCH * blocksPer + 2 * Math.ceil(PREFILL / 16) * BATCH })
    const prompts = Array.from({ length: BATCH }, (_, s) => randomTokens(PREFILL, s))
    let live: Array<number> = []
    out.prefill_512_s = yield* best(
      Effect.gen(function* () {
        for (const seq of live) yield* cache.free(seq)
        live = []
        for (let s = 0; s < BATCH; s++) live.push(yield* cache.create())
        yield* cache.forward(live.map((seq, s) => ({ seq, tokens: prompts[s]! })), "last")
      })
    )
    out.prefill_512_tokens = BATCH * PREFILL
    out.decode_512_s = yield* best(decodeSteps(cache, live))
    out.decode_512_tokens = BATCH * DECODE_STEPS
    for (const seq of live) yield* cache.free(seq)
    // context 4096: one sequence prefilled, handed to 16 sequences by export -> import
    const long = randomTokens(CONTEXTS[1], 9)
    let first = -1
    out.prefill_4096_s = yield* best(
      Effect.gen(function* () {
        if (first >= 0) yield* cache.free(first)
        first = yield* cache.create()
        yield* cache.forward([{ seq: first, tokens: long }], "last")
      }),
      0
    )
    out.prefill_4096_tokens = CONTEXTS[1]
    const handoff = yield* cache.export(first)
    yield* cache.free(first)
    const seqs: Array<number> = []
    for (let s = 0; s < BATCH; s++) seqs.push(yield* cache.import(handoff))
    if (engine.backend === "cpu") Object.assign(out, yield* halfDecode(model, cache, seqs, handoff))
    out.decode_4096_s = yield* best(decodeSteps(cache, seqs))
    out.decode_4096_tokens = BATCH * DECODE_STEPS
    for (const seq of seqs) yield* cache.free(seq)
    // training: forward + backward + AdamW on 4 chains of 256
    const trainer = yield* model.trainer({ maxTokens: TRAIN_BATCH * TRAIN_SEQ })
    const train = chains(TRAIN_BATCH, TRAIN_SEQ) // 4 x 256 tokens through the model, as the peer's ids[:, :-1]
    out.train_s = yield* best(
      Effect.gen(function* () {
        yield* trainer.zeroGrads()
        yield* trainer.train(train, { kind: "sft" })
        yield* trainer.step({ ...adamwDefaults, lr: 1e-4 })
      })
    )
    out.train_tokens = TRAIN_BATCH * TRAIN_SEQ
    return out
  })

/* ---- 16-bit weights ---- */

const BF16_CONTEXT = CONTEXTS[1]

/** Llama-shaped (hidden 2048, 16 heads of 128, 2 kv heads), layers for `gb` GB of BF16 weights. */
const bf16Config = (gb: number): LlamaConfig =>
  sizedLlama(gb, {
    vocab_size: 32000,
    hidden_size: 2048,
    intermediate_size: 5504,
    num_attention_heads: 16,
    num_key_value_heads: 2,
    max_position_embeddings: BF16_CONTEXT + 64,
    rms_norm_eps: 1e-6,
    rope_theta: 1000000,
    tie_word_embeddings: true
  })

/** A GYKV hand-off (gyre.h) of `length` tokens of small random F32 K/V for the config. */
const syntheticHandoff = (c: LlamaConfig, length: number) =>
  Effect.gen(function* () {
    const engine = yield* Engine
    const floats = 2 * c.num_hidden_layers * length * c.num_key_value_heads * headDim(c)
    const payload = new Float32Array(floats)
    let x = 7
    for (let i = 0; i < floats; i++) payload[i] = ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) / 2 ** 32 - 0.5) * 0.2
    const bytes = new Uint8Array(payload.buffer)
    const out = new Uint8Array(48 + bytes.length)
    const view = new DataView(out.buffer)
    out.set(new TextEncoder().encode("GYKV"), 0)
    ;[1, c.num_hidden_layers, c.num_key_value_heads, headDim(c), 4, length, 0].forEach((v, i) => view.setUint32(4 + 4 * i, v, true))
    view.setBigUint64(32, BigInt(bytes.length), true)
    view.setBigUint64(40, yield* engine.checksum(bytes), true)
    out.set(bytes, 48)
    return out
  })

/** One sequence at BF16_CONTEXT on the model: the best step's seconds, and one step's logits. */
const oneSequenceDecode = (model: Model, handoff: Uint8Array) =>
  Effect.scoped(
    Effect.gen(function* () {
      const cache = yield* model.cache({ blockTokens: 16, numBlocks: Math.ceil((BF16_CONTEXT + 2 * DECODE_STEPS + 64) / 16) * 2 })
      const probe = yield* cache.import(handoff)
      const logits = (yield* cache.forward([{ seq: probe, tokens: [0] }], "last")).logits!
      yield* cache.free(probe)
      const seq = yield* cache.import(handoff)
      const step_s = yield* best(
        Effect.gen(function* () {
          for (let s = 0; s < DECODE_STEPS; s++) yield* cache.forward([{ seq, tokens: [s + 1] }], "last")
        })
      )
      return { step_s: step_s / DECODE_STEPS, logits }
    })
  )

/** BF16 weights kept BF16 against the same checkpoint converted to F32, rounds alternated. */
const bf16Decode = (gb: number, measureBandwidth: () => number) =>
  Effect.gen(function* () {
    const engine = yield* Engine
    yield* engine.setThreads(threads)
    const config = bf16Config(gb)
    const dir = join(mkdtempSync(join(tmpdir(), "gyre-bench-bf16-")), "model")
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(join(dir, ".."), { recursive: true, force: true })))
    console.error(`bench: 16-bit weights: ${config.num_hidden_layers} layers, ${(2 * matmulParams(config) / 1e9).toFixed(2)} GB of BF16 matmul weights, written to ${dir}`)
    yield* Effect.scoped(Effect.gen(function* () { yield* saveCheckpoint(dir, yield* engine.createModel(config, { seed: 1 }), undefined, { dtype: "BF16" }) }))
    const kept = (yield* loadCheckpoint(dir)).model
    const wide = (yield* loadCheckpoint(dir, { weights: "f32" })).model
    const handoff = yield* syntheticHandoff(config, BF16_CONTEXT)
    let [bf16, f32] = [Number.POSITIVE_INFINITY, Number.POSITIVE_INFINITY]
    let equal = true
    let bandwidth = 0
    for (let r = 1; r <= ROUNDS; r++) {
      console.error(`bench: 16-bit weights, round ${r}/${ROUNDS}`)
      bandwidth = Math.max(bandwidth, measureBandwidth())
      const [a, b] = [yield* oneSequenceDecode(kept, handoff), yield* oneSequenceDecode(wide, handoff)]
      bf16 = Math.min(bf16, a.step_s)
      f32 = Math.min(f32, b.step_s)
      equal &&= Buffer.from(a.logits.buffer).equals(Buffer.from(b.logits.buffer))
    }
    const kvBytes = (BF16_CONTEXT + (DECODE_STEPS + 1) / 2) * kvBytesPerToken(config)
    const bytes = 2 * matmulParams(config) + kvBytes
    return {
      config,
      weight_dtype: yield* kept.weightDtype(),
      bf16_model_gb: round((2 * matmulParams(config)) / 1e9),
      bf16_decode_4096_tok_s: round(1 / bf16),
      f32_decode_4096_tok_s: round(1 / f32),
      bf16_bytes_per_step: round(bytes, 4),
      decode_4096_over_bw_bound_bf16: round(bf16 / (bytes / bandwidth)),
      f32_decode_4096_over_bw_bound: round(f32 / ((bytes + 2 * matmulParams(config)) / bandwidth)),
      bf16_decode_over_f32: round(f32 / bf16),
      bf16_logits_equal_f32: equal,
      bf16_bandwidth_gb_s: round(bandwidth / 1e9)
    }
  })

/* ---- figures ---- */

interface Figures {
  readonly prefill: number
  readonly decode512: number
  readonly decode4096: number
  /** F16 KV storage (NaN where the backend has none), and its largest logit difference over the largest F32 logit (the same every round). */
  readonly decode4096F16: number
  readonly f16LogitsRelDiff: number
  readonly train: number
  readonly prefillGflops: number
  readonly decode512Gflops: number
  readonly decode4096Gflops: number
  readonly trainGflops: number
}

const figures = (c: LlamaConfig, t: Record<string, number>): Figures => {
  const prefillFlops = BATCH * Array.from({ length: PREFILL }, (_, p) => tokenFlops(c, p + 1)).reduce((a, b) => a + b, 0)
  const decodeFlops = (ctx: number) => BATCH * Array.from({ length: DECODE_STEPS }, (_, s) => tokenFlops(c, ctx + s + 1)).reduce((a, b) => a + b, 0)
  const trainFlops = 3 * TRAIN_BATCH * Array.from({ length: TRAIN_SEQ }, (_, p) => tokenFlops(c, p + 1)).reduce((a, b) => a + b, 0)
  return {
    prefill: t.prefill_512_tokens! / t.prefill_512_s!,
    decode512: t.decode_512_tokens! / t.decode_512_s!,
    decode4096: t.decode_4096_tokens! / t.decode_4096_s!,
    decode4096F16: t.decode_4096_tokens! / (t.decode_4096_f16_s ?? Number.NaN),
    f16LogitsRelDiff: t.decode_4096_f16_logits_rel_diff ?? Number.NaN,
    train: t.train_tokens! / t.train_s!,
    prefillGflops: prefillFlops / t.prefill_512_s! / 1e9,
    decode512Gflops: decodeFlops(512) / t.decode_512_s! / 1e9,
    decode4096Gflops: decodeFlops(4096) / t.decode_4096_s! / 1e9,
    trainGflops: trainFlops / t.train_s! / 1e9
  }
}

const round = (x: number, digits = 3) => Number(x.toPrecision(digits))

/** Per figure, the better of two measurements (higher rates). */
const better = (a: Figures | undefined, b: Figures): Figures =>
  a === undefined ? b : (Object.fromEntries(Object.entries(b).map(([k, v]) => [k, Math.max(v, a[k as keyof Figures])])) as unknown as Figures)

const main = Effect.gen(function* () {
  const engine = yield* Engine
  const peerProblem = ensurePeer()
  const sgemm = peerProblem === undefined && presetList.length > 0 ? peer(["sgemm", "--threads", String(threads), "--min-time", String(MIN_TIME)]).sgemm_gflops! : Number.NaN
  let bandwidth = Number.NaN // bytes/s, best over the rounds
  const measureBandwidth = () => {
    if (peerProblem !== undefined) return
    const r = peer(["stream", "--threads", String(threads), "--min-time", String(MIN_TIME / 2)])
    bandwidth = Math.max(Number.isNaN(bandwidth) ? 0 : bandwidth, 1e9 * r.triad_gb_s!, 1e9 * r.read_gb_s!)
  }
  const report: Record<string, unknown> = { backend: engine.backend, devices: engine.devices, threads, sgemm_gflops: round(sgemm) }
  const rows: Array<Array<string>> = []
  /** Per preset: decode step seconds at 4096 and its bytes, set against the run's best bandwidth at the end. */
  const decodeSteps4096: Array<{ name: string; entry: Record<string, unknown>; dtype: KvDtype; step_s: number; bytes: number }> = []
  for (const name of presetList) {
    const config = presets[name]
    let mine: Figures | undefined
    let theirs: Figures | undefined
    for (let r = 1; r <= ROUNDS; r++) {
      console.error(`bench: ${name}: engine (${engine.backend}, ${threads} threads), round ${r}/${ROUNDS}`)
      measureBandwidth()
      mine = better(mine, figures(config, yield* Effect.scoped(ours(config))))
      if (peerProblem !== undefined) continue
      console.error(`bench: ${name}: PyTorch, round ${r}/${ROUNDS}`)
      theirs = better(
        theirs,
        figures(
          config,
          peer(["bench", "--config", JSON.stringify(config), "--threads", String(threads), "--batch", String(BATCH), "--decode-steps",
            String(DECODE_STEPS), "--train-batch", String(TRAIN_BATCH), "--train-seq", String(TRAIN_SEQ), "--min-time", String(MIN_TIME)])
        )
      )
    }
    if (mine === undefined) continue
    const ratio = (a: number, b: number | undefined) => (b === undefined ? Number.NaN : a / b)
    const entry = {
      params: matmulParams(config),
      prefill_tok_s: round(mine.prefill),
      decode_512_tok_s: round(mine.decode512),
      decode_4096_tok_s: round(mine.decode4096),
      train_tok_s: round(mine.train),
      prefill_gflops: round(mine.prefillGflops),
      decode_512_gflops: round(mine.decode512Gflops),
      decode_4096_gflops: round(mine.decode4096Gflops),
      train_gflops: round(mine.trainGflops),
      torch_prefill_tok_s: theirs && round(theirs.prefill),
      torch_decode_512_tok_s: theirs && round(theirs.decode512),
      torch_decode_4096_tok_s: theirs && round(theirs.decode4096),
      torch_train_tok_s: theirs && round(theirs.train),
      torch_train_gflops: theirs && round(theirs.trainGflops),
      prefill_over_torch: round(ratio(mine.prefill, theirs?.prefill)),
      decode_512_over_torch: round(ratio(mine.decode512, theirs?.decode512)),
      decode_4096_over_torch: round(ratio(mine.decode4096, theirs?.decode4096)),
      decode_over_torch: round(Math.min(ratio(mine.decode512, theirs?.decode512), ratio(mine.decode4096, theirs?.decode4096))),
      decode_4096_bytes_per_step: round(decodeBytes(config, CONTEXTS[1] + (DECODE_STEPS + 1) / 2), 4),
      decode_4096_f16_tok_s: round(mine.decode4096F16),
      decode_4096_f16_over_f32: round(mine.decode4096F16 / mine.decode4096),
      decode_4096_f16_logits_rel_diff: round(mine.f16LogitsRelDiff),
      train_over_torch: round(ratio(mine.train, theirs?.train)),
      prefill_frac_of_sgemm: round(mine.prefillGflops / sgemm),
      decode_512_frac_of_sgemm: round(mine.decode512Gflops / sgemm),
      decode_4096_frac_of_sgemm: round(mine.decode4096Gflops / sgemm),
      train_frac_of_sgemm: round(mine.trainGflops / sgemm),
      torch_train_frac_of_sgemm: theirs && round(theirs.trainGflops / sgemm)
    }
    report[name] = entry
    const line = (what: string, ourRate: number, ourGflops: number, peerRate: number | undefined) =>
      rows.push([name, what, ourRate.toFixed(0), peerRate === undefined ? "-" : peerRate.toFixed(0), peerRate === undefined ? "-" : `${(ourRate / peerRate).toFixed(2)}x`, ourGflops.toFixed(1), `${((100 * ourGflops) / sgemm).toFixed(0)}%`])
    line("prefill 16x512", mine.prefill, mine.prefillGflops, theirs?.prefill)
    line("decode 16 @512", mine.decode512, mine.decode512Gflops, theirs?.decode512)
    line("decode 16 @4096", mine.decode4096, mine.decode4096Gflops, theirs?.decode4096)
    line("decode 16 @4096, F16 KV", mine.decode4096F16, (mine.decode4096Gflops * mine.decode4096F16) / mine.decode4096, theirs?.decode4096)
    line("train 4x256", mine.train, mine.trainGflops, theirs?.train)
    const bytes = (dtype: KvDtype) => Array.from({ length: DECODE_STEPS }, (_, s) => decodeBytes(config, CONTEXTS[1] + s + 1, dtype)).reduce((a, b) => a + b, 0) / DECODE_STEPS
    decodeSteps4096.push({ name, entry, dtype: "f32", step_s: BATCH / mine.decode4096, bytes: bytes("f32") })
    if (!Number.isNaN(mine.decode4096F16)) decodeSteps4096.push({ name, entry, dtype: "f16", step_s: BATCH / mine.decode4096F16, bytes: bytes("f16") })
  }
  const header = ["preset", "figure", "tok/s", "torch tok/s", "ours/torch", "GFLOP/s", "of sgemm"]
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)))
  const fmt = (r: ReadonlyArray<string>) => r.map((x, i) => (i < 2 ? x.padEnd(widths[i]!) : x.padStart(widths[i]!))).join("  ")
  console.log(`engine bench: ${engine.backend} backend (${engine.devices.join("; ")}), ${threads} threads; sgemm ${sgemm.toFixed(1)} GFLOP/s (PyTorch/OpenBLAS, 1024^3)`)
  if (peerProblem !== undefined) console.log(`PyTorch peer unavailable: ${peerProblem}`)
  if (rows.length > 0) console.log(fmt(header))
  for (const r of rows) console.log(fmt(r))
  for (const d of decodeSteps4096) {
    d.entry[d.dtype === "f32" ? "decode_4096_over_bw_bound" : "decode_4096_f16_over_bw_bound"] = round(d.step_s / (d.bytes / bandwidth))
    // Bytes that fit the last-level cache may be read from it, faster than memory: the ratio is then no memory figure.
    const cached = llc !== undefined && d.bytes < llc ? ` (fits the ${(llc / 2 ** 20).toFixed(0)} MiB last-level cache: it may be read partly from there, so not a memory figure)` : ""
    console.log(`${d.name}: decode 16 @4096 (${d.dtype.toUpperCase()} KV) moves ${(d.bytes / 1e6).toFixed(1)} MB a step in ${(1e3 * d.step_s).toFixed(1)} ms: ${(d.step_s / (d.bytes / bandwidth)).toFixed(2)}x its time at ${(bandwidth / 1e9).toFixed(1)} GB/s${cached}`)
  }
  const bf16Gb = f["bf16-gb"] ?? Math.max(0.5, (2 * (llc ?? 0)) / 1e9)
  if (engine.backend === "cpu" && bf16Gb > 0 && peerProblem === undefined) {
    const r = yield* Effect.scoped(bf16Decode(bf16Gb, () => (measureBandwidth(), bandwidth)))
    const { config, ...figures16 } = r
    Object.assign(report, figures16)
    console.log(
      `16-bit weights (${config.num_hidden_layers} layers, ${r.bf16_model_gb} GB BF16 kept ${r.weight_dtype}): decode 1 @4096 ${r.bf16_decode_4096_tok_s} tok/s, F32 ${r.f32_decode_4096_tok_s}: ` +
        `${r.bf16_decode_over_f32}x (target >= 1.6); ${r.decode_4096_over_bw_bound_bf16}x its bound at ${r.bf16_bandwidth_gb_s} GB/s (target <= 1.3); logits equal: ${r.bf16_logits_equal_f32}`
    )
  } else if (f["bf16-only"]) console.log(`16-bit weights: not run (${engine.backend === "cpu" ? "no bandwidth probe without the PyTorch peer" : `the ${engine.backend} backend keeps no 16-bit weights`})`)
  report.stream_gb_s = round(bandwidth / 1e9)
  report.last_level_cache_mib = llc === undefined ? null : round(llc / 2 ** 20)
  printResult(BENCH, report)
})

Effect.runPromise(main.pipe(Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([])))))).catch((e) => {
  console.error(e)
  process.exitCode = 1
})
