/**
 * Harness isolation: a harness sees none of its runner's environment and no NATS settings
 * (variables the runner holds are not passed on); where the runner is root it runs as nobody by
 * default (when nobody can reach the suites) and cannot read the runner's `/proc/<pid>/environ`,
 * which as root it could; a bad GYRE_HARNESS_UID is refused; a `RunExecution.env` naming a
 * loader or start-up variable is refused with `ForbiddenEnvironment` before anything runs.
 */
import { spawnSync } from "node:child_process"
import * as path from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { makeHarnessRunner } from "../../src/actors/harness-runner.ts"
import { address } from "../../src/runtime/names.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { request, runExecution, startRunner } from "../harness/helpers.ts"
import { withSystem } from "../runtime/harness.ts"

const suitesDir = path.join(repoRoot, "test", "security", "fixtures", "suites")
const isRoot = process.getuid?.() === 0

const seen = (detail: string) => JSON.parse(/\{.*\}/s.exec(detail)![0]) as { uid: number; parentReadable: boolean; parentSecret: boolean; ownSecret: boolean; natsVars: number }

/** Whether nobody (65534) can read the fixture suites (else the runner keeps root and warns). */
const nobodyReachesSuites = () =>
  spawnSync(process.execPath, ["-e", `require("fs").accessSync(${JSON.stringify(suitesDir)}, 5)`], { uid: 65534, gid: 65534, cwd: "/" }).status === 0

/** One snoop execution on a fresh runner configured with `runAs` (undefined: the default). */
const snoop = (run: string, runAs?: { uid: number; gid: number }) =>
  withSystem(run, Effect.gen(function* () {
    yield* startRunner({ suitesDir, ...(runAs !== undefined ? { runAs } : {}) })
    return yield* runExecution(request({ suite: "snoop", task: "peek" }))
  }))

describe("harness isolation", () => {
  it("gives a harness a clean environment; where the runner is root it runs as nobody by default and cannot read the runner's environment", { timeout: 120_000 }, async () => {
    process.env.GYRE_TEST_SECRET = "runner-secret"
    process.env.NATS_CREDS_TEST = "/nowhere"
    const byDefault = await snoop("isolation")
    expect(byDefault.evaluation).toBe("scored")
    const saw = seen(byDefault.detail)
    expect(saw.ownSecret).toBe(false)
    expect(saw.natsVars).toBe(0)
    if (!isRoot) return void expect(saw.uid).toBe(process.getuid!())
    const reachable = nobodyReachesSuites()
    expect(saw.uid).toBe(reachable ? 65534 : 0)
    if (reachable) {
      expect(saw.parentReadable).toBe(false)
      expect(saw.parentSecret).toBe(false)
    }
    // As root on purpose (GYRE_HARNESS_UID=0, or runAs), the runner's environment is readable: the reason for the default.
    const asRoot = await snoop("isolation-root", { uid: 0, gid: 0 })
    expect(asRoot.evaluation).toBe("scored")
    expect(seen(asRoot.detail).uid).toBe(0)
    expect(seen(asRoot.detail).parentReadable).toBe(true)
  })

  it("refuses a GYRE_HARNESS_UID that is not a user id, naming it", () => {
    const config = { suitesDir, gateway: address("gateway", "g"), capacity: 1, evaluationRetries: 0, workspaceRoot: "/tmp" }
    for (const [uid, gid] of [["nobody", undefined], ["-1", undefined], ["65534", "x"]] as const) {
      process.env.GYRE_HARNESS_UID = uid
      if (gid === undefined) delete process.env.GYRE_HARNESS_GID
      else process.env.GYRE_HARNESS_GID = gid
      try {
        expect(() => makeHarnessRunner(config), uid).toThrow(gid === undefined ? `GYRE_HARNESS_UID must be a user or group id (an integer >= 0), got '${uid}'` : `GYRE_HARNESS_GID must be a user or group id (an integer >= 0), got '${gid}'`)
      } finally {
        delete process.env.GYRE_HARNESS_UID
        delete process.env.GYRE_HARNESS_GID
      }
    }
  })

  it("refuses a RunExecution.env with loader or start-up variables (ForbiddenEnvironment), runs nothing", async () => {
    const result = await withSystem("forbidden", Effect.gen(function* () {
      const { log } = yield* startRunner({ suitesDir })
      const refused = []
      const envs: ReadonlyArray<Record<string, string>> = [{ BASH_ENV: "/tmp/x.sh" }, { LD_PRELOAD: "/tmp/x.so" }, { NODE_OPTIONS: "--require /tmp/x.js" }, { OK: "1", PATH: "/tmp" }, { ANTHROPIC_BASE_URL: "http://elsewhere" }]
      for (const env of envs) {
        refused.push(yield* runExecution(request({ suite: "snoop", task: "peek" }, { env })).pipe(Effect.flip))
      }
      return { refused, opened: log.opened.length }
    }))
    expect(result.refused.map((e) => e._tag)).toEqual(["ForbiddenEnvironment", "ForbiddenEnvironment", "ForbiddenEnvironment", "ForbiddenEnvironment", "ForbiddenEnvironment"])
    expect(result.refused.map((e) => (e._tag === "ForbiddenEnvironment" ? e.names : []))).toEqual([["BASH_ENV"], ["LD_PRELOAD"], ["NODE_OPTIONS"], ["PATH"], ["ANTHROPIC_BASE_URL"]])
    expect(result.opened).toBe(0)
  })
})
