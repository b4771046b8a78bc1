/**
 * `npm run bench:xlong`'s flags as a developer starts them: a bad value, or suite knobs the long
 * suite cannot run with, is one line on stderr naming the benchmark and the flag or variable,
 * exit 2 before anything runs; `--help` lists the flags with their defaults.
 */
import { execFile } from "node:child_process"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { repoRoot } from "../../src/runtime/nats-server.ts"

const bench = (args: ReadonlyArray<string>) =>
  new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    execFile(process.execPath, ["--import", "tsx", path.join(repoRoot, "bench", "xlong.ts"), ...args], { encoding: "utf8", cwd: repoRoot, timeout: 60_000 }, (e, stdout, stderr) =>
      resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : null, stdout, stderr })
    )
  })

const refused: ReadonlyArray<readonly [ReadonlyArray<string>, RegExp]> = [
  [["--scale", "0"], /^bench:xlong: LONG_SCALE=0: expected a positive number or a fraction such as 1\/16$/],
  [["--env", "LONG_WINDOW=5000"], /^bench:xlong: LONG_WINDOW=5000: too small for the system prompt \(8192\)/]
]

describe("bench:xlong flags", () => {
  it("refuses bad flags and suite knobs with one line, exit 2, before running; --help lists the flags", async () => {
    const [help, ...results] = await Promise.all([bench(["--help"]), ...refused.map(([args]) => bench(args))])
    refused.forEach(([args, line], i) => {
      const r = results[i]!
      expect({ args, code: r.code, stdout: r.stdout }).toEqual({ args, code: 2, stdout: "" })
      expect(r.stderr.trim().split("\n")).toHaveLength(1)
      expect(r.stderr.trim()).toMatch(line)
    })
    expect(help!.code).toBe(0)
    expect(help!.stdout.split("\n")[0]).toMatch(/^npm run bench:xlong --: /)
    for (const flag of ["--scale", "--executions", "--devices", "--env", "--micro-batch-tokens", "--kv-dtype", "--timeout-min"]) expect(help!.stdout).toContain(flag)
  }, 120_000)
})
