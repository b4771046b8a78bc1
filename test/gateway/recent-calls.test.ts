/** The gateway's window of recent calls: medians of each part of a call's time, and the window's bound. */
import { describe, expect, it } from "vitest"
import { recentCalls } from "../../src/gateway/recent-calls.ts"

const result = (workerMs: number, generated: number) => ({ computeMs: workerMs / 2, workerMs, promptTokens: 10, cachedTokens: 4, output: { length: generated } })

describe("recent calls", () => {
  it("splits the overhead into preparing, the way to the worker and back, and the record: medians and 99th percentiles", () => {
    const recent = recentCalls()
    // round trip = prepared + way to the worker and back + worker + record
    recent.add({ roundTripMs: 1 + 2 + 10 + 3, preparedMs: 1, recordMs: 3 }, result(10, 5))
    recent.add({ roundTripMs: 2 + 6 + 20 + 5, preparedMs: 2, recordMs: 5 }, result(20, 7))
    recent.add({ roundTripMs: 3 + 3 + 30 + 4, preparedMs: 3, recordMs: 4 }, result(30, 9))
    const f = recent.figures()
    expect(f).toMatchObject({ calls: 3, workerP50Ms: 20, computeP50Ms: 10, preparedP50Ms: 2, askP50Ms: 3, recordP50Ms: 4, overheadP50Ms: 10, promptTokens: 30, cachedTokens: 12, generatedTokens: 21 })
    // interpolated between the two largest of three: 98% of the way
    expect(f.overheadP99Ms).toBeCloseTo(10 + 0.98 * 3, 9) // overheads 6, 10, 13
    expect(f.preparedP99Ms).toBeCloseTo(2 + 0.98 * 1, 9)
    expect(f.askP99Ms).toBeCloseTo(3 + 0.98 * 3, 9) // ways 2, 3, 6
    expect(f.recordP99Ms).toBeCloseTo(4 + 0.98 * 1, 9)
  })

  it("keeps only the newest calls of a full window", () => {
    const recent = recentCalls(2)
    for (const ms of [100, 1, 3]) recent.add({ roundTripMs: ms, preparedMs: ms, recordMs: ms }, result(0, 1))
    expect(recent.figures()).toMatchObject({ calls: 2, preparedP50Ms: 2, recordP50Ms: 2, generatedTokens: 2 })
  })
})
