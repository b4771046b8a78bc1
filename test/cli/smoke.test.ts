/**
 * Every `gyre` command as a user starts it: `--help` prints that command's own flags and exits
 * 0; a bad flag is one line on stderr and exit code 2; so are an unknown command, a bad value
 * from the environment (`GYRE_<FLAG>`) and a bad `--config` file, each naming where the value
 * came from. Child processes of bin/gyre.js (a few at a time: each loads the TypeScript); the
 * per-command help text of the commands not started is checked in process.
 */
import { execFile } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { usage, type Command } from "../../src/cli/args.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"

const gyre = path.join(repoRoot, "bin", "gyre.js")

interface Result {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

const cli = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  new Promise<Result>((resolve) => {
    execFile(process.execPath, [gyre, ...args], { encoding: "utf8", env: { ...process.env, NATS_URL: "", ...env }, timeout: 90_000 }, (e, stdout, stderr) =>
      resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : null, stdout, stderr })
    )
  })

/** Runs `jobs` a few at a time. */
const pool = async <A, B>(items: ReadonlyArray<A>, f: (a: A) => Promise<B>, width = 4): Promise<Array<B>> => {
  const out: Array<B> = new Array(items.length)
  let next = 0
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) {
      const i = next++
      out[i] = await f(items[i]!)
    }
  }))
  return out
}

/** Each command with one flag of its own that `--help` must list. */
const commands: Record<string, string> = {
  node: "--devices",
  engine: "init",
  sim: "--scenario",
  demo: "--steps",
  serve: "--checkpoint",
  eval: "--tasks",
  train: "--policy",
  replay: "--from",
  runs: "--store",
  status: "--watch",
  report: "--out"
}

