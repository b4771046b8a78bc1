/**
 * A trainer handle: loss and gradients of packed batches (`PackedBatch`) of any length, the
 * gradient buffer (export/import for reducing across trainers), AdamW and the optimizer state.
 *
 * A batch longer than the trainer's `maxTokens` trains in chunks of `maxTokens` rows, exactly
 * (gyre.h, gyre_train_batch): the activations stay those of one chunk, and the batch costs
 * `memory().kvBytesPerToken` per token (its K/V and their gradients) while it trains.
 */
import { Effect } from "effect"
import type { PackedBatch } from "../common/packed-batch.ts"
import type { LlamaConfig } from "./config.ts"
import { type NativeCalls, type NativeError, type TrainerHandle, readStruct, structBuffer } from "./native.ts"

/**
 * SFT cross-entropy, or decoupled PPO-clip: per token w = min(pi_prox / mu, isCap) (no cap
 * when isCap <= 0), r = pi_theta / pi_prox clipped to [1 - clipLow, 1 + clipHigh], loss
 * -w min(r A, clip(r) A). Tokens whose version is more than maxStaleness behind
 * currentVersion are dropped. pi_prox is the batch's `proximalLogprobs` (NaN: mu), or with
 * `proximal: "current"` the weights being trained (r = 1: one update per batch, whose
 * gradient is then w A grad log pi with w = min(pi / mu, isCap), without a scoring pass).
 * pi is softmax(logits / temperature) (default 1): the distribution the run samples from, so
 * that mu and pi are log-probs of the same distribution.
 */
export type LossConfig =
  | { readonly kind: "sft" }
  | {
      readonly kind: "ppo"
      readonly temperature?: number
      readonly clipLow: number
      readonly clipHigh: number
      readonly isCap: number
      readonly currentVersion?: number
      readonly maxStaleness?: number
      /** Where pi_prox comes from (default "given": the batch's proximalLogprobs). */
      readonly proximal?: "given" | "current"
    }

export interface TrainStats {
  readonly loss: number
  readonly weightSum: number
  readonly entropy: number
  readonly meanLogprob: number
  readonly meanRatio: number
  readonly clipFraction: number
  readonly meanIsWeight: number
  readonly truncatedFraction: number
  readonly trainedTokens: number
  readonly staleTokens: number
}

/** What the trainer allocates (gyre_trainer_memory_info), in bytes. */
export interface TrainerMemory {
  /** Allocated at creation: activations of `maxTokens` rows, gradients, AdamW moments, a `maxTokens` batch's K/V. */
  readonly fixedBytes: number
  /** Per token of a batch longer than `maxTokens`, while it trains: its K/V and their gradients, all layers. */
  readonly kvBytesPerToken: number
  /** The K/V store the last `train` allocated beyond `fixedBytes` (0 when it fit `maxTokens`). */
  readonly lastBatchBytes: number
}

export interface TrainResult {
  readonly stats: TrainStats
  /** log pi_theta(tokens[i] | ancestors) per token; NaN for roots. */
  readonly tokenLogprobs: Float32Array
}

/** AdamW hyper-parameters (torch.optim.AdamW semantics) and global-norm clipping. */
export interface AdamW {
  readonly lr: number
  readonly beta1: number
  readonly beta2: number
  readonly eps: number
  readonly weightDecay: number
  /** <= 0: no clipping. */
  readonly maxGradNorm: number
}

/** torch.optim.AdamW's defaults (betas 0.9 / 0.999, eps 1e-8, weight decay 0.01), clipping at 1. */
export const adamwDefaults: Omit<AdamW, "lr"> = { beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01, maxGradNorm: 1.0 }

const cLoss = (loss: LossConfig) =>
  loss.kind === "sft"
    ? { kind: 0, clip_eps_low: 0, clip_eps_high: 0, is_cap: 0, current_version: 0, max_staleness: -1, proximal_current: 0, temperature: 1 }
    : {
        kind: 1,
        clip_eps_low: loss.clipLow,
        clip_eps_high: loss.clipHigh,
        is_cap: loss.isCap,
        current_version: loss.currentVersion ?? 0,
        max_staleness: loss.maxStaleness ?? -1,
        proximal_current: loss.proximal === "current" ? 1 : 0,
        temperature: loss.temperature ?? 1
      }

