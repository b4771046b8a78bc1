/**
 * Scenario files: errors name the field in one line; executions are taken in order, cycled;
 * the generator is deterministic; `gyre sim` prints the table, the JSON and the SVG.
 */
import { execFile } from "node:child_process"
import { mkdtemp, readFile, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { describe, expect, it } from "vitest"
import { executionsOf, parseScenario, ScenarioError } from "../../src/sim/scenario.ts"
import { inUnit, timeUnit } from "../../src/sim/units.ts"
import { tinyScenario } from "./fixtures.ts"

const valid = { ...tinyScenario, executions_per_step: 3, executions: [{ duration_s: 10, tokens: 100 }, { duration_s: 20, tokens: 200 }] }

const { executions: _, ...generated } = valid

const errorOf = (input: unknown): string => {
  try {
    parseScenario(input, "s.json")
  } catch (e) {
    expect(e).toBeInstanceOf(ScenarioError)
    return (e as Error).message
  }
  throw new Error("no error")
}

describe("scenario", () => {
  it("names the bad field in one line", () => {
    const cases: Array<[unknown, string]> = [
      [{ ...valid, cells: 0 }, "s.json: field cells: Expected a value greater than or equal to 1, got 0"],
      [{ ...valid, slots_per_cell: 1.5 }, "s.json: field slots_per_cell: Expected an integer, got 1.5"],
      [{ ...valid, executions: [{ duration_s: 10, tokens: -1 }] }, "s.json: field executions[0].tokens: Expected a value greater than or equal to 0, got -1"],
      [{ ...valid, executions: [{ duration_s: 0, tokens: 1 }] }, "s.json: field executions[0].duration_s: Expected a value greater than 0, got 0"],
      [{ ...valid, slot_per_cell: 3 }, "s.json: field slot_per_cell: unknown field"],
      [(({ steps: _steps, ...rest }) => rest)(valid), "s.json: field steps: is required"],
      [{ ...valid, weight_sync_s: "20" }, `s.json: field weight_sync_s: Expected number, got "20"`],
      [{ ...valid, step_update_s: -1 }, "s.json: field step_update_s: Expected a value greater than or equal to 0, got -1"],
      [generated, "s.json: field executions: give exactly one of executions or generator"],
      [
        { ...valid, generator: { kind: "lognormal", median_s: 10, sigma: 1, max_s: 100, tokens_per_s: 1, seed: 1 } },
        "s.json: field executions: give exactly one of executions or generator"
      ],
      [
        { ...generated, generator: { kind: "pareto", median_s: 10, sigma: 1, max_s: 100, tokens_per_s: 1, seed: 1 } },
        `s.json: field generator.kind: Expected "lognormal", got "pareto"`
      ]
    ]
    for (const [input, message] of cases) {
      const got = errorOf(input)
      expect(got).toBe(message)
      expect(got).not.toContain("\n")
    }
  })

  it("takes executions in file order, cycled, in batches", () => {
    const e = executionsOf(parseScenario(valid))
    expect([...e.durations]).toEqual([10, 20, 10, 20, 10, 20])
    expect([...e.tokens]).toEqual([100, 200, 100, 200, 100, 200])
  })

  it("generates the same lognormal executions from the same seed, capped at max_s", () => {
    const g = { kind: "lognormal", median_s: 100, sigma: 1.5, max_s: 1000, tokens_per_s: 2, seed: 5 }
    const s = parseScenario({ ...generated, steps: 50, executions_per_step: 100, generator: g })
    const a = executionsOf(s)
    const b = executionsOf(s)
    expect([...a.durations]).toEqual([...b.durations])
    expect(Math.max(...a.durations)).toBe(1000)
    const sorted = [...a.durations].sort((x, y) => x - y)
    expect(sorted[sorted.length / 2]).toBeGreaterThan(80)
    expect(sorted[sorted.length / 2]).toBeLessThan(125)
    a.durations.forEach((d, i) => expect(a.tokens[i]).toBe(Math.round(d * 2)))
    const other = executionsOf({ ...s, generator: { ...s.generator!, seed: 6 } })
    expect([...other.durations]).not.toEqual([...a.durations])
  })
})

describe("gyre sim", () => {
  const run = promisify(execFile)
  const gyre = (args: ReadonlyArray<string>) => run("node", ["bin/gyre.js", "sim", ...args], { cwd: join(import.meta.dirname, "../..") })

  it("prints one JSON object keyed by policy, and an SVG timeline", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gyre-sim-"))
    const file = join(dir, "s.json")
    await writeFile(file, JSON.stringify(valid))
    const svg = join(dir, "t.svg")
    const { stdout } = await gyre(["--scenario", file, "--policy", "all", "--json", "--svg", svg])
    const out = JSON.parse(stdout)
    expect(Object.keys(out)).toEqual(["colocate", "async", "elastic", "elastic-published"])
    for (const r of Object.values<any>(out)) {
      expect(r.steps).toBe(2)
      expect(r.makespan_s).toBeGreaterThanOrEqual(r.lower_bound_s)
      expect(r.lower_bound_s).toBe(Math.max(r.lower_bound.work_s, r.lower_bound.critical_path_s))
      expect(Object.keys(r.time_per_role_s)).toEqual(["rollout", "training", "switching"])
    }
    expect(out.async.rollout_cells + out.async.training_cells).toBe(2)
    const picture = await readFile(svg, "utf8")
    expect(picture.startsWith("<svg")).toBe(true)
    expect(picture).toContain("elastic-published")
    // a run of a few minutes reads in minutes (its axis ticked every half minute), not hours
    const longest = Math.max(...Object.values<any>(out).map((r) => r.makespan_s))
    expect(longest).toBeGreaterThan(180)
    expect(longest).toBeLessThan(210)
    for (const tick of ["0", "0.5", "1", "3"]) expect(picture).toContain(`>${tick} min</text>`)
    expect(picture).not.toMatch(/ h<\/text>/)
    // the text table reads in the same unit: cell-minutes, each policy's makespan in minutes too
    const text = (await gyre(["--scenario", file, "--policy", "all"])).stdout
    const lines = text.split("\n")
    const head = lines.find((l) => l.startsWith("policy"))!.trim().split(/\s+/)
    expect(head).toEqual(["policy", "makespan_s", "makespan_min", "steps", "utilization", "rollout_cell_min", "training_cell_min", "switching_cell_min", "switches", "mean_staleness", "vs_bound"])
    const elastic = lines.find((l) => l.startsWith("elastic "))!.trim().split(/\s+/)
    expect(Number(elastic[2])).toBeCloseTo(out.elastic.makespan_s / 60, 1)
    expect(Number(elastic[5])).toBeCloseTo(out.elastic.time_per_role_s.rollout / 60, 1)
  })

  it("reads a span in seconds, minutes or hours, ticked by 1, 2 or 5 x 10^k", () => {
    expect(timeUnit(90)).toEqual({ name: "s", seconds: 1, step: 10 })
    expect(timeUnit(600)).toEqual({ name: "min", seconds: 60, step: 1 })
    expect(timeUnit(7199)).toMatchObject({ name: "min", step: 20 })
    expect(timeUnit(36_000)).toEqual({ name: "h", seconds: 3600, step: 1 })
    expect(timeUnit(1_000_000)).toMatchObject({ name: "h", step: 50 })
    expect(inUnit(72.34, timeUnit(122.9))).toBe(1.21)
    for (const span of [0.5, 7, 119, 121, 3000, 7300, 5e5, 5e7]) {
      const u = timeUnit(span)
      const ticks = Math.floor(span / u.seconds / u.step) + 1
      expect(ticks, String(span)).toBeGreaterThanOrEqual(4)
      expect(ticks, String(span)).toBeLessThanOrEqual(11)
    }
  })

  it("fails with one line naming the field and exit code 1", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gyre-sim-"))
    const file = join(dir, "bad.json")
    await writeFile(file, JSON.stringify({ ...valid, max_staleness: -1 }))
    const failure = await gyre(["--scenario", file]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    )
    expect(failure?.code).toBe(1)
    expect(failure?.stderr).toBe(`gyre sim: ${file}: field max_staleness: Expected a value greater than or equal to 0, got -1\n`)
  })
})
