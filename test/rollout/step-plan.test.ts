/**
 * The batcher's pure parts without the engine: which tokens one step feeds (decoders first,
 * then prompt chunks within the budget, an anchoring prompt held one token short), and a
 * generation's samples ending it on a stop sequence or its token limit.
 */
import { Deferred } from "effect"
import { describe, expect, it } from "vitest"
import { acceptSample, endsWith, newGeneration, resultOf, type Generation } from "../../src/serving/generation.ts"
import { planStep } from "../../src/serving/step-plan.ts"

const generation = (prompt: ReadonlyArray<number>, opts: { maxTokens?: number; stop?: ReadonlyArray<ReadonlyArray<number>>; contextLimit?: number } = {}) =>
  newGeneration(
    {
      execution: "e",
      request: `r${prompt.length}`,
      base: null,
      prompt: Int32Array.from(prompt),
      sampling: { maxTokens: opts.maxTokens ?? 100, temperature: 1, topP: 1, seed: 5, stop: (opts.stop ?? []).map((s) => Int32Array.from(s)) }
    },
    Int32Array.from(prompt),
    opts.contextLimit ?? 1000,
    Deferred.makeUnsafe()
  )

/** Admitted with `cached` prompt tokens already in the cache. */
const admitted = (g: Generation, cached: number, anchor: boolean) => {
  g.cachedTokens = cached
  g.pending = g.prompt.subarray(cached)
  g.anchorPrompt = anchor
  return g
}

describe("a step's inputs (step-plan.ts)", () => {
  it("feeds every decoder one token, then prompt chunks in order within the prefill budget", () => {
    const decoder = admitted(generation([1, 2, 3]), 2, false) // one token left: decodes
    const long = admitted(generation(Array.from({ length: 50 }, (_, i) => i)), 0, false)
    const next = admitted(generation(Array.from({ length: 20 }, (_, i) => i)), 0, false)
    const plan = planStep([long, decoder, next], 30)
    expect(plan.map((p) => [p.g, p.take])).toEqual([
      [decoder, 1],
      [long, 30]
    ])
    long.appended = 30
    expect(planStep([long, decoder, next], 30).map((p) => p.take)).toEqual([1, 20, 10])
  })

  it("holds an anchoring prompt one token short, then feeds that token as a decode", () => {
    const g = admitted(generation([1, 2, 3, 4, 5]), 0, true)
    expect(planStep([g], 64).map((p) => p.take)).toEqual([4])
    g.appended = 4
    g.anchorPrompt = false
    expect(planStep([g], 64).map((p) => p.take)).toEqual([1])
    expect(planStep([g], 0).map((p) => p.take)).toEqual([1]) // decoders never wait for budget
  })
})

describe("a generation's samples (generation.ts)", () => {
  it("ends on a stop sequence that includes an output token, not on one inside the prompt", () => {
    expect(endsWith(Int32Array.of(7, 8), [], Int32Array.of(7, 8))).toBe(false)
    const g = generation([7, 8], { stop: [[8, 9]] })
    const streamed: Array<number> = []
    const withStream = { ...g, job: { ...g.job, onTokens: (s: { tokens: Int32Array }) => streamed.push(...s.tokens) } }
    expect(acceptSample(withStream, 9, -0.5, 4)).toBe("stop")
    expect(streamed).toEqual([9])
    expect(resultOf(withStream, "stop", "w").versions).toEqual(Int32Array.of(4))
  })

  it("ends at maxTokens, capped by the context left after the prompt", () => {
    const g = generation([1, 2, 3], { maxTokens: 10, contextLimit: 5 })
    expect(g.limit).toBe(2)
    expect(acceptSample(g, 4, -1, 0)).toBeUndefined()
    expect(acceptSample(g, 5, -1, 1)).toBe("length")
    const r = resultOf(g, "length", "w")
    expect([Array.from(r.output), Array.from(r.logprobs), Array.from(r.versions), r.promptTokens]).toEqual([[4, 5], [-1, -1], [0, 1], 3])
  })
})
