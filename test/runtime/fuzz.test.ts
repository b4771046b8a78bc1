/**
 * The subject fuzz (test/chaos/subject-fuzz.ts): every request schema of every actor subject,
 * seeded bad messages on a real nats-server. Short form in the suite (25 cases per schema);
 * `npm run test:chaos -- --long` runs 10,000 per schema (about 6 minutes on 2 cores).
 */
import { describe, expect, it } from "vitest"
import { chaosLong, recordFuzz } from "../chaos/helpers.ts"
import { fuzzSubjects } from "../chaos/subject-fuzz.ts"

const long = chaosLong()

describe("fuzzing every actor subject", () => {
  it("crashes nothing, answers every bad ask Rejected with a reason, dead-letters every bad message with a reason", async () => {
    const report = await fuzzSubjects({ casesPerSchema: long ? 10_000 : 25, seed: 7, limitS: long ? 6 * 3600 : 240 })
    console.log(JSON.stringify({ ...report, failures: report.failures.slice(0, 3) }))
    recordFuzz({ fuzzer: "subjects", cases: report.asks + report.tells, crashes: report.crashes })
    expect(report.failures).toEqual([])
    expect(report.schemas).toBeGreaterThanOrEqual(30)
    expect(report.crashes).toBe(0)
    expect(report.unanswered).toBe(0)
    expect(report.missingDeadLetters).toBe(0)
    expect(report.asks + report.tells).toBeGreaterThan(report.schemas * 20)
  }, long ? 6.5 * 3600_000 : 300_000)
})
