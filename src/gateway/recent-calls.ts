/**
 * The gateway's window of its most recent calls: round trip, engine compute and tokens per
 * call, summarised as medians (and the overhead's 99th percentile) and sums for `Status` (and `bench:rollout`).
 * The overhead is split in three: preparing the call before it is routed, the way to the worker
 * and back (the router, the ask's encoding and decoding, NATS both ways, the worker's host
 * outside its own time) and the record's publish; each with its median and 99th percentile, so a
 * tail can be told from the part it comes from.
 */
import type { RecentCalls } from "../protocols/gateway.ts"

/** Where a call's time outside the worker went, ms. */
export interface CallPhases {
  readonly roundTripMs: number
  readonly preparedMs: number
  readonly recordMs: number
}

interface Row extends CallPhases {
  readonly computeMs: number
  readonly workerMs: number
  readonly promptTokens: number
  readonly cachedTokens: number
  readonly generatedTokens: number
}

/** The q-quantile (0..1), linearly interpolated; 0 for none. */
const quantile = (xs: Array<number>, q: number): number => {
  if (xs.length === 0) return 0
  const s = xs.sort((a, b) => a - b)
  const at = (s.length - 1) * q
  const lo = Math.floor(at)
  return s[lo]! + (s[Math.min(lo + 1, s.length - 1)]! - s[lo]!) * (at - lo)
}
const median = (xs: Array<number>) => quantile(xs, 0.5)
const p99 = (xs: Array<number>) => quantile(xs, 0.99)
/** The way to the worker and back: the overhead less preparing and the record. */
const askMs = (r: Row) => r.roundTripMs - r.workerMs - r.preparedMs - r.recordMs

export const recentCalls = (capacity = 4096) => {
  const rows: Array<Row> = []
  let next = 0
  return {
    add: (
      phases: CallPhases,
      result: { readonly computeMs: number; readonly workerMs: number; readonly promptTokens: number; readonly cachedTokens: number; readonly output: { readonly length: number } }
    ) => {
      const row = { ...phases, computeMs: result.computeMs, workerMs: result.workerMs, promptTokens: result.promptTokens, cachedTokens: result.cachedTokens, generatedTokens: result.output.length }
      if (rows.length < capacity) rows.push(row)
      else rows[next] = row
      next = (next + 1) % capacity
    },
    figures: (): RecentCalls => ({
      calls: rows.length,
      roundTripP50Ms: median(rows.map((r) => r.roundTripMs)),
      computeP50Ms: median(rows.map((r) => r.computeMs)),
      workerP50Ms: median(rows.map((r) => r.workerMs)),
      overheadP50Ms: median(rows.map((r) => r.roundTripMs - r.workerMs)),
      overheadP99Ms: p99(rows.map((r) => r.roundTripMs - r.workerMs)),
      preparedP50Ms: median(rows.map((r) => r.preparedMs)),
      preparedP99Ms: p99(rows.map((r) => r.preparedMs)),
      askP50Ms: median(rows.map(askMs)),
      askP99Ms: p99(rows.map(askMs)),
      recordP50Ms: median(rows.map((r) => r.recordMs)),
      recordP99Ms: p99(rows.map((r) => r.recordMs)),
      promptTokens: rows.reduce((a, r) => a + r.promptTokens, 0),
      cachedTokens: rows.reduce((a, r) => a + r.cachedTokens, 0),
      generatedTokens: rows.reduce((a, r) => a + r.generatedTokens, 0)
    })
  }
}
