/**
 * The short form of the subject fuzz (test/chaos/subject-fuzz.ts): every request schema of
 * every actor subject, a few dozen seeded bad messages each, on a real nats-server.
 */
import { describe, expect, it } from "vitest"
import { fuzzSubjects } from "../chaos/subject-fuzz.ts"

describe("fuzzing every actor subject", () => {
  it("crashes nothing, answers every bad ask Rejected with a reason, dead-letters every bad message with a reason", async () => {
    const report = await fuzzSubjects({ casesPerSchema: 25, seed: 7 })
    console.log(JSON.stringify({ ...report, failures: report.failures.slice(0, 3) }))
    expect(report.failures).toEqual([])
    expect(report.schemas).toBeGreaterThanOrEqual(30)
    expect(report.crashes).toBe(0)
    expect(report.unanswered).toBe(0)
    expect(report.missingDeadLetters).toBe(0)
    expect(report.asks + report.tells).toBeGreaterThan(report.schemas * 20)
  }, 300_000)
})
