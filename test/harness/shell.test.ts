/**
 * The shell suite through the harness runner: a bash harness (curl, node for JSON) that
 * writes solution.sh from the model's reply, runs the visible tests, sends the results back,
 * and a scorer that runs the hidden tests.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { withSystem } from "../runtime/harness.ts"
import { request, runExecution, startChatServer, startRunner, suitesDir } from "./helpers.ts"

describe("shell suite", () => {
  it("a model that fixes its script after the test results scores 1; one that never does scores by the tests it passes", async () => {
    // First answer: a wrong script; after test feedback, a right one.
    const server = await startChatServer((messages) => {
      if (!messages[1]!.content.includes("sum")) return "```\nhead -n 1\n```" // dedupe: passes the cases with one distinct line
      return messages.length === 2 ? "Here it is:\n```bash\ncat\n```\n" : "```bash\nawk '{ s += $1 } END { print s + 0 }'\n```"
    })
    try {
      const result = await withSystem("shell", Effect.gen(function* () {
        yield* startRunner({ suitesDir, baseUrl: server.url })
        const sum = yield* runExecution(request({ suite: "shell", task: "sum" }))
        const sumCalls = server.requests.length
        const dedupe = yield* runExecution(request({ suite: "shell", task: "dedupe" }, { env: { SHELL_TURNS: "2" } }))
        return { sum, sumCalls, dedupe }
      }))
      expect(result.sum).toMatchObject({ task: "shell/sum", ended: "finished", evaluation: "scored", score: 1 })
      expect(result.sumCalls).toBe(2)
      const second = server.requests[1]!
      expect(second.messages.map((m) => m.role)).toEqual(["system", "user", "assistant", "user"])
      expect(second.messages[3]!.content).toMatch(/^Test results:\nfail 1: /)
      expect(second.body).toMatchObject({ model: "gyre", max_tokens: 256 })
      expect(result.dedupe).toMatchObject({ task: "shell/dedupe", evaluation: "scored" })
      expect(result.dedupe.score).toBeCloseTo(2 / 3, 10)
      expect(server.requests.length).toBe(2 + 2)
    } finally {
      await server.close()
    }
  })
})
