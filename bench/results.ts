/**
 * A benchmark's result, printed and kept: `printResult(bench, result)` prints the result as
 * the bench's last stdout line (one JSON object, the contract scripts read) and appends it to
 * `bench/results/<bench>.jsonl` with the machine it ran on and the code it ran:
 *
 *   {"bench": "engine", "at": "<ISO time>", "commit": "<git HEAD>", "dirty": false,
 *    "args": [...], "machine": {cpu, cores, llc_mib, memory_gib, mem_bw_gbs}, "result": {...}}
 *
 * `machine.mem_bw_gbs` is a copy probe (a 256 MiB typed-array copy, best of 3, read + write
 * bytes over time): a coarse figure that tells two hosts apart, not a STREAM result.
 * `dirty` says whether tracked files other than the logs differed from the commit.
 * Nothing is appended under a test runner (`VITEST` set) or with `GYRE_BENCH_RESULTS=0`, so
 * tests that start a bench leave the log alone. `npm run bench:results` prints the latest
 * entry of each log as a table (`bench/README.md` shows it).
 */
import { execFileSync } from "node:child_process"
import { appendFileSync, mkdirSync, readdirSync, readFileSync } from "node:fs"
import { availableParallelism, cpus, totalmem } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

export const resultsDir = join(dirname(fileURLToPath(import.meta.url)), "results")

export interface Machine {
  readonly cpu: string
  readonly cores: number
  readonly llc_mib: number | null
  readonly memory_gib: number
  readonly mem_bw_gbs: number
}

/** The largest CPU cache in bytes: Linux sysfs ("307200K"), else getconf's LEVEL<n>_CACHE_SIZE
 * (from CPUID, where a VM hides sysfs), or undefined where neither tells. */
export const lastLevelCacheBytes = (): number | undefined => {
  const dir = "/sys/devices/system/cpu/cpu0/cache"
  const unit = { "": 1, K: 2 ** 10, M: 2 ** 20, G: 2 ** 30 } as const
  try {
    const sizes = readdirSync(dir)
      .filter((d) => d.startsWith("index"))
      .map((d) => /^(\d+)([KMG]?)/.exec(readFileSync(`${dir}/${d}/size`, "utf8").trim()))
      .map((m) => (m === null ? 0 : Number(m[1]) * unit[m[2] as keyof typeof unit]))
    if (sizes.length > 0) return Math.max(...sizes)
  } catch {
    // no sysfs cache directory: ask getconf
  }
  const sizes = [...(run("getconf", ["-a"]) ?? "").matchAll(/^LEVEL\d_(?:D?CACHE)_SIZE\s+(\d+)/gm)].map((m) => Number(m[1]))
  return sizes.length > 0 && Math.max(...sizes) > 0 ? Math.max(...sizes) : undefined
}

/** Copy bandwidth in GB/s: a 256 MiB Float64Array copied whole, best of 3 (read + write bytes). */
const copyBandwidth = (): number => {
  const n = 32 * 2 ** 20
  const src = new Float64Array(n).fill(1)
  const dst = new Float64Array(n)
  let best = Infinity
  for (let r = 0; r < 3; r++) {
    const t0 = process.hrtime.bigint()
    dst.set(src)
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9)
  }
  return Number(((2 * 8 * n) / best / 1e9).toFixed(1))
}

export const machine = (): Machine => {
  const llc = lastLevelCacheBytes()
  return {
    cpu: cpus()[0]?.model.trim() ?? "unknown",
    cores: availableParallelism(),
    llc_mib: llc === undefined ? null : Math.round(llc / 2 ** 20),
    memory_gib: Math.round(totalmem() / 2 ** 30),
    mem_bw_gbs: copyBandwidth()
  }
}

/** A command's trimmed stdout, or null when it cannot run or fails. */
const run = (command: string, args: ReadonlyArray<string>): string | null => {
  try {
    return execFileSync(command, args, { cwd: dirname(resultsDir), encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim()
  } catch {
    return null
  }
}
const git = (args: ReadonlyArray<string>) => run("git", args)

const recording = (): boolean => process.env.VITEST === undefined && process.env.GYRE_BENCH_RESULTS !== "0"

/** Prints `result` as the last stdout line and appends it, with the machine and commit, to the bench's log. */
export const printResult = (bench: string, result: object): void => {
  const name = bench.replace(/^bench:/, "")
  console.log(JSON.stringify(result))
  if (!recording()) return
  const entry = {
    bench: name,
    at: new Date().toISOString(),
    commit: git(["rev-parse", "HEAD"]),
    dirty: (git(["status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"]) ?? "") !== "",
    args: process.argv.slice(2),
    machine: machine(),
    result
  }
  mkdirSync(resultsDir, { recursive: true })
  appendFileSync(join(resultsDir, `${name}.jsonl`), `${JSON.stringify(entry)}\n`)
  console.error(`${bench}: result appended to bench/results/${name}.jsonl`)
}