export class Trainer {
  constructor(
    /** Its model's queue. */
    readonly lib: NativeCalls,
    readonly ptr: TrainerHandle,
    readonly config: LlamaConfig,
    readonly paramCount: number,
    readonly maxTokens: number
  ) {}

  /**
   * Loss over the batch (any length: longer than `maxTokens`, it trains in chunks with the
   * same result); with backward (default) its gradient is ADDED to the gradient buffer
   * (accumulation across batches).
   */
  train(batch: PackedBatch, loss: LossConfig, options: { readonly backward?: boolean } = {}): Effect.Effect<TrainResult, NativeError> {
    const tokenLogprobs = new Float32Array(batch.length)
    const statsOut = structBuffer("gyre_train_stats")
    return this.lib
      .run("train_batch", [
        this.ptr,
        batch.length,
        batch.tokens,
        batch.parents,
        batch.positions,
        batch.weights,
        batch.advantages,
        batch.behaviourLogprobs,
        batch.proximalLogprobs,
        batch.versions,
        cLoss(loss),
        options.backward === false ? 0 : 1,
        tokenLogprobs,
        statsOut
      ])
      .pipe(
        Effect.map(() => readStruct(statsOut, "gyre_train_stats")),
        Effect.map((s) => ({
          tokenLogprobs,
          stats: {
            loss: s.loss!,
            weightSum: s.weight_sum!,
            entropy: s.entropy!,
            meanLogprob: s.mean_logprob!,
            meanRatio: s.mean_ratio!,
            clipFraction: s.clip_fraction!,
            meanIsWeight: s.mean_is_weight!,
            truncatedFraction: s.truncated_fraction!,
            trainedTokens: s.trained_tokens!,
            staleTokens: s.stale_tokens!
          }
        }))
      )
  }

  memory(): Effect.Effect<TrainerMemory, NativeError> {
    const out = structBuffer("gyre_trainer_memory_info")
    return this.lib.runSync("trainer_memory", [this.ptr, out]).pipe(
      Effect.map(() => readStruct(out, "gyre_trainer_memory_info")),
      Effect.map((m) => ({ fixedBytes: Number(m.fixed_bytes), kvBytesPerToken: Number(m.kv_bytes_per_token), lastBatchBytes: Number(m.last_batch_bytes) }))
    )
  }

  zeroGrads(): Effect.Effect<void, NativeError> {
    return this.lib.run("zero_grads", [this.ptr])
  }

  /** The gradient buffer (flat layout of gyre.h). */
  getGrads(): Effect.Effect<Float32Array, NativeError> {
    const out = new Float32Array(this.paramCount)
    return this.lib.run("get_grads", [this.ptr, out, out.length]).pipe(Effect.as(out))
  }

  setGrads(grads: Float32Array): Effect.Effect<void, NativeError> {
    return this.lib.run("set_grads", [this.ptr, grads, grads.length])
  }

  /** grads += scale * other (reducing another trainer's exported gradients). */
  addGrads(grads: Float32Array, scale = 1): Effect.Effect<void, NativeError> {
    return this.lib.run("add_grads", [this.ptr, grads, grads.length, scale])
  }

  /** One AdamW step on the model's weights; returns the gradient norm before clipping. */
  step(opt: AdamW): Effect.Effect<number, NativeError> {
    const norm = [0]
    const c = { lr: opt.lr, beta1: opt.beta1, beta2: opt.beta2, eps: opt.eps, weight_decay: opt.weightDecay, max_grad_norm: opt.maxGradNorm }
    return this.lib.run("trainer_step", [this.ptr, c, norm]).pipe(Effect.map(() => norm[0]!))
  }

  stepCount(): Effect.Effect<number, NativeError> {
    const out = [0]
    return this.lib.runSync("step_count", [this.ptr, out]).pipe(Effect.map(() => Number(out[0])))
  }

  /** The AdamW moments and step count as a safetensors file (optimizer.safetensors). */
  saveOptimizer(): Effect.Effect<Uint8Array, NativeError> {
    return Effect.gen({ self: this }, function* () {
      const len = [0]
      yield* this.lib.runSync("save_optimizer", [this.ptr, null, 0, len])
      const out = new Uint8Array(Number(len[0]))
      yield* this.lib.run("save_optimizer", [this.ptr, out, out.length, len])
      return out
    })
  }

  loadOptimizer(bytes: Uint8Array): Effect.Effect<void, NativeError> {
    return this.lib.run("load_optimizer", [this.ptr, bytes, bytes.length])
  }
}
