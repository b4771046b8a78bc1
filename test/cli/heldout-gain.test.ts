/**
 * The held-out gain that `gyre train` and `gyre demo` print beside their scores
 * (`heldout_gain`, `heldout_gain_ci95`): the mean of the per-task differences, paired by task
 * id, and the half-width of its 95% interval by Student's t, checked against values worked out
 * by hand and against scipy's t quantiles.
 */
import { describe, expect, it } from "vitest"
import { heldoutGain, tQuantile975 } from "../../src/cli/evaluate.ts"
import { gainText } from "../../src/cli/train.ts"

const scores = (pairs: Record<string, number>) => Object.entries(pairs).map(([task, score]) => ({ task, score }))

describe("held-out gain", () => {
  it("t(0.975, df) agrees with scipy.stats.t.ppf: exact for 1 and 2 degrees of freedom, within 0.004 under 10, 1e-5 from 10", () => {
    const scipy: Record<number, number> = { 1: 12.706205, 2: 4.302653, 3: 3.182446, 5: 2.570582, 10: 2.228139, 15: 2.131450, 63: 1.998341, 1000: 1.962339 }
    for (const [df, t] of Object.entries(scipy)) expect(Math.abs(tQuantile975(Number(df)) - t), `df ${df}`).toBeLessThan(Number(df) < 10 ? 4e-3 : 1e-5)
  })

  it("pairs the scores by task: mean difference and t x sd / sqrt(n)", () => {
    const before = scores({ "heldout-0": 0.5, "heldout-1": 0.6, "heldout-2": 0.7, "heldout-3": 0.8 })
    // Another order, and a task the first evaluation did not score (left out of the pairs).
    const after = scores({ "heldout-3": 1.0, "heldout-2": 0.7, "heldout-9": 0.1, "heldout-1": 0.8, "heldout-0": 0.6 })
    const g = heldoutGain(before, after)
    // Differences 0.1, 0.2, 0, 0.2: mean 0.125, sample variance 0.0275 / 3, t(0.975, 3) = 3.182446.
    expect(g.tasks).toBe(4)
    expect(g.gain).toBeCloseTo(0.125, 12)
    expect(g.ci95).toBeCloseTo(3.182446 * Math.sqrt(0.0275 / 3 / 4), 3)
  })

  it("the same shift on every task has no spread; unpaired, the same scores would", () => {
    const before = scores({ a: 0.2, b: 0.9, c: 0.5 })
    const after = scores({ a: 0.3, b: 1.0, c: 0.6 })
    const g = heldoutGain(before, after)
    expect(g.gain).toBeCloseTo(0.1, 12)
    expect(g.ci95).toBeCloseTo(0, 12)
  })

  it("gives no interval under two pairs, and says so in the text", () => {
    expect(heldoutGain(scores({ a: 0.5 }), scores({ a: 0.75 }))).toEqual({ tasks: 1, gain: 0.25, ci95: null })
    expect(heldoutGain([], [])).toEqual({ tasks: 0, gain: 0, ci95: null })
    expect(gainText(0.25, null)).toBe("+25.0")
    expect(gainText(0.1125, 0.024)).toBe("+11.3 +- 2.4")
    expect(gainText(-0.031, 0.02)).toBe("-3.1 +- 2.0")
  })
})
