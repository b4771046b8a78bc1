/**
 * The per-execution delta decoder: builds the execution's trajectory tree from its
 * `CallRecord`s (live in the trainer, or from the recorded stream in replay).
 *
 * Records arrive out of order and more than once. A record is idempotent by call id; one
 * whose reference is not in the tree yet waits and is applied as soon as it is; one that
 * does not verify is rejected with a `CallRecordRejected` (and so is every record waiting
 * on it). A record is checked completely before the tree changes, so a rejection leaves
 * the tree as it was. The tree's content depends only on the set of applied records.
 */
import { CallRecordRejected, type CallRecord } from "./record.ts"
import { ROOT_POSITION, TrajectoryTree, type Position, type TreeOptions } from "./tree.ts"

/** What one `add` did. */
export interface AddReport {
  /** Calls inserted by this `add`: the record itself and any waiting records it released. */
  readonly added: ReadonlyArray<string>
  /** The record waits for its reference. */
  readonly waiting: boolean
  /** The call id was seen before (inserted, waiting or rejected); the record is ignored. */
  readonly duplicate: boolean
  /** Records refused by this `add`: the record itself and any waiting on it. */
  readonly rejected: ReadonlyArray<CallRecordRejected>
}

/** A call's metadata besides its tokens. */
export type CallInfo = Omit<CallRecord, "suffix" | "logprobs" | "versions" | "ref" | "promptHash">

export class DeltaDecoder {
  readonly tree: TrajectoryTree
  private readonly infoById = new Map<string, CallInfo>()
  private readonly waitersByRef = new Map<string, Array<CallRecord>>()
  private readonly waitingIds = new Set<string>()
  private readonly rejectedIds = new Set<string>()

  constructor(
    readonly execution: string,
    options: Omit<TreeOptions, "training"> = {}
  ) {
    this.tree = new TrajectoryTree({ ...options, training: true })
  }

  /** Applies one record (see the module comment). */
  add(record: CallRecord): AddReport {
    const added: Array<string> = []
    const rejected: Array<CallRecordRejected> = []
    if (record.execution !== this.execution) {
      rejected.push(this.rejection(record, "wrong-execution", `record of execution ${record.execution}`))
      return { added, waiting: false, duplicate: false, rejected }
    }
    const id = record.callId
    if (this.tree.callIndex(id) !== undefined || this.waitingIds.has(id) || this.rejectedIds.has(id)) {
      return { added, waiting: false, duplicate: true, rejected }
    }
    let waiting = false
    const queue = [record]
    while (queue.length > 0) {
      const next = queue.pop()!
      const outcome = this.apply(next)
      if (outcome === "waiting") {
        const waiters = this.waitersByRef.get(next.ref!.callId) ?? []
        waiters.push(next)
        this.waitersByRef.set(next.ref!.callId, waiters)
        this.waitingIds.add(next.callId)
        waiting = true
        continue
      }
      if (outcome === "inserted") added.push(next.callId)
      else {
        rejected.push(outcome)
        this.rejectedIds.add(next.callId)
      }
      const released = this.waitersByRef.get(next.callId) ?? []
      this.waitersByRef.delete(next.callId)
      for (const waiter of released) {
        this.waitingIds.delete(waiter.callId)
        queue.push(waiter)
      }
    }
    return { added, waiting, duplicate: false, rejected }
  }

  /** Records still waiting, with the call each waits for. */
  pending(): Array<{ readonly callId: string; readonly waitsFor: string }> {
    return [...this.waitersByRef.entries()].flatMap(([ref, records]) => records.map((r) => ({ callId: r.callId, waitsFor: ref })))
  }

  /** Metadata of an inserted call. */
  callInfo(callId: string): CallInfo | undefined {
    return this.infoById.get(callId)
  }

  private apply(record: CallRecord): "inserted" | "waiting" | CallRecordRejected {
    const { ref, suffix, promptLength, outputLength } = record
    const shared = ref?.shared ?? 0
    if (record.logprobs.length !== outputLength || record.versions.length !== outputLength) {
      return this.rejection(record, "malformed", `${outputLength} output tokens but ${record.logprobs.length} log-probs and ${record.versions.length} versions`)
    }
    if (record.versions.some((v) => v < 0)) return this.rejection(record, "malformed", "negative policy version")
    if (suffix.length !== promptLength + outputLength - shared) {
      return this.rejection(record, "malformed", `suffix of ${suffix.length} tokens after ${shared} shared, expected ${promptLength + outputLength - shared}`)
    }
    let at: Position = ROOT_POSITION
    if (ref !== null) {
      if (ref.callId === record.callId) return this.rejection(record, "malformed", "references itself")
      if (this.rejectedIds.has(ref.callId)) return this.rejection(record, "reference-rejected", `reference ${ref.callId} was rejected`)
      const refIndex = this.tree.callIndex(ref.callId)
      if (refIndex === undefined) return "waiting"
      const refLength = this.tree.call(refIndex).length
      if (shared > refLength) return this.rejection(record, "malformed", `shares ${shared} tokens of ${ref.callId}, which has ${refLength}`)
      at = this.tree.locate(refIndex, shared - 1)
    }
    const digest = this.tree.promptDigest(at, suffix, 0, promptLength)
    if (digest !== record.promptHash) {
      return this.rejection(record, "hash-mismatch", `reconstructed prompt of ${promptLength} tokens hashes to ${digest}, record says ${record.promptHash}`)
    }
    this.tree.insertCall(
      at,
      suffix,
      0,
      suffix.length,
      { id: record.callId, role: record.role, promptLength, length: promptLength + outputLength },
      { logprobs: record.logprobs, versions: record.versions }
    )
    const { suffix: _s, logprobs: _l, versions: _v, ref: _r, promptHash: _h, ...info } = record
    this.infoById.set(record.callId, info)
    return "inserted"
  }

  private rejection(record: CallRecord, reason: CallRecordRejected["reason"], detail: string): CallRecordRejected {
    return new CallRecordRejected({ execution: this.execution, callId: record.callId, reason, detail })
  }
}