describe("gyre commands", () => {
  it("gyre --help lists every command; each command's --help lists its own flags", async () => {
    const [top, train, status] = await pool([["--help"], ["train", "--help"], ["status", "--help"]], (args) => cli(args))
    expect(top!.code).toBe(0)
    for (const name of Object.keys(commands)) expect(top!.stdout).toMatch(new RegExp(`^  ${name} `, "m"))
    // The configured commands name their environment variables and --config.
    expect(train!.code).toBe(0)
    expect(train!.stdout).toMatch(/--policy .*\[GYRE_POLICY\][\s\S]*--config/)
    expect(status!.code).toBe(0)
    expect(status!.stdout).toMatch(/^gyre status: [\s\S]*--watch/)
    // The rest in process (the same text main.ts prints for `gyre <name> --help`).
    for (const [name, flag] of Object.entries(commands)) {
      const { command } = (await import(`../../src/cli/${name}.ts`)) as { command: Command }
      expect(usage(name, command.summary, command.flags, command.configured), name).toContain(flag)
    }
  }, 300_000)

  it("answers a bad flag of any command, and an unknown command, with one line and exit code 2", async () => {
    const cases = [...Object.keys(commands).map((name) => [name, "--no-such-flag"]), ["no-such-command"], ["status"], ["train", "--steps", "many"], ["train", "--devices=-1"]]
    const results = await pool(cases, (args) => cli(args))
    cases.forEach((args, i) => {
      expect(results[i]!.code, args.join(" ")).toBe(2)
      expect(results[i]!.stderr.trim().split("\n"), args.join(" ")).toHaveLength(1)
    })
  }, 300_000)

  it("answers a flag that names something missing (a suite, a task, a checkpoint, a store, a module, an actor type) with one line naming the command and the flag, and exit code 2, before starting anything", async () => {
    const missing = path.join(os.tmpdir(), `gyre-missing-${process.pid}`)
    const cases = [
      [["train", "--suite", "no-such-suite"], /^gyre train: --suite no-such-suite: no .*suites\/no-such-suite\/suite\.json \(suites there: .*toy.*\)$/],
      [["demo", "--suite", "no-such-suite"], /^gyre demo: --suite no-such-suite: no /],
      [["demo", "--steps", "0"], /^gyre demo: --steps must be at least 1, got 0$/],
      [["eval", "--checkpoint", missing], /^gyre eval: --checkpoint .* has no config\.json$/],
      [["engine", "generate", "--checkpoint", missing, "--prompt", "hi"], /^gyre engine generate: --checkpoint .* has no config\.json$/],
      [["runs", "--store", missing], /^gyre runs: no store /],
      [["node", "--load", missing], /^gyre node: --load .*: no such file$/],
      [["node", "--spawn", "no-such-kind/x"], /^gyre node: --spawn no-such-kind\/x: no actor type 'no-such-kind' on this node/],
      [["train", "--heldout", "heldout-3,no-such-task"], /^gyre train: --heldout: 1 of 2 not in suite toy \(no-such-task\); it holds \d+ train, \d+ heldout$/],
      [["train", "--resume", `no-such-run-${process.pid}`], /^gyre train: --resume no-such-run-\d+: no store .*no-such-run-\d+ \(give --store/]
    ] as const
    const results = await pool(cases, ([args]) => cli(args))
    cases.forEach(([args, line], i) => {
      expect(results[i]!.code, args.join(" ")).toBe(2)
      expect(results[i]!.stderr.trim(), args.join(" ")).toMatch(line)
    })
    // Nothing was made where the missing run's store would be (the embedded server never started).
    expect(fs.existsSync(path.join(repoRoot, ".gyre", "runs", `no-such-run-${process.pid}`))).toBe(false)
  }, 300_000)

  it("gyre serve's --port and gyre node's --metrics-port: in use or out of range is one usage line before anything starts", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-serve-port-"))
    const checkpoint = path.join(dir, "ckpt")
    expect((await cli(["engine", "init", "--preset", "tiny", "--out", checkpoint])).code).toBe(0)
    const taken = net.createServer()
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve))
    const port = (taken.address() as net.AddressInfo).port
    try {
      const cases = [
        [["--port", String(port)], `gyre serve: --port ${port} on 127.0.0.1 is in use`],
        [["--port", "70000"], "gyre serve: --port must be 0 to 65535, got 70000"]
      ] as const
      const results = await pool(cases, ([args]) => cli(["serve", "--checkpoint", checkpoint, ...args]))
      cases.forEach(([args, line], i) => {
        expect(results[i]!.code, args.join(" ")).toBe(2)
        expect(results[i]!.stderr.trim(), args.join(" ")).toBe(line)
      })
      const metrics = await cli(["node", "--name", "port-check", "--metrics-port", String(port)])
      expect(metrics.code).toBe(2)
      expect(metrics.stderr.trim()).toBe(`gyre node: --metrics-port ${port} on 127.0.0.1 is in use`)
    } finally {
      taken.close()
    }
  }, 300_000)

  it("names the source of a bad configured value: the environment variable, the config file's field", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-config-"))
    const bad = path.join(dir, "bad.json")
    fs.writeFileSync(bad, JSON.stringify({ steps: "eight" }))
    const unknown = path.join(dir, "unknown.json")
    fs.writeFileSync(unknown, JSON.stringify({ stepz: 8 }))
    const [env, file, field] = await pool(
      [
        [["train"], { GYRE_STEPS: "eight" }],
        [["train", "--config", bad], {}],
        [["node", "--config", unknown], {}]
      ] as const,
      ([args, env]) => cli(args, env)
    )
    expect(env!.code).toBe(2)
    expect(env!.stderr.trim()).toBe("gyre train: --steps must be an integer, got 'eight' (from the environment, GYRE_STEPS)")
    expect(file!.code).toBe(2)
    expect(file!.stderr.trim()).toBe(`gyre train: field 'steps' in config file ${bad} must be an integer, got "eight"`)
    expect(field!.code).toBe(2)
    expect(field!.stderr.trim()).toMatch(new RegExp(`^gyre node: field 'stepz' in config file ${unknown} is not a flag`))
  }, 300_000)
})
