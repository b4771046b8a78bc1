/**
 * The gateway's per-execution delta encoder: turns each full model call into a
 * `CallRecord` that repeats nothing the execution's earlier calls already sent.
 *
 * It keeps a token-only trajectory tree of the execution (4 bytes per unique token, no
 * copy per call), matches each call's `prompt ++ output` from the root, and references
 * the call that created the deepest matched node: that call's path runs through the match,
 * so `shared` is the longest common prefix with any earlier call. The prompt digest comes
 * from the tree's stored hash states plus the unmatched part of the prompt.
 */
import type { CallRecord, ModelCall } from "./record.ts"
import { ROOT_POSITION, TrajectoryTree } from "./tree.ts"

/** Which execution the records belong to. */
export interface ExecutionIds {
  readonly run: string
  readonly task: string
  readonly execution: string
}

export class DeltaEncoder {
  private readonly tree: TrajectoryTree

  constructor(
    readonly ids: ExecutionIds,
    options: { readonly chunkTokens?: number } = {}
  ) {
    this.tree = new TrajectoryTree({ ...options, training: false })
  }

  /** Unique tokens the encoder holds for this execution. */
  get uniqueTokens(): number {
    return this.tree.uniqueTokens
  }

  /** Encodes one call; calls must be encoded in the order the gateway completed them. */
  encode(call: ModelCall): CallRecord {
    const { prompt, output } = call
    if (call.logprobs.length !== output.length || call.versions.length !== output.length) {
      throw new RangeError(`call ${call.callId}: ${output.length} output tokens but ${call.logprobs.length} log-probs and ${call.versions.length} versions`)
    }
    const sequence = new Int32Array(prompt.length + output.length)
    sequence.set(prompt)
    sequence.set(output, prompt.length)
    const { position, matched } = this.tree.match(ROOT_POSITION, sequence, 0, sequence.length)
    const ref = matched > 0 ? { callId: this.tree.call(this.tree.creatorOf(position.node)).id, shared: matched } : null
    const promptHash = this.tree.promptDigest(position, sequence, matched, prompt.length)
    this.tree.insertCall(
      position,
      sequence,
      matched,
      sequence.length,
      { id: call.callId, role: call.role, promptLength: prompt.length, length: sequence.length },
      undefined
    )
    return {
      ...this.ids,
      callId: call.callId,
      role: call.role,
      ref,
      suffix: sequence.slice(matched),
      promptLength: prompt.length,
      outputLength: output.length,
      promptHash,
      logprobs: call.logprobs,
      versions: call.versions,
      sampling: call.sampling,
      finishReason: call.finishReason,
      startedAt: call.startedAt,
      finishedAt: call.finishedAt,
      toolCalls: call.toolCalls
    }
  }
}
