/**
 * The short form of the HTTP fuzzing (`../chaos/http-fuzz.ts`): a few hundred seeded hostile
 * requests against a `gyre serve` child process; it never dies, never answers 500, answers
 * every complete request in its path's error shape (OpenAI's, Anthropic's on the Messages
 * routes), and serves a valid call afterwards.
 */
import { describe, expect, it } from "vitest"
import { chaosLong, recordFuzz } from "../chaos/helpers.ts"
import { fuzzHttp } from "../chaos/http-fuzz.ts"

/** `npm run test:chaos -- --long`: 10,000 cases. */
const long = chaosLong()

describe("HTTP fuzzing (short form)", () => {
  it(`survives ${long ? "10,000" : "400"} hostile requests with a typed answer to each`, async () => {
    const report = await fuzzHttp({ cases: long ? 10_000 : 400, seed: Number(process.env.GYRE_FUZZ_SEED ?? 7) })
    recordFuzz({ fuzzer: "http", cases: report.cases, crashes: report.crashes })
    expect(report.failures).toEqual([])
    expect(report.crashes).toBe(0)
    expect(report.internalErrors).toBe(0)
    expect(report.unanswered).toBe(0)
    expect(report.wrongShape).toBe(0)
    expect(report.healthyAfter).toBe(true)
    // The cases reach every layer: parser errors, routing, auth, decoding, and real generations, on every API.
    for (const status of ["200", "400", "401", "404"]) expect(report.statuses[status] ?? 0).toBeGreaterThan(0)
    for (const [route, statuses] of Object.entries(report.byRoute)) for (const status of ["200", "400", "401"]) expect([route, status, statuses[status] ?? 0]).not.toEqual([route, status, 0])
  }, long ? 6 * 3600_000 : 240_000)
})
