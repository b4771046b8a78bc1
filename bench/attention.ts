/**
 * Attention rate of training on long paths: one path (a chain of T tokens) of a preset
 * (default tiny-long) trained once, SFT forward + backward, by a trainer whose chunks are
 * `--chunk` tokens (a path longer than a chunk trains in chunks: gyre.h, gyre_train_batch).
 * The rate is attention pairs per second of that training pass: pairs = the (query, key)
 * pairs the path's attention visits, T (T + 1) / 2 (each token and its ancestors), over the
 * pass's wall time (everything in it: attention forward and backward, the chunks'
 * recomputed forwards, the other layers). Printed for a 4096-token path and for each longer
 * one, each the best of `--runs` passes after a warm-up; then one JSON line:
 *   attention_pairs_per_s_4k, attention_pairs_per_s_long (the longest path), long_tokens,
 *   long_over_4k, cpu, last_level_cache_mib, threads, chunk, preset, per_path
 *
 *   npm run bench:attention [-- --long 16384,65536 --chunk 4096 --threads 2 --runs 1]
 *
 * `measureAttention` is the measurement itself, for other benchmarks (bench/xlong.ts).
 */
import { availableParallelism, cpus } from "node:os"
import { resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { Effect, Layer, Logger } from "effect"
import type { PackedBatch } from "../src/common/packed-batch.ts"
import { Engine } from "../src/engine/engine.ts"
import type { NativeError } from "../src/engine/native.ts"
import { type PresetName, presetNames, presets } from "../src/engine/presets.ts"
import { atLeast, benchFlags, listOf, refuse } from "./flags.ts"
import { lastLevelCacheBytes, printResult } from "./results.ts"

export interface AttentionRate {
  readonly tokens: number
  /** (query, key) pairs of one training pass over the path: tokens (tokens + 1) / 2. */
  readonly pairs: number
  /** Wall time of the fastest pass (forward + backward), seconds. */
  readonly seconds: number
  readonly pairsPerS: number
}

/** One chain of `tokens` tokens, every token but the root trained with weight 1 / tokens. */
const path = (tokens: number, vocab: number): PackedBatch => {
  const parents = Int32Array.from({ length: tokens }, (_, i) => i - 1)
  return {
    length: tokens,
    tokens: Int32Array.from({ length: tokens }, (_, i) => (i * 104729 + 7919) % vocab),
    parents,
    positions: Int32Array.from({ length: tokens }, (_, i) => i),
    weights: Float32Array.from(parents, (p) => (p < 0 ? 0 : 1 / tokens)),
    advantages: new Float32Array(tokens),
    behaviourLogprobs: new Float32Array(tokens),
    proximalLogprobs: new Float32Array(tokens).fill(Number.NaN),
    versions: new Int32Array(tokens)
  }
}

/**
 * Attention pairs per second of training one path of each length in `tokens` (SFT, forward +
 * backward, a trainer of `chunk` max_tokens, `threads` compute threads, the best of `runs`
 * passes after one warm-up pass on a 256-token path), on a model of `preset` with random
 * weights. The engine's gradient buffer is zeroed after each pass.
 */
export const measureAttention = (options: {
  readonly tokens: ReadonlyArray<number>
  readonly chunk: number
  readonly threads: number
  readonly runs?: number
  readonly preset?: PresetName
}): Effect.Effect<ReadonlyArray<AttentionRate>, NativeError, Engine> =>
  Effect.scoped(
    Effect.gen(function* () {
      const engine = yield* Engine
      const config = presets[options.preset ?? "tiny-long"]
      const model = yield* engine.createModel(config, { seed: 1, threads: options.threads })
      const trainer = yield* model.trainer({ maxTokens: options.chunk })
      const pass = (batch: PackedBatch) =>
        Effect.gen(function* () {
          const t = performance.now()
          yield* trainer.train(batch, { kind: "sft" })
          const seconds = (performance.now() - t) / 1000
          yield* trainer.zeroGrads()
          return seconds
        })
      yield* pass(path(256, config.vocab_size))
      const rates: Array<AttentionRate> = []
      for (const tokens of options.tokens) {
        const batch = path(tokens, config.vocab_size)
        let seconds = Number.POSITIVE_INFINITY
        for (let r = 0; r < (options.runs ?? 1); r++) seconds = Math.min(seconds, yield* pass(batch))
        const pairs = (tokens * (tokens + 1)) / 2
        rates.push({ tokens, pairs, seconds, pairsPerS: pairs / seconds })
      }
      return rates
    })
  )

const main = () => {
  const BENCH = "bench:attention"
  const f = benchFlags(BENCH, "attention pairs per second of training a 4096-token path and longer ones (chunked)", {
    long: { kind: "string", doc: "lengths of the long paths, comma-separated (the last is attention_pairs_per_s_long's)", default: "16384,65536" },
    chunk: { kind: "integer", doc: "the trainer's max_tokens (chunk length)", default: 4096 },
    threads: { kind: "integer", doc: "compute threads", default: availableParallelism() },
    runs: { kind: "integer", doc: "passes per path, the fastest kept", default: 1 },
    preset: { kind: "string", doc: "model preset", default: "tiny-long" }
  })
  const long = f.long.split(",").map(Number)
  if (long.length === 0 || long.some((n) => !Number.isInteger(n) || n <= 4096)) refuse(BENCH, `--long takes lengths above 4096, got '${f.long}'`)
  const [preset] = listOf(BENCH, "preset", f.preset, presetNames)
  const chunk = atLeast(BENCH, "chunk", f.chunk, 16)
  const threads = atLeast(BENCH, "threads", f.threads, 1)
  const runs = atLeast(BENCH, "runs", f.runs, 1)
  if (long.at(-1)! > presets[preset!].max_position_embeddings) refuse(BENCH, `--long: ${long.at(-1)} tokens exceed ${preset}'s ${presets[preset!].max_position_embeddings} positions`)
  const rates = Effect.runPromise(
    measureAttention({ tokens: [4096, ...long], chunk, threads, runs, preset }).pipe(Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([])))))
  )
  return rates.then((r) => {
    const llc = lastLevelCacheBytes()
    const cpu = cpus()[0]?.model.trim() ?? "unknown"
    console.log(`attention rate: ${preset}, one path per length, SFT forward + backward, chunks of ${chunk}, ${threads} threads; ${cpu}, last-level cache ${llc === undefined ? "unknown" : `${(llc / 2 ** 20).toFixed(0)} MiB`}`)
    console.log("tokens     pairs           seconds   pairs/s      vs 4k")
    for (const x of r) {
      console.log(
        `${String(x.tokens).padEnd(10)} ${x.pairs.toExponential(3).padEnd(15)} ${x.seconds.toFixed(2).padStart(8)}  ${x.pairsPerS.toExponential(3).padEnd(12)} ${(x.pairsPerS / r[0]!.pairsPerS).toFixed(2)}`
      )
    }
    const last = r.at(-1)!
    printResult(BENCH, {
        attention_pairs_per_s_4k: Math.round(r[0]!.pairsPerS),
        attention_pairs_per_s_long: Math.round(last.pairsPerS),
        long_tokens: last.tokens,
        long_over_4k: Number((last.pairsPerS / r[0]!.pairsPerS).toFixed(3)),
        cpu,
        last_level_cache_mib: llc === undefined ? null : Math.round(llc / 2 ** 20),
        threads,
        chunk,
        preset,
        per_path: r.map((x) => ({ tokens: x.tokens, pairs_per_s: Math.round(x.pairsPerS), seconds: Number(x.seconds.toFixed(3)) }))
    })
  })
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === resolve(process.argv[1])) await main()
