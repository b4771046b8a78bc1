/**
 * `npm run bench:sim`: the simulator's speed at cluster scale and the bundled scenarios'
 * comparison. Not a test: it prints a table and, last, one JSON line.
 *
 * 1. The bundled scenarios: elastic over async (best split) and over colocate, each policy's
 *    utilisation, and elastic's makespan over the lower bound (goal <= 1.15).
 * 2. Speed: `scenarios/scale-512x64.json` (512 cells x 64 slots, 48 steps x 8192 executions)
 *    under each fixed policy, timed on one core (the simulator is single-threaded) after the
 *    runs above warmed the JIT: wall and CPU seconds, events delivered to the policy per CPU
 *    second (target >= 1M/s, each run < 10 s).
 * 3. With `--grid` (about a minute): elastic and elastic-published over lower_bound_s on a grid
 *    of 108 scenarios (tail sigma x training rate x staleness x batch size over slots), the
 *    evidence behind the Gyre variant (ARCHITECTURE.md): a markdown table of elastic's ratios
 *    (scenarios/README.md), then the summary (`grid_scenarios`, `grid_within_1_15`,
 *    `grid_mean_over_bound`, the comparison with elastic-published).
 */
import { fixedPolicies } from "../src/policy/index.ts"
import { compare } from "../src/sim/compare.ts"
import { lowerBound } from "../src/sim/bound.ts"
import { executionsOf, loadScenario, parseScenario } from "../src/sim/scenario.ts"
import { simulate } from "../src/sim/simulate.ts"
import { benchFlags } from "./flags.ts"
import { printResult } from "./results.ts"

const flags = benchFlags("bench:sim", "the simulator's speed at cluster scale, the bundled scenarios and (--grid) the policy grid", {
  grid: { kind: "boolean", doc: "also elastic over the lower bound on the 108-scenario grid (about a minute)", default: false }
})

const scale = "scenarios/scale-512x64.json"
const bundled = ["scenarios/published-2.4t.json", "scenarios/published-122b.json", "scenarios/heavy-tail.json"]

const timed = <T>(f: () => T) => {
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  const value = f()
  const wall_s = (performance.now() - t0) / 1000
  const cpu = process.cpuUsage(cpu0)
  return { value, wall_s, cpu_s: (cpu.user + cpu.system) / 1e6 }
}

const pad = (rows: ReadonlyArray<ReadonlyArray<string>>) => {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
  return rows.map((r) => r.map((s, i) => (i === 0 ? s.padEnd(widths[i]!) : s.padStart(widths[i]!))).join("  ")).join("\n")
}

