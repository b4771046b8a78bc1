/**
 * `gyre report RUN`: writes one self-contained HTML page about the run (src/replay/report.ts) to
 * `--out` (default `RUN.html` in the current directory) and prints its path. The run's log comes
 * from `--store DIR`, NATS_URL, or the run's own embedded store. `--compare RUN[=STORE],...` adds
 * other runs (`bench:elastic`'s policies, each in its own store) side by side.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect } from "effect"
import { buildReport, renderReport, type RunReport } from "../replay/report.ts"
import { parseRunFlags, type Command } from "./args.ts"
import { withRun } from "./runs.ts"

const flags = {
  run: { kind: "string", doc: "the run (or give it as the first word: gyre report RUN)" },
  store: { kind: "string", doc: "a stopped embedded store directory (default: NATS_URL, else .gyre/runs/RUN)" },
  out: { kind: "string", doc: "the HTML file to write, its directories made as needed (default RUN.html in the current directory)" },
  compare: { kind: "string", doc: "more runs side by side: RUN or RUN=STORE, comma-separated" }
} as const

/** Reads one run's report; the exit code when it cannot be read. */
const reportOf = (run: string, store: string | undefined) => {
  let report: RunReport | undefined
  return withRun("report", run, store, (system) => Effect.map(buildReport(system), (r) => ((report = r), 0))).pipe(Effect.map((code) => ({ code, report })))
}

export const command: Command<typeof flags> = {
  summary: "write one self-contained HTML report of a run (role timeline, scores, steps, staleness, dedup, KV hand-offs)",
  flags,
  run: async (argv) => {
    const { run, f } = parseRunFlags("report", flags, argv)
    const others = (f.compare ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "").map((item) => {
      const eq = item.indexOf("=")
      return eq < 0 ? { run: item, store: f.store } : { run: item.slice(0, eq), store: item.slice(eq + 1) }
    })
    const reports: Array<RunReport> = []
    for (const which of [{ run, store: f.store }, ...others]) {
      const { code, report } = await Effect.runPromise(reportOf(which.run, which.store))
      if (report === undefined) return code
      reports.push(report)
    }
    const out = path.resolve(f.out ?? `${run}.html`)
    fs.mkdirSync(path.dirname(out), { recursive: true })
    fs.writeFileSync(out, renderReport(reports))
    console.log(out)
    return 0
  }
}
