/**
 * Harness isolation: a harness sees none of its runner's environment and no NATS settings
 * (variables the runner holds are not passed on);
 * run under another uid (the runner is root here) it cannot read the runner's
 * `/proc/<pid>/environ` either; a `RunExecution.env` naming a loader or start-up variable is
 * refused with `ForbiddenEnvironment` before anything runs.
 */
import * as path from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { request, runExecution, startRunner } from "../harness/helpers.ts"
import { withSystem } from "../runtime/harness.ts"

const suitesDir = path.join(repoRoot, "test", "security", "fixtures", "suites")
const isRoot = process.getuid?.() === 0

const seen = (detail: string) => JSON.parse(/\{.*\}/s.exec(detail)![0]) as { uid: number; parentReadable: boolean; parentSecret: boolean; ownSecret: boolean; natsVars: number }

describe("harness isolation", () => {
  it("gives a harness a clean environment; under another uid it cannot read the runner's environment", { timeout: 120_000 }, async () => {
    process.env.GYRE_TEST_SECRET = "runner-secret"
    process.env.NATS_CREDS_TEST = "/nowhere"
    const result = await withSystem("isolation", Effect.gen(function* () {
      yield* startRunner({ suitesDir })
      const same = yield* runExecution(request({ suite: "snoop", task: "peek" }))
      return { same }
    }))
    const asNobody = isRoot
      ? await withSystem("isolation-uid", Effect.gen(function* () {
          yield* startRunner({ suitesDir, runAs: { uid: 65534, gid: 65534 } })
          return yield* runExecution(request({ suite: "snoop", task: "peek" }))
        }))
      : undefined
    const same = seen(result.same.detail)
    expect(result.same.evaluation).toBe("scored")
    expect(same.ownSecret).toBe(false)
    expect(same.natsVars).toBe(0)
    if (asNobody !== undefined) {
      // Same uid as a root runner, the parent's environment is readable: the reason for runAs.
      expect(same.parentReadable).toBe(true)
      const other = seen(asNobody.detail)
      expect(asNobody.evaluation).toBe("scored")
      expect(other.uid).toBe(65534)
      expect(other.parentReadable).toBe(false)
      expect(other.parentSecret).toBe(false)
      expect(other.ownSecret).toBe(false)
    }
  })

  it("refuses a RunExecution.env with loader or start-up variables (ForbiddenEnvironment), runs nothing", async () => {
    const result = await withSystem("forbidden", Effect.gen(function* () {
      const { log } = yield* startRunner({ suitesDir })
      const refused = []
      const envs: ReadonlyArray<Record<string, string>> = [{ BASH_ENV: "/tmp/x.sh" }, { LD_PRELOAD: "/tmp/x.so" }, { NODE_OPTIONS: "--require /tmp/x.js" }, { OK: "1", PATH: "/tmp" }]
      for (const env of envs) {
        refused.push(yield* runExecution(request({ suite: "snoop", task: "peek" }, { env })).pipe(Effect.flip))
      }
      return { refused, opened: log.opened.length }
    }))
    expect(result.refused.map((e) => e._tag)).toEqual(["ForbiddenEnvironment", "ForbiddenEnvironment", "ForbiddenEnvironment", "ForbiddenEnvironment"])
    expect(result.refused.map((e) => (e._tag === "ForbiddenEnvironment" ? e.names : []))).toEqual([["BASH_ENV"], ["LD_PRELOAD"], ["NODE_OPTIONS"], ["PATH"]])
    expect(result.opened).toBe(0)
  })
})