// ---- bundled scenarios (run first: they also warm the JIT up for the timed runs) -------------
const table: Record<string, Record<string, unknown>> = {}
const rows: Array<Array<string>> = [
  ["scenario", "elastic/async", "elastic/colocate", "util colocate", "util async", "util elastic", "util published", "elastic/bound", "published/bound", "async split"]
]
for (const file of bundled) {
  const c = compare(await loadScenario(file), ["colocate", "async", "elastic", "elastic-published"])
  const by = Object.fromEntries(c.reports.map((r) => [r.run.policy, r]))
  const m = (name: string) => by[name]!.run.makespan_s
  const u = (name: string) => by[name]!.run.utilization
  const name = file.replace(/^scenarios\//, "").replace(/\.json$/, "")
  const split = by.async!.async!
  table[name] = {
    elastic_over_async: m("async") / m("elastic"),
    elastic_over_colocate: m("colocate") / m("elastic"),
    utilization: { colocate: u("colocate"), async: u("async"), elastic: u("elastic"), "elastic-published": u("elastic-published") },
    elastic_makespan_over_lower_bound: m("elastic") / c.bound.lower_bound_s,
    published_makespan_over_lower_bound: m("elastic-published") / c.bound.lower_bound_s,
    elastic_makespan_h: m("elastic") / 3600,
    async_rollout_cells: split.rollout_cells
  }
  rows.push([
    name,
    `${(m("async") / m("elastic")).toFixed(2)}x`,
    `${(m("colocate") / m("elastic")).toFixed(2)}x`,
    u("colocate").toFixed(3),
    u("async").toFixed(3),
    u("elastic").toFixed(3),
    u("elastic-published").toFixed(3),
    (m("elastic") / c.bound.lower_bound_s).toFixed(3),
    (m("elastic-published") / c.bound.lower_bound_s).toFixed(3),
    `${split.rollout_cells}+${split.training_cells}`
  ])
}

// ---- speed ------------------------------------------------------------------------------------
const big = await loadScenario(scale)
const bigExecutions = executionsOf(big)
const speed: Record<string, { wall_s: number; cpu_s: number; events: number; events_per_s: number; makespan_s: number }> = {}
for (const name of ["elastic", "elastic-published", "colocate"]) {
  const { value: run, wall_s, cpu_s } = timed(() => simulate(big, bigExecutions, fixedPolicies[name]!))
  speed[name] = { wall_s, cpu_s, events: run.events, events_per_s: run.events / cpu_s, makespan_s: run.makespan_s }
}
console.log(`speed: ${scale} (${big.cells} cells x ${big.slots_per_cell} slots, ${big.steps} steps x ${big.executions_per_step} executions), one core`)
console.log(
  pad([
    ["policy", "wall_s", "cpu_s", "events", "events/s (cpu)", "makespan_h"],
    ...Object.entries(speed).map(([name, s]) => [
      name,
      s.wall_s.toFixed(2),
      s.cpu_s.toFixed(2),
      String(s.events),
      `${(s.events_per_s / 1e6).toFixed(2)}M`,
      (s.makespan_s / 3600).toFixed(1)
    ])
  ])
)

console.log("\nbundled scenarios (elastic = Gyre's variant, published = elastic-published; async at its best split)")
console.log(pad(rows))

// ---- grid (optional) -------------------------------------------------------------------------
const grid = flags.grid ? gridRun() : undefined

function gridRun() {
  const over: Record<string, Array<number>> = { elastic: [], "elastic-published": [] }
  const sigmas = [0.5, 1, 1.5, 2]
  const rates = [50_000, 200_000, 1_000_000]
  const stalenesses = [0, 1, 2]
  const fills = [0.5, 1, 2]
  for (const sigma of sigmas)
    for (const rate of rates)
      for (const max_staleness of stalenesses)
        for (const fill of fills) {
          const s = parseScenario({
            cells: 8,
            slots_per_cell: 64,
            train_tokens_per_s_per_cell: rate,
            switch_to_train_s: 8.52,
            switch_to_rollout_s: 3.46,
            weight_sync_s: 20,
            steps: 24,
            executions_per_step: 512 * fill,
            max_staleness,
            generator: { kind: "lognormal", median_s: 1800, sigma, max_s: 14400, tokens_per_s: 240, seed: 3 }
          })
          const e = executionsOf(s)
          const bound = lowerBound(s, e).lower_bound_s
          for (const name of Object.keys(over)) over[name]!.push(simulate(s, e, fixedPolicies[name]!).makespan_s / bound)
        }
  const g = over.elastic!
  const p = over["elastic-published"]!
  const mean = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b) / xs.length
  const summary = {
    grid_scenarios: g.length,
    grid_within_1_15: g.filter((x) => x <= 1.15).length,
    grid_mean_over_bound: mean(g),
    elastic_better: g.filter((x, i) => x < p[i]! - 0.005).length,
    elastic_worse: g.filter((x, i) => x > p[i]! + 0.005).length,
    mean_over_bound: { elastic: mean(g), "elastic-published": mean(p) },
    above_1_15: { elastic: g.filter((x) => x > 1.15).length, "elastic-published": p.filter((x) => x > 1.15).length },
    worst_over_bound: { elastic: Math.max(...g), "elastic-published": Math.max(...p) }
  }
  // One row per (sigma, rate), one column per (staleness, batch / slots): elastic / bound.
  const columns = stalenesses.flatMap((st) => fills.map((f) => `s${st} x${f}`))
  const table = [`| sigma | rate/cell | ${columns.join(" | ")} |`, `| --- | --- |${" --- |".repeat(columns.length)}`]
  sigmas.forEach((sigma, a) =>
    rates.forEach((rate, b) => {
      const at = (a * rates.length + b) * columns.length
      table.push(`| ${sigma} | ${rate / 1000}k | ${g.slice(at, at + columns.length).map((x) => x.toFixed(3)).join(" | ")} |`)
    })
  )
  console.log("\ngrid: elastic makespan / lower_bound (columns: max_staleness s, batch = x slots)")
  console.log(table.join("\n"))
  console.log("\ngrid: makespan / lower_bound over 108 scenarios (better/worse: by more than 0.005)")
  console.log(JSON.stringify(summary))
  return summary
}

const round = (x: unknown): unknown =>
  typeof x === "number" ? Number(x.toPrecision(6)) : x && typeof x === "object" ? Object.fromEntries(Object.entries(x).map(([k, v]) => [k, round(v)])) : x
printResult("bench:sim", {
  bench: "sim",
  scale: { scenario: scale, cells: big.cells, slots_per_cell: big.slots_per_cell, steps: big.steps, executions_per_step: big.executions_per_step, ...(round(speed) as object) },
  scenarios: round(table),
  // the grid's figures at the top level of the last line, under the names issue 14 gives them
  ...(grid ? (round(grid) as object) : {})
})
