/**
 * The README's "across machines" how-to, followed as written: `gyre train --listen` prints how
 * another machine joins (the file to copy and the command), and a second process does exactly
 * that: copies the file, runs the printed command (`gyre node --devices 1`), and its device
 * becomes the run's only cell. Across network namespaces when the test may make them (root,
 * `ip netns` + a veth pair): the joiner runs in its own namespace and sees none of the first
 * process's files (a tmpfs over them, in its own mount namespace), so it loads the run's
 * initial checkpoint from the run itself, and, being the core, writes its checkpoints on its
 * own side: the first process reads the final weights from the run's weights bucket. Else on
 * one machine, the server listening on every interface. The run is paced (`--pace`): the
 * joined device paces its work by the journaled configuration's pace.
 */
import { spawn, spawnSync, execFileSync, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as readline from "node:readline"
import { afterAll, describe, expect, it } from "vitest"
import { repoRoot } from "../../src/runtime/nats-server.ts"

const gyre = path.join(repoRoot, "bin", "gyre.js")
const ip = (...args: Array<string>) => spawnSync("ip", args, { encoding: "utf8" })

/** A network namespace joined to this one by a veth pair: `outer` here, `inner` there; null when it cannot be made. */
const makeNamespace = () => {
  if (process.getuid?.() !== 0 || spawnSync("ip", ["-V"]).status !== 0 || spawnSync("unshare", ["--version"]).status !== 0) return null
  const tag = `${process.pid % 100000}`
  const name = `gyre-join-${tag}`
  const subnet = `10.${200 + (process.pid % 50)}.${process.pid % 250}`
  const steps = [
    ["netns", "add", name],
    ["link", "add", `gj${tag}a`, "type", "veth", "peer", "name", `gj${tag}b`],
    ["link", "set", `gj${tag}b`, "netns", name],
    ["addr", "add", `${subnet}.1/30`, "dev", `gj${tag}a`],
    ["link", "set", `gj${tag}a`, "up"],
    ["-n", name, "addr", "add", `${subnet}.2/30`, "dev", `gj${tag}b`],
    ["-n", name, "link", "set", `gj${tag}b`, "up"],
    ["-n", name, "link", "set", "lo", "up"]
  ]
  const remove = () => {
    ip("netns", "del", name)
    ip("link", "del", `gj${tag}a`)
  }
  for (const step of steps) {
    if (ip(...step).status !== 0) {
      remove()
      return null
    }
  }
  return { name, outer: `${subnet}.1`, remove }
}

const children: Array<ChildProcess> = []
const cleanups: Array<() => void> = []
afterAll(() => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL")
  for (const f of cleanups) f()
})

