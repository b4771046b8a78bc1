/**
 * Shared pieces of the engine tests: running an effect with the Engine, micro configs for
 * finite differences, and builders of packed batches.
 */
import { execFileSync } from "node:child_process"
import { Effect, Layer, Logger, type Scope } from "effect"
import type { PackedBatch } from "../../src/common/packed-batch.ts"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import type { KvCache } from "../../src/engine/kvcache.ts"

/** Runs an effect needing the Engine (and a scope for handles); the backend line is not logged. */
export const runEngine = <A, E>(effect: Effect.Effect<A, E, Engine | Scope.Scope>): Promise<A> =>
  Effect.runPromise(effect.pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([]))))))

/** Builds and runs a check target of native/Makefile (`make -s`): its stdout, or an error with its output. */
export const runMakeCheck = (target: string): string => {
  try {
    return execFileSync("make", ["-C", new URL("../../native", import.meta.url).pathname, "-s", target], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })
  } catch (e) {
    const failed = e as { stdout?: string; stderr?: string }
    throw new Error(`${target} failed:\n${failed.stdout ?? ""}${failed.stderr ?? ""}`)
  }
}

export const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!))
  return m
}

/** One decode step per token; the last logits row after each. */
export const decodeEach = (cache: KvCache, seq: number, tokens: ReadonlyArray<number>) =>
  Effect.forEach(tokens, (t) => cache.forward([{ seq, tokens: [t] }], "last").pipe(Effect.map((r) => r.logits!)))

/** A micro model for finite differences: every layer present, a few thousand parameters. */
export const micro = (tied: boolean): LlamaConfig => ({
  vocab_size: 32,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  max_position_embeddings: 64,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  tie_word_embeddings: tied
})

/** A packed batch from parents and tokens; positions are depths, loss weights 1 except roots. */
export const packed = (
  tokens: ReadonlyArray<number>,
  parents: ReadonlyArray<number>,
  fill: Partial<Omit<PackedBatch, "length" | "tokens" | "parents" | "positions">> = {}
): PackedBatch => {
  const n = tokens.length
  const positions = new Int32Array(n)
  parents.forEach((p, i) => (positions[i] = p < 0 ? 0 : positions[p]! + 1))
  return {
    length: n,
    tokens: Int32Array.from(tokens),
    parents: Int32Array.from(parents),
    positions,
    weights: fill.weights ?? Float32Array.from(parents, (p) => (p < 0 ? 0 : 1)),
    advantages: fill.advantages ?? new Float32Array(n).fill(1),
    behaviourLogprobs: fill.behaviourLogprobs ?? new Float32Array(n),
    proximalLogprobs: fill.proximalLogprobs ?? new Float32Array(n).fill(Number.NaN),
    versions: fill.versions ?? new Int32Array(n)
  }
}

/** The chain parents [-1, 0, 1, ...] of a plain sequence. */
export const chain = (n: number): Array<number> => Array.from({ length: n }, (_, i) => i - 1)

/** Deterministic pseudo-random numbers in [0, 1). */
export const rng = (seed: number) => {
  let s = seed >>> 0
  return () => {
    s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0
    s ^= s + Math.imul(s ^ (s >>> 7), 61)
    return ((s ^ (s >>> 14)) >>> 0) / 4294967296
  }
}

export const norm = (x: ArrayLike<number>): number => {
  let s = 0
  for (let i = 0; i < x.length; i++) s += x[i]! * x[i]!
  return Math.sqrt(s)
}

/** ||a - b|| / ||b|| */
export const relativeError = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let d = 0
  for (let i = 0; i < a.length; i++) d += (a[i]! - b[i]!) ** 2
  return Math.sqrt(d) / Math.max(norm(b), 1e-30)
}
