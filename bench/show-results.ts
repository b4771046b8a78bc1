/**
 * `npm run bench:results`: the latest entry of each benchmark's log (`bench/results/*.jsonl`,
 * written by `results.ts`) as one Markdown table, with the machine and commit it came from;
 * `--write` also puts the table into `bench/README.md` between its result markers.
 */
import { readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { benchFlags } from "./flags.ts"
import { type Machine, resultsDir } from "./results.ts"

const f = benchFlags("bench:results", "the latest result of each benchmark as a Markdown table", {
  write: { kind: "boolean", doc: "also write the table into bench/README.md", default: false }
})

interface Entry {
  readonly bench: string
  readonly at: string
  readonly commit: string | null
  readonly dirty: boolean
  readonly args: ReadonlyArray<string>
  readonly machine: Machine
  readonly result: Record<string, unknown>
}

/** The figures each bench's row shows (dotted paths into its result); others show their first numbers. */
const headline: Record<string, ReadonlyArray<string>> = {
  engine: ["tiny.train_over_torch", "tiny.decode_over_torch", "small.decode_over_torch", "small.train_frac_of_sgemm", "small.decode_4096_over_bw_bound", "decode_4096_over_bw_bound_bf16", "bf16_decode_over_f32", "attention_pairs_per_s_4k", "attention_pairs_per_s_long"],
  runtime: ["ask_over_raw_p50", "ask_over_bare_p50", "tell_over_raw"],
  rollout: ["gateway_overhead_p50_ms", "gateway_overhead_p99_ms", "actor_over_direct", "prefill_tokens_saved_ratio"],
  elastic: ["elastic_over_async", "elastic_over_colocate", "reprefill_tokens", "switch_control_p50_ms", "sim_over_live"],
  sim: ["grid_scenarios", "grid_within_1_15", "grid_mean_over_bound"],
  tree: ["bytes_per_unique_token", "dedup_ratio", "build_1m_s", "max_record_bytes"],
  replay: ["events", "decode_per_s", "verify_per_s"],
  load: ["load_over_read", "load_s"],
  xlong: ["calls", "unique_tokens", "max_context_tokens", "record_max_bytes", "max_message_bytes", "cached_fraction", "trained_tokens", "peak_rss_mb", "wall_s"]
}

const at = (o: unknown, path: string): unknown => path.split(".").reduce<unknown>((x, k) => (x !== null && typeof x === "object" ? (x as Record<string, unknown>)[k] : undefined), o)

const figures = (e: Entry): string => {
  const paths = headline[e.bench] ?? Object.keys(e.result).filter((k) => typeof e.result[k] === "number").slice(0, 6)
  return paths
    .map((p) => [p, at(e.result, p)] as const)
    .filter(([, v]) => v !== undefined && v !== null)
    .map(([p, v]) => `${p} ${typeof v === "object" ? JSON.stringify(v) : String(v)}`)
    .join("; ")
}

const latest = (file: string): Entry | undefined => {
  const lines = readFileSync(join(resultsDir, file), "utf8").trim().split("\n").filter((l) => l !== "")
  return lines.length === 0 ? undefined : (JSON.parse(lines.at(-1)!) as Entry)
}

const machineCell = (m: Machine) => `${m.cpu}, ${m.cores} cores, LLC ${m.llc_mib ?? "?"} MiB, copy ${m.mem_bw_gbs} GB/s`

const table = (): string => {
  let files: Array<string> = []
  try {
    files = readdirSync(resultsDir).filter((n) => n.endsWith(".jsonl")).sort()
  } catch {
    // no results yet
  }
  const rows = files.flatMap((n) => latest(n) ?? [])
  return [
    "| bench | figures | machine | when, commit | command |",
    "| --- | --- | --- | --- | --- |",
    ...rows.map((e) => `| ${e.bench} | ${figures(e)} | ${machineCell(e.machine)} | ${e.at.slice(0, 10)}, ${(e.commit ?? "?").slice(0, 8)}${e.dirty ? " (dirty)" : ""} | \`npm run bench:${e.bench}${e.args.length > 0 ? ` -- ${e.args.join(" ")}` : ""}\` |`)
  ].join("\n")
}

const text = table()
console.log(text)
if (f.write) {
  const readme = join(resultsDir, "..", "README.md")
  const start = "<!-- results:start -->"
  const end = "<!-- results:end -->"
  const old = readFileSync(readme, "utf8")
  const i = old.indexOf(start)
  const j = old.indexOf(end)
  if (i < 0 || j < i) throw new Error(`bench/README.md lacks the markers ${start} ... ${end}`)
  writeFileSync(readme, `${old.slice(0, i + start.length)}\n${text}\n${old.slice(j)}`)
  console.error("bench:results: bench/README.md updated")
}
