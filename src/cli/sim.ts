/**
 * `gyre sim`: simulates scheduling policies on a scenario file and prints makespan, steps,
 * utilisation, time per role, switches, mean staleness and the lower bound (both parts), as a
 * table or (`--json`) one JSON object keyed by policy; `--svg FILE` draws each cell's role over
 * time. A bad scenario file fails with one line naming the field (exit 1).
 */
import { writeFile } from "node:fs/promises"
import { compare, NotApplicable, policyNames, type PolicyName } from "../sim/compare.ts"
import { comparisonJson, comparisonText } from "../sim/report.ts"
import { loadScenario, ScenarioError } from "../sim/scenario.ts"
import { timelineSvg } from "../sim/svg.ts"
import { parseFlags, type Command } from "./args.ts"

const flags = {
  scenario: { kind: "string", required: true, doc: "scenario file (JSON; format in ARCHITECTURE.md)" },
  policy: {
    kind: "string",
    default: "all",
    choices: [...policyNames, "all"],
    doc: "policy to simulate: elastic is Gyre's variant, elastic-published the published design; all runs every one"
  },
  json: { kind: "boolean", default: false, doc: "print one JSON object keyed by policy" },
  svg: { kind: "string", doc: "write each cell's role timeline to this SVG file" }
} as const

export const command: Command<typeof flags> = {
  summary: "simulate scheduling policies on a cluster scenario",
  flags,
  run: async (argv) => {
    const f = parseFlags("sim", flags, argv)
    const names: ReadonlyArray<PolicyName> = f.policy === "all" ? policyNames : [f.policy as PolicyName]
    let comparison
    try {
      const scenario = await loadScenario(f.scenario)
      comparison = compare(
        scenario,
        // `all` leaves out what the scenario cannot run (async on one cell).
        f.policy === "all" && scenario.cells < 2 ? names.filter((n) => n !== "async") : names,
        { timeline: f.svg !== undefined }
      )
    } catch (e) {
      if (e instanceof ScenarioError || e instanceof NotApplicable) {
        console.error(`gyre sim: ${e.message}`)
        return 1
      }
      throw e
    }
    if (f.svg !== undefined) {
      await writeFile(f.svg, timelineSvg(`${f.scenario}: role of each cell over time`, comparison.reports.map((r) => r.run)))
    }
    console.log(f.json ? JSON.stringify(comparisonJson(comparison)) : comparisonText(f.scenario, comparison))
    return 0
  }
}
