/**
 * How `gyre sim` and `bench:sim` print a comparison: a text table, or one JSON object keyed by
 * policy. Every policy's entry carries `lower_bound_s` with both of its parts.
 */
import type { Comparison, PolicyReport } from "./compare.ts"
import { inUnit, timeUnit } from "./units.ts"

const round = (x: number, digits: number) => Number(x.toFixed(digits))

/** One policy's entry of the `--json` object. */
export const reportJson = (c: Comparison, r: PolicyReport) => {
  const run = r.run
  return {
    makespan_s: round(run.makespan_s, 3),
    steps: run.steps,
    utilization: round(run.utilization, 4),
    time_per_role_s: {
      rollout: round(run.time_per_role_s.rollout, 3),
      training: round(run.time_per_role_s.training, 3),
      switching: round(run.time_per_role_s.switching, 3)
    },
    switches: run.switches,
    mean_staleness: round(run.mean_staleness, 4),
    lower_bound_s: round(c.bound.lower_bound_s, 3),
    lower_bound: { work_s: round(c.bound.work_s, 3), critical_path_s: round(c.bound.critical_path_s, 3) },
    makespan_over_lower_bound: round(run.makespan_s / c.bound.lower_bound_s, 4),
    events: run.events,
    ...(r.async ? { rollout_cells: r.async.rollout_cells, training_cells: r.async.training_cells, sweep: r.async.sweep } : {})
  }
}

export const comparisonJson = (c: Comparison): Record<string, ReturnType<typeof reportJson>> =>
  Object.fromEntries(c.reports.map((r) => [r.run.policy, reportJson(c, r)]))

/** `a / b` as "1.23x", or "-" when either is missing. */
export const speedup = (slow: number | undefined, fast: number | undefined): string =>
  slow === undefined || fast === undefined ? "-" : `${(slow / fast).toFixed(2)}x`

const table = (head: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)))
  const line = (cells: ReadonlyArray<string>) => cells.map((s, i) => (i === 0 ? s.padEnd(widths[i]!) : s.padStart(widths[i]!))).join("  ")
  return [line(head), ...rows.map(line)].join("\n")
}

/** The text report of `gyre sim`: times of cells in the unit the longest run reads best in (units.ts). */
export const comparisonText = (source: string, c: Comparison): string => {
  const s = c.scenario
  const b = c.bound
  const unit = timeUnit(Math.max(...c.reports.map((r) => r.run.makespan_s), b.lower_bound_s))
  const inSeconds = unit.name === "s"
  const rows = c.reports.map((r) => {
    const run = r.run
    const name = r.async ? `async (${r.async.rollout_cells} rollout + ${r.async.training_cells} training)` : run.policy
    return [
      name,
      run.makespan_s.toFixed(1),
      ...(inSeconds ? [] : [String(inUnit(run.makespan_s, unit))]),
      String(run.steps),
      run.utilization.toFixed(3),
      String(inUnit(run.time_per_role_s.rollout, unit)),
      String(inUnit(run.time_per_role_s.training, unit)),
      String(inUnit(run.time_per_role_s.switching, unit)),
      String(run.switches),
      run.mean_staleness.toFixed(2),
      (run.makespan_s / b.lower_bound_s).toFixed(3)
    ]
  })
  const u = unit.name
  const byName = new Map(c.reports.map((r) => [r.run.policy, r.run.makespan_s]))
  const lines = [
    `scenario ${source}: ${s.cells} cells x ${s.slots_per_cell} slots, ${s.steps} steps x ${s.executions_per_step} executions, max_staleness ${s.max_staleness}`,
    `lower_bound_s ${b.lower_bound_s.toFixed(1)}${inSeconds ? "" : ` (${inUnit(b.lower_bound_s, unit)} ${u})`} = max(work ${b.work_s.toFixed(1)}, critical_path ${b.critical_path_s.toFixed(1)})`,
    "",
    table(
      ["policy", "makespan_s", ...(inSeconds ? [] : [`makespan_${u}`]), "steps", "utilization", `rollout_cell_${u}`, `training_cell_${u}`, `switching_cell_${u}`, "switches", "mean_staleness", "vs_bound"],
      rows
    )
  ]
  const elastic = byName.get("elastic")
  if (elastic !== undefined && (byName.has("async") || byName.has("colocate"))) {
    lines.push(
      "",
      `elastic speedup: ${speedup(byName.get("async"), elastic)} vs async, ${speedup(byName.get("colocate"), elastic)} vs colocate` +
        (byName.has("elastic-published") ? `, ${speedup(byName.get("elastic-published"), elastic)} vs elastic-published` : "")
    )
  }
  return lines.join("\n")
}
