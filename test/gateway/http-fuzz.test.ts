/**
 * The short form of the HTTP fuzzing (`../chaos/http-fuzz.ts`): a few hundred seeded hostile
 * requests against a `gyre serve` child process; it never dies, never answers 500, answers
 * every complete request, and serves a valid call afterwards.
 */
import { describe, expect, it } from "vitest"
import { fuzzHttp } from "../chaos/http-fuzz.ts"

describe("HTTP fuzzing (short form)", () => {
  it("survives 400 hostile requests with a typed answer to each", async () => {
    const report = await fuzzHttp({ cases: 400, seed: Number(process.env.GYRE_FUZZ_SEED ?? 7) })
    expect(report.failures).toEqual([])
    expect(report.crashes).toBe(0)
    expect(report.internalErrors).toBe(0)
    expect(report.unanswered).toBe(0)
    expect(report.healthyAfter).toBe(true)
    // The cases reach every layer: parser errors, routing, auth, decoding, and real generations.
    for (const status of ["200", "400", "401", "404"]) expect(report.statuses[status] ?? 0).toBeGreaterThan(0)
  }, 240_000)
})
