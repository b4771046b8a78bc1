/**
 * A paged KV cache handle: sequences, batched prefill/decode with sampling, and the KV
 * hand-off (pin, export, import, unpin) - the rollout side of the engine.
 */
import { Effect } from "effect"
import { type KvDtype, kvDtypes, type LlamaConfig } from "./config.ts"
import { type CacheHandle, type NativeCalls, type NativeError, int32s } from "./native.ts"

/** Sampling of a sequence's next token (temperature 0 = greedy). */
export interface Sampling {
  readonly temperature: number
  readonly topP: number
  readonly seed: number | bigint
}

export interface CacheStats {
  readonly blockTokens: number
  readonly numBlocks: number
  readonly usedBlocks: number
  readonly freeBlocks: number
  readonly pinnedBlocks: number
  readonly numSequences: number
  readonly kvDtype: KvDtype
  readonly bytesPerToken: number
  readonly bytesTotal: number
}

/** One sequence's part of a forward call: the tokens to append, and how to sample after them. */
export interface SequenceInput {
  readonly seq: number
  readonly tokens: ArrayLike<number>
  readonly sampling?: Sampling
}

export type LogitsMode = "none" | "last" | "all"

export interface ForwardResult {
  /** `last`: one row per sequence; `all`: one row per appended token; rows of vocab_size. */
  readonly logits: Float32Array | undefined
  /** When sampling was given: the sampled token of each sequence and its log-probability. */
  readonly sampled: Int32Array | undefined
  readonly sampledLogprobs: Float32Array | undefined
}

const logitsModes: Record<LogitsMode, number> = { none: 0, last: 1, all: 2 }

export class KvCache {
  constructor(
    /** Its model's queue. */
    readonly lib: NativeCalls,
    readonly ptr: CacheHandle,
    readonly config: LlamaConfig,
    /** Tokens per block. */
    readonly blockTokens: number
  ) {}

  stats(): Effect.Effect<CacheStats, NativeError> {
    const out: Record<string, number> = {}
    return this.lib.runSync("cache_stats", [this.ptr, out]).pipe(
      Effect.map(() => ({
        blockTokens: out.block_tokens!,
        numBlocks: out.num_blocks!,
        usedBlocks: out.used_blocks!,
        freeBlocks: out.free_blocks!,
        pinnedBlocks: out.pinned_blocks!,
        numSequences: out.num_sequences!,
        kvDtype: kvDtypes[out.kv_dtype!]!,
        bytesPerToken: Number(out.bytes_per_token),
        bytesTotal: Number(out.bytes_total)
      }))
    )
  }

  /** The sequence id a call writes into its out slot. */
  private seqCall(call: (out: Array<number>) => Effect.Effect<void, NativeError>) {
    const out = [0]
    return call(out).pipe(Effect.map(() => out[0]!))
  }

  /** A new, empty sequence. */
  create(): Effect.Effect<number, NativeError> {
    return this.seqCall((out) => this.lib.runSync("seq_create", [this.ptr, out]))
  }

  /** A new sequence sharing all of `parent`'s tokens (blocks shared until they diverge). */
  fork(parent: number): Effect.Effect<number, NativeError> {
    return this.seqCall((out) => this.lib.runSync("seq_fork", [this.ptr, parent, out]))
  }

  /**
   * A new sequence sharing `parent`'s first `length` tokens (0 < length <= its length): the
   * blocks holding them, copy-on-write, so appending to it leaves `parent`'s K/V intact.
   */
  forkPrefix(parent: number, length: number): Effect.Effect<number, NativeError> {
    return this.seqCall((out) => this.lib.runSync("seq_fork_prefix", [this.ptr, parent, length, out]))
  }

  free(seq: number): Effect.Effect<void, NativeError> {
    return this.lib.runSync("seq_free", [this.ptr, seq])
  }

  length(seq: number): Effect.Effect<number, NativeError> {
    const out = [0]
    return this.lib.runSync("seq_length", [this.ptr, seq, out]).pipe(Effect.map(() => out[0]!))
  }

  blocks(seq: number): Effect.Effect<number, NativeError> {
    const out = [0]
    return this.lib.runSync("seq_blocks", [this.ptr, seq, out]).pipe(Effect.map(() => out[0]!))
  }

  /**
   * Appends each input's tokens to its sequence and runs the model (prefill when many
   * tokens, decode when one). Sampling must be given for all inputs or none. Fails with
   * OutOfKvBlocks, changing nothing, when the pool is short.
   */
  forward(inputs: ReadonlyArray<SequenceInput>, logits: LogitsMode = "last"): Effect.Effect<ForwardResult, NativeError> {
    const n = inputs.length
    const rows = inputs.reduce((sum, s) => sum + s.tokens.length, 0)
    const tokens = new Int32Array(new ArrayBuffer(Math.max(4, rows * 4)), 0, rows)
    let at = 0
    for (const s of inputs) {
      tokens.set(Array.from(s.tokens), at)
      at += s.tokens.length
    }
    const sampling = inputs.every((s) => s.sampling !== undefined)
      ? inputs.map((s) => ({ temperature: s.sampling!.temperature, top_p: s.sampling!.topP, seed: BigInt(s.sampling!.seed) }))
      : undefined
    const V = this.config.vocab_size
    const out = logits === "none" ? undefined : new Float32Array((logits === "all" ? rows : n) * V)
    const sampled = sampling ? new Int32Array(n) : undefined
    const sampledLogprobs = sampling ? new Float32Array(n) : undefined
    return this.lib
      .run("forward", [
        this.ptr,
        n,
        int32s(inputs.map((s) => s.seq)),
        int32s(inputs.map((s) => s.tokens.length)),
        tokens,
        logitsModes[logits],
        out ?? null,
        sampling ?? null,
        sampled ?? null,
        sampledLogprobs ?? null
      ])
      .pipe(Effect.as({ logits: out, sampled, sampledLogprobs }))
  }

  /** Holds the sequence's blocks and freezes it for a hand-off (pins nest). */
  pin(seq: number): Effect.Effect<void, NativeError> {
    return this.lib.runSync("seq_pin", [this.ptr, seq])
  }

  /** Releases a pin (after the destination acknowledged); frees the blocks of a freed sequence. */
  unpin(seq: number): Effect.Effect<void, NativeError> {
    return this.lib.runSync("seq_unpin", [this.ptr, seq])
  }

  /** The sequence's K/V as a hand-off buffer (GYKV format of gyre.h, with checksum). */
  export(seq: number): Effect.Effect<Uint8Array, NativeError> {
    return Effect.gen({ self: this }, function* () {
      const len = [0]
      yield* this.lib.runSync("seq_export", [this.ptr, seq, null, 0, len])
      const out = new Uint8Array(Number(len[0]))
      yield* this.lib.run("seq_export", [this.ptr, seq, out, out.length, len])
      return out
    })
  }

  /** A new sequence holding an exported one's K/V. */
  import(buffer: Uint8Array): Effect.Effect<number, NativeError> {
    return this.seqCall((out) => this.lib.run("seq_import", [this.ptr, buffer, buffer.length, out]))
  }
}
