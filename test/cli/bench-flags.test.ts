/**
 * The benchmarks' flags (`bench/flags.ts`) as a developer starts them: a bad value, an unknown
 * flag or an unknown preset or policy is one line on stderr naming the benchmark and the flag,
 * and exit code 2 before anything runs; `--help` lists the flags and exits 0. Child processes
 * of the bench scripts, two at a time.
 */
import { execFile } from "node:child_process"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { repoRoot } from "../../src/runtime/nats-server.ts"

interface Result {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

const bench = (script: string, args: ReadonlyArray<string>) =>
  new Promise<Result>((resolve) => {
    execFile(process.execPath, ["--import", "tsx", path.join(repoRoot, "bench", script), ...args], { encoding: "utf8", cwd: repoRoot, timeout: 60_000 }, (e, stdout, stderr) =>
      resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : null, stdout, stderr })
    )
  })

const refused: ReadonlyArray<readonly [string, ReadonlyArray<string>, RegExp]> = [
  ["elastic.ts", ["--rounds", "0"], /^bench:elastic: --rounds must be at least 1, got 0$/],
  ["elastic.ts", ["--policies", "elastic,fifo"], /^bench:elastic: --policies takes a comma-separated list of .*elastic.*, got 'elastic,fifo'$/],
  ["elastic.ts", ["--stepz", "3"], /^bench:elastic: unknown flag --stepz \(known: --steps /],
  ["elastic.ts", ["--paced", "--pace", "decode=fast"], /^bench:elastic: --pace decode=fast: decode=fast: the rate must be a number > 0 \(per second\)$/],
  ["engine.ts", ["--presets", "tiny,huge"], /^bench:engine: --presets takes a comma-separated list of tiny, small, tiny-long, got 'tiny,huge'$/],
  ["engine.ts", ["--threads", "two"], /^bench:engine: --threads must be an integer, got 'two'$/],
  ["replay.ts", ["--steps"], /^bench:replay: --steps needs a value$/],
  ["load.ts", ["--gb", "-1"], /^bench:load: --gb must be above 0, got -1$/],
  ["sim.ts", ["--grid=maybe"], /^bench:sim: --grid must be true or false, got 'maybe'$/],
  ["runtime.ts", ["--tracer", "otlp"], /^bench:runtime: --tracer must be one of memory\|none, got 'otlp'$/],
  ["rollout.ts", ["--gateway-calls", "0"], /^bench:rollout: --gateway-calls must be at least 1, got 0$/]
]

describe("benchmark flags", () => {
  it("refuse a bad flag with one line naming the benchmark and the flag, exit 2, before running", async () => {
    const results: Array<Result> = []
    for (let i = 0; i < refused.length; i += 2) results.push(...(await Promise.all(refused.slice(i, i + 2).map(([script, args]) => bench(script, args)))))
    refused.forEach(([script, args, line], i) => {
      const r = results[i]!
      expect({ script, args, code: r.code, stdout: r.stdout }).toEqual({ script, args, code: 2, stdout: "" })
      expect(r.stderr.trim().split("\n")).toHaveLength(1)
      expect(r.stderr.trim()).toMatch(line)
    })
  }, 120_000)

  it("--help lists a benchmark's flags with their defaults and exits 0", async () => {
    const r = await bench("elastic.ts", ["--help"])
    expect(r.code).toBe(0)
    expect(r.stdout.split("\n")[0]).toMatch(/^npm run bench:elastic --: /)
    for (const flag of ["--steps", "--devices", "--policies", "--rounds", "--checkpoint", "--executions-per-step", "--slots"]) expect(r.stdout).toContain(flag)
    expect(r.stdout).toContain("(default elastic,async,colocate)")
  }, 60_000)
})
