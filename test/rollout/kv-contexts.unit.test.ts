/**
 * `ExecutionContexts.bestPrefix` (kv-contexts.ts): the cached context sharing the longest
 * common prefix with a prompt, and that length - a whole context, or a part of one (a prefix
 * fork) no shorter than `minPart`.
 */
import { describe, expect, it } from "vitest"
import { ExecutionContexts } from "../../src/serving/kv-contexts.ts"

const tokens = (...parts: ReadonlyArray<ReadonlyArray<number>>) => Int32Array.from(parts.flat())
const run = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i)
const system = run(40, 1000)

const contextsOf = (list: ReadonlyArray<readonly [string, Int32Array]>) => {
  const contexts = new ExecutionContexts(8)
  list.forEach(([request, t], seq) => contexts.add({ execution: "x", request, seq, tokens: t, kvLength: t.length - 1 }))
  return contexts
}

describe("ExecutionContexts.bestPrefix", () => {
  it("finds the context sharing the longest prefix, whole or in part, bounded by the prompt less its last token", () => {
    const head = tokens(system, run(10, 1))
    const contexts = contextsOf([
      ["head", head], // K/V of system + 9 tokens: a whole prefix of the prompts below
      ["long", tokens(system, run(30, 1), run(20, 500))] // shares system + 30 tokens with `compacted` below
    ])
    const compacted = tokens(system, run(30, 1), [7, 7, 7])
    expect(contexts.bestPrefix("x", compacted)).toMatchObject({ length: system.length + 30, whole: false, context: { request: "long" } })
    // the other execution has nothing
    expect(contexts.bestPrefix("y", compacted)).toBeUndefined()
    // a prompt inside a context: all but its last token
    const inside = tokens(system, run(20, 1))
    expect(contexts.bestPrefix("x", inside)).toMatchObject({ length: inside.length - 1, whole: false, context: { request: "long" } })
    // a part shorter than minPart loses to a shorter whole context
    const branch = tokens(system, run(12, 1), [9, 9])
    expect(contexts.bestPrefix("x", branch, 1)).toMatchObject({ length: system.length + 12, context: { request: "long" } })
    expect(contexts.bestPrefix("x", branch, 64)).toMatchObject({ length: head.length - 1, whole: true, context: { request: "head" } })
    // nothing shared
    expect(contexts.bestPrefix("x", tokens([1, 2, 3]))).toBeUndefined()
  })

  it("prefers a whole context on a tie", () => {
    const prompt = tokens(system, [5, 6, 7])
    const contexts = contextsOf([["longer", tokens(system, [5, 6, 7, 8, 9])], ["anchor", tokens(system, [5, 6, 7])]])
    expect(contexts.bestPrefix("x", prompt)).toMatchObject({ length: prompt.length - 1, whole: true, context: { request: "anchor" } })
  })
})
