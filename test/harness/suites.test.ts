/** Loading suites: the shipped ones, series of tasks, and a clear error naming the field for each kind of mistake. */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { listSuites, loadSuite, parseSuite, type Suite } from "../../src/harness/suites.ts"
import { fixtureSuites, suitesDir, tempDir } from "./helpers.ts"

const valid = {
  description: "d",
  harness: { command: ["./h.sh"], timeoutMs: 1000 },
  scorer: { command: ["node", "{suite}/s.mjs"], timeoutMs: 1000 },
  tasks: [{ id: "a", split: "train" }]
}

/** A suite directory holding h.sh and a template folder `tpl`. */
const dir = tempDir("suite")
fs.writeFileSync(path.join(dir, "h.sh"), "#!/bin/sh\n", { mode: 0o755 })
fs.mkdirSync(path.join(dir, "tpl"))

const parse = (doc: unknown) => Effect.runSyncExit(parseSuite("s", dir, typeof doc === "string" ? doc : JSON.stringify(doc)))
const errorOf = (doc: unknown): string => {
  const exit = parse(doc)
  if (Exit.isSuccess(exit)) throw new Error("expected a SuiteError")
  const error = (exit.cause.reasons[0] as any).error
  expect(error._tag).toBe("SuiteError")
  return error.message
}

describe("suites", () => {
  it("loads the shipped suites: toy (train and held-out series) and shell (a template per task)", async () => {
    expect(listSuites(suitesDir)).toEqual(expect.arrayContaining(["shell", "toy"]))
    const toy: Suite = await Effect.runPromise(loadSuite(suitesDir, "toy"))
    expect(toy.tasks.filter((t) => t.split === "train").length).toBeGreaterThanOrEqual(100)
    expect(toy.tasks.filter((t) => t.split === "heldout").length).toBeGreaterThanOrEqual(50)
    expect(toy.task("heldout-0")).toMatchObject({ split: "heldout", template: undefined })
    expect(toy.harness.command).toEqual(["node", path.join(suitesDir, "toy", "harness.mjs")])
    const shell = await Effect.runPromise(loadSuite(suitesDir, "shell"))
    expect(shell.harness.command).toEqual([path.join(suitesDir, "shell", "harness.sh")])
    for (const t of shell.tasks) expect(fs.existsSync(path.join(t.template!, "TASK.md"))).toBe(true)
    expect(new Set(shell.tasks.map((t) => t.split))).toEqual(new Set(["train", "heldout"]))
  })

  it("expands a series with {n} in ids and environment, over the suite's environment", async () => {
    const s = await Effect.runPromise(loadSuite(fixtureSuites, "behaviours"))
    expect(s.tasks.map((t) => t.id)).toEqual(["t", "series-7", "series-8", "series-9"])
    expect(s.task("series-9")!.env).toEqual({ SUITE_LEVEL: "from-suite", NUMBER: "9" })
    expect(s.task("t")!.env).toEqual({ SUITE_LEVEL: "from-suite", TASK_LEVEL: "from-task" })
    expect(s.task("t")!.template).toBe(path.join(fixtureSuites, "behaviours", "template"))
    const relative = await Effect.runPromise(parseSuite("s", dir, JSON.stringify({ ...valid, tasks: [{ id: "x", split: "train", template: "tpl" }] })))
    expect(relative.task("x")!.template).toBe(path.join(dir, "tpl"))
    expect(relative.scorer.command).toEqual(["node", `${dir}/s.mjs`])
  })

  it("names the field of every mistake", () => {
    expect(errorOf("{ nope")).toMatch(/suite\.json: not JSON/)
    expect(errorOf({ ...valid, harness: { command: ["./h.sh"], timeoutMs: "10" } })).toMatch(/harness\.timeoutMs: Expected number/)
    expect(errorOf({ ...valid, scorer: undefined })).toMatch(/scorer: Missing key/)
    expect(errorOf({ ...valid, tasks: [{ id: "a", split: "test" }] })).toMatch(/tasks\[0\]\.split: Expected "train" \| "heldout"/)
    expect(errorOf({ ...valid, tasks: [{ id: "a", split: "train", timeout: 3 }] })).toMatch(/tasks\[0\]\.timeout: .*excess/)
    expect(errorOf({ ...valid, harness: { command: [], timeoutMs: 1 } })).toMatch(/harness\.command: /)
    expect(errorOf({ ...valid, tasks: [] })).toMatch(/tasks: /)
    expect(errorOf({ ...valid, tasks: [{ id: "a", split: "train" }, { id: "a", split: "heldout" }] })).toMatch(/tasks\[1\]\.id: duplicate task id 'a' \(also tasks\[0\]\)/)
    expect(errorOf({ ...valid, tasks: [{ id: "a", split: "train", count: 3 }] })).toMatch(/tasks\[0\]\.id: a series \(count\) needs \{n\}/)
    expect(errorOf({ ...valid, tasks: [{ id: "a", split: "train", start: 3 }] })).toMatch(/tasks\[0\]\.start: start without count/)
    expect(errorOf({ ...valid, tasks: [{ id: "a/b", split: "train" }] })).toMatch(/tasks\[0\]\.id: task id 'a\/b' must match/)
    expect(errorOf({ ...valid, tasks: [{ id: "a", split: "train", template: "missing" }] })).toMatch(/tasks\[0\]\.template: template directory missing does not exist/)
    expect(errorOf({ ...valid, template: "missing" })).toMatch(/^.*suite\.json: template: /)
    expect(errorOf({ ...valid, harness: { command: ["./nope.sh"], timeoutMs: 1 } })).toMatch(/harness\.command\[0\]: program \.\/nope\.sh does not exist/)
    expect(errorOf({ ...valid, env: { A: 1 } })).toMatch(/env\.A: Expected string/)
  })

  it("rejects suite names that are not plain directory names, and missing suites", () => {
    const bad = Effect.runSyncExit(loadSuite(suitesDir, "../toy"))
    expect(Exit.isFailure(bad) && String((bad.cause.reasons[0] as any).error.message)).toMatch(/suite name '\.\.\/toy' must match/)
    const missing = Effect.runSyncExit(loadSuite(suitesDir, "absent"))
    expect(Exit.isFailure(missing) && String((missing.cause.reasons[0] as any).error.message)).toMatch(/absent\/suite\.json: cannot read/)
  })
})
