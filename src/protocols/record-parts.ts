/**
 * Call records in bounded parts: the wire rule shared by the gateway's recorder (writer) and the
 * trajectory reader (`trajectories.ts`).
 *
 * A `CallRecord` is delta-encoded, so most are a few KiB; but a call whose new suffix is long (the
 * first call of an execution, or the first after a compaction, with a prompt of 60k tokens) would
 * be one message of hundreds of KiB, and one of a 300k-token prompt would exceed NATS's
 * `max_payload`. A record whose JSON is longer than `RECORD_PART_BYTES` therefore goes out as
 * consecutive messages on the same subject, each holding the next slice of the JSON bytes, with
 * headers `Gyre-Record-Part: <i>/<n>` (1-based) and `Gyre-Call: <callId>` and the message id
 * `<execution>.<callId>.<i>`; a record that fits is one message without them (message id
 * `<execution>.<callId>`). Readers join a call's parts in order of `i` once all `n` are there and
 * decode the whole as one record; parts of a record that never completed are reported, not
 * dropped.
 */
import type { MsgHdrs } from "@nats-io/transport-node"

/** Bytes of record JSON per message at most: every record message stays under 64 KiB with its headers. */
export const RECORD_PART_BYTES = 60 * 1024

export const PART_HEADER = "Gyre-Record-Part"
export const CALL_HEADER = "Gyre-Call"

/** Parts a record is cut into: its bytes in slices of at most `partBytes`, one when it fits. */
export const recordParts = (bytes: Uint8Array, partBytes = RECORD_PART_BYTES): Array<Uint8Array> =>
  bytes.length <= partBytes ? [bytes] : Array.from({ length: Math.ceil(bytes.length / partBytes) }, (_, i) => bytes.subarray(i * partBytes, (i + 1) * partBytes))

/** A part's place, from its headers: undefined for a whole record; a reason when the headers are malformed. */
export const partOf = (headers: MsgHdrs | undefined): { readonly call: string; readonly index: number; readonly count: number } | { readonly malformed: string } | undefined => {
  const part = headers?.get(PART_HEADER) ?? ""
  if (part === "") return undefined
  const m = /^(\d{1,9})\/(\d{1,9})$/.exec(part)
  const call = headers?.get(CALL_HEADER) ?? ""
  if (m === null || call === "") return { malformed: `record part header '${part}' of call '${call}': expected <i>/<n> and a ${CALL_HEADER} header` }
  const index = Number(m[1])
  const count = Number(m[2])
  if (count < 2 || index < 1 || index > count) return { malformed: `record part ${part} of call '${call}': out of range` }
  return { call, index, count }
}

/** Collects the parts of records as they are read, per call; gives a record's bytes once it is whole. */
export class RecordAssembler {
  private readonly pending = new Map<string, { readonly count: number; readonly parts: Array<Uint8Array | undefined>; got: number; readonly firstSeq: number }>()

  /** Adds part `index` of `count` of `call`; the whole record's bytes when this completes it, a reason when it contradicts earlier parts. */
  add(call: string, index: number, count: number, data: Uint8Array, seq: number): Uint8Array | { readonly malformed: string } | undefined {
    let entry = this.pending.get(call)
    if (entry === undefined) {
      entry = { count, parts: new Array<Uint8Array | undefined>(count), got: 0, firstSeq: seq }
      this.pending.set(call, entry)
    }
    if (entry.count !== count) return { malformed: `record part ${index}/${count} of call '${call}': its first part said ${entry.count} parts` }
    if (entry.parts[index - 1] !== undefined) return undefined // delivered again
    entry.parts[index - 1] = data
    if (++entry.got < count) return undefined
    this.pending.delete(call)
    const out = new Uint8Array(entry.parts.reduce((n, p) => n + p!.length, 0))
    let at = 0
    for (const p of entry.parts) {
      out.set(p!, at)
      at += p!.length
    }
    return out
  }

  /** Records whose parts never all arrived: where the first was, and what is missing. */
  incomplete(): Array<{ readonly seq: number; readonly reason: string }> {
    return [...this.pending].map(([call, e]) => ({
      seq: e.firstSeq,
      reason: `record of call '${call}': ${e.got} of ${e.count} parts on the stream (missing ${e.parts.flatMap((p, i) => (p === undefined ? [i + 1] : [])).join(", ")})`
    }))
  }

  /** Forgets every pending part (an execution started again). */
  clear(): void {
    this.pending.clear()
  }
}