/** Lines of a child's stream as they come, and a wait for the first one matching. */
const lines = (stream: NodeJS.ReadableStream) => {
  const seen: Array<string> = []
  const waiters: Array<() => void> = []
  readline.createInterface({ input: stream }).on("line", (l) => {
    seen.push(l)
    waiters.splice(0).forEach((w) => w())
  })
  const waitFor = (re: RegExp, timeoutMs: number) =>
    new Promise<RegExpExecArray>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no line matching ${re} within ${timeoutMs} ms:\n${seen.join("\n")}`)), timeoutMs)
      const check = () => {
        for (const l of seen) {
          const m = re.exec(l)
          if (m !== null) {
            clearTimeout(timer)
            return resolve(m)
          }
        }
        waiters.push(check)
      }
      check()
    })
  return { seen, waitFor }
}

describe("joining a run from another machine", () => {
  it("gyre train --listen prints the file to copy and the command; a gyre node run as printed joins as the run's device", async () => {
    const ns = makeNamespace()
    if (ns !== null) cleanups.push(ns.remove)
    const first = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-join-first-"))
    // The other machine's Gyre checkout: the same code, a working directory of its own.
    const other = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-join-other-"))
    fs.symlinkSync(path.join(repoRoot, "bin"), path.join(other, "bin"))
    execFileSync(process.execPath, [gyre, "engine", "init", "--preset", "tiny", "--seed", "5", "--out", path.join(first, "init")], { stdio: "ignore" })
    const run = `join-${process.pid}`
    const args = ["train", "--run", run, "--listen", `${ns?.outer ?? "0.0.0.0"}:0`, "--checkpoint", path.join(first, "init"), "--store", path.join(first, "store"), "--devices", "0"]
    const more = ["--steps", "2", "--executions-per-step", "4", "--group-size", "2", "--slots", "2", "--horizon", "3", "--env", "TOY_TOOL_MS=30,TOY_MAX_TOKENS=16", "--heldout", "heldout-0..heldout-1", "--pace", "decode=200,train=50000", "--json"]
    const train = spawn(process.execPath, [gyre, ...args, ...more], { cwd: first, env: { ...process.env, NATS_URL: "", GYRE_AUTH_DIR: path.join(first, "auth") }, stdio: ["ignore", "pipe", "pipe"] })
    children.push(train)
    const out = lines(train.stdout!)
    const err = lines(train.stderr!)
    // "close": its output read to the end, not only the process gone.
    const trainExit = new Promise<number | null>((resolve) => train.on("close", (code) => resolve(code)))

    // What the first machine says to do, done as it says.
    const [, from, to] = await err.waitFor(/^\s+copy (\S+) there as (\S+) /, 120_000)
    const [command] = await err.waitFor(/NATS_URL=\S+ .*node bin\/gyre\.js node --run \S+ --devices 1$/, 1000)
    expect(command).toContain(`--run ${run}`)
    expect(from).toBe(path.join(first, "auth", "device-node.nk"))
    fs.mkdirSync(path.dirname(path.join(other, to!)), { recursive: true })
    fs.copyFileSync(from!, path.join(other, to!))
    const shell = ["sh", "-c", command!.trim()]
    // In the namespace: the first machine's files hidden under a tmpfs of the joiner's own mount namespace.
    const argv = ns === null ? shell : ["ip", "netns", "exec", ns.name, "unshare", "-m", "--propagation", "private", "sh", "-c", `mount -t tmpfs tmpfs "$0" && exec "$@"`, first, ...shell]
    const joiner = spawn(argv[0]!, argv.slice(1), { cwd: other, env: { ...process.env, NATS_URL: "", NATS_NKEY: "" }, stdio: ["ignore", "pipe", "pipe"] })
    children.push(joiner)
    const joined = lines(joiner.stderr!)
    lines(joiner.stdout!)

    const code = await trainExit
    expect(code, err.seen.join("\n")).toBe(0)
    const summary = JSON.parse(out.seen.at(-1)!)
    expect(summary.steps).toBe(2)
    expect(summary.executions_lost).toBe(0)
    expect(summary.trained_twice).toBe(0)
    // The joiner's device was the run's only cell; the first process hosted none.
    expect(summary.devices).toHaveLength(1)
    expect(summary.devices[0]).toMatch(/^device\/.+\.cpu0$/)
    expect(summary.devices[0]).not.toMatch(/^device\/main\./)
    // --pace reached it through the journaled configuration: its engine steps and micro-batches were paced.
    expect(summary.pace).toBe("decode=200,train=50000")
    expect(summary.pace_by_device[summary.devices[0]].paced).toBeGreaterThan(0)
    expect(summary.paced_work).toBe(summary.pace_by_device[summary.devices[0]].paced)
    expect(summary.checkpoint).toBe(path.join(first, "store", "checkpoints", "step-2"))
    expect(fs.existsSync(path.join(summary.checkpoint, "model.safetensors"))).toBe(true)
    if (ns !== null) {
      // It could not see the first machine's checkpoint: it loaded the run's copy, and made its checkpoints on its own side.
      await joined.waitFor(/not on this machine: loaded the run's copy into/, 1000)
      expect(fs.existsSync(path.join(other, ".gyre", "joined", run, "initial", "model.safetensors"))).toBe(true)
      expect([...out.seen, ...err.seen].join("\n")).toMatch(/core wrote its checkpoint on another machine/)
    }
    joiner.kill("SIGTERM")
  }, 300_000)
})
