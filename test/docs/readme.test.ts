/**
 * The README's commands, as written, so the guide cannot drift from the code.
 *
 * Convention: a fenced ```sh block whose previous line is an HTML comment `<!-- tested -->`, or
 * `<!-- tested: "text", "more text" -->`, is run in CI. Those blocks run in README order, each
 * with `bash -e -o pipefail`, in one scratch checkout: a temporary directory whose `bin`, `src`,
 * `suites`, `native`, `examples`, `scenarios`, `node_modules` and `package.json` are links to
 * this repository, with Node's `--preserve-symlinks`, so the CLI takes the scratch directory as
 * its root and its `.gyre/` state (runs, stores, credentials) lands there, not in the checkout.
 * Each block must exit 0 and print every quoted text of its comment (stdout or stderr). Real
 * processes, a real nats-server as the CLI starts it; keep each block to seconds.
 *
 * Also: every flag of every `node bin/gyre.js <command> ...` the README mentions (fenced or
 * inline, tested or not) is one that command's `--help` lists (`--help` itself every command
 * takes), and every `npm run <script>` is a script of package.json.
 */
import { execFile } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { usage, type Command } from "../../src/cli/args.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"

const readme = fs.readFileSync(path.join(repoRoot, "README.md"), "utf8")

interface Block {
  readonly line: number
  readonly script: string
  readonly expects: ReadonlyArray<string>
}

/** The fenced shell blocks marked tested, with the texts their marker expects. */
const testedBlocks = (text: string): Array<Block> => {
  const blocks: Array<Block> = []
  const re = /<!-- tested(?::(.*?))? -->\n```(?:sh|bash)\n([\s\S]*?)```/g
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    const expects = [...(m[1] ?? "").matchAll(/"([^"]+)"/g)].map((q) => q[1]!)
    blocks.push({ line: text.slice(0, m.index).split("\n").length, script: m[2]!, expects })
  }
  return blocks
}

/** Every piece of shell the README shows: fenced lines (continuations joined) and inline code spans. */
const shellTexts = (text: string): Array<string> => {
  const out: Array<string> = []
  const prose = text.replace(/```[a-z]*\n([\s\S]*?)```/g, (_, body: string) => {
    out.push(...body.replace(/\\\n\s*/g, " ").split("\n"))
    return ""
  })
  for (const m of prose.replace(/\n/g, " ").matchAll(/`([^`]+)`/g)) out.push(m[1]!)
  return out
}

/** `node bin/gyre.js <command> ...` invocations: the command and the flags given to it. */
const invocations = (texts: ReadonlyArray<string>) =>
  texts.flatMap((t) =>
    t
      .replace(/\s#.*$/, "")
      .split(/&&|\|\||[|;]/)
      .flatMap((segment) => {
        const m = /node bin\/gyre\.js (\w+)(.*)$/.exec(segment)
        return m === null ? [] : [{ command: m[1]!, flags: [...m[2]!.matchAll(/(?:^|\s)(--[a-z][a-z0-9-]*)/g)].map((f) => f[1]!), text: segment.trim() }]
      })
  )

interface Result {
  readonly code: number | null
  readonly out: string
}

const run = (file: string, args: ReadonlyArray<string>, cwd: string, env: NodeJS.ProcessEnv, timeout: number) =>
  new Promise<Result>((resolve) => {
    execFile(file, args, { cwd, env, encoding: "utf8", timeout, maxBuffer: 64 * 1024 * 1024 }, (e, stdout, stderr) =>
      resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : null, out: `${stdout}\n${stderr}` })
    )
  })

/** The environment of a fresh shell: no NATS server or Gyre setting of the test's own. */
const cleanEnv = (): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = {}
  for (const [k, v] of Object.entries(process.env)) if (!/^(NATS_|GYRE_|VITEST|NODE_OPTIONS$)/.test(k)) env[k] = v
  return { ...env, NODE_OPTIONS: "--preserve-symlinks --preserve-symlinks-main" }
}

const LINKED = ["bin", "src", "suites", "native", "examples", "scenarios", "node_modules", "package.json", "tsconfig.json"]

describe("README", () => {
  let scratch = ""
  beforeAll(() => {
    scratch = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-readme-"))
    for (const name of LINKED) fs.symlinkSync(path.join(repoRoot, name), path.join(scratch, name))
  })
  afterAll(() => {
    if (scratch !== "") fs.rmSync(scratch, { recursive: true, force: true })
  })

  it("names only flags each command's --help lists, and only scripts package.json has", async () => {
    const calls = invocations(shellTexts(readme))
    const commands = [...new Set(calls.map((c) => c.command))]
    expect(commands).toEqual(expect.arrayContaining(["train", "serve", "node", "replay", "status", "report", "engine"]))
    const help = new Map<string, string>()
    for (const name of commands) {
      const file = path.join(repoRoot, "src", "cli", `${name}.ts`)
      expect(fs.existsSync(file), `gyre ${name} is not a command`).toBe(true)
      const { command } = (await import(file)) as { command: Command }
      help.set(name, usage(name, command.summary, command.flags, command.configured))
    }
    // The help read in process lists the flags the command prints (one child keeps that honest;
    // defaults such as the run id's time stamp differ between the two).
    const flagsOf = (text: string) => [...text.matchAll(/^\s+(--[a-z][a-z0-9-]*)/gm)].map((m) => m[1]!)
    const real = await run(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "train", "--help"], scratch, cleanEnv(), 60_000)
    expect(real.code).toBe(0)
    expect(flagsOf(real.out)).toEqual(flagsOf(help.get("train")!))
    expect(flagsOf(real.out).length).toBeGreaterThan(20)
    const unknown = calls.flatMap((c) => c.flags.filter((f) => f !== "--help" && !new RegExp(`^\\s+${f}(\\s|$)`, "m").test(help.get(c.command)!)).map((f) => `${f} in: ${c.text}`))
    expect(unknown).toEqual([])

    const scripts = Object.keys((JSON.parse(fs.readFileSync(path.join(repoRoot, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts)
    const named = shellTexts(readme).flatMap((t) => [...t.matchAll(/npm (?:run(?: -s)? ([\w:-]+)|(test))/g)].map((m) => m[1] ?? m[2]!))
    expect(named).toEqual(expect.arrayContaining(["demo", "test"]))
    expect(named.filter((s) => !scripts.includes(s))).toEqual([])
  }, 90_000)

  it("runs every tested block as written, in order, each exiting 0 with what it promises", async () => {
    const blocks = testedBlocks(readme)
    expect(blocks.length).toBeGreaterThanOrEqual(4)
    for (const block of blocks) {
      const r = await run("bash", ["-e", "-o", "pipefail", "-c", block.script], scratch, cleanEnv(), 180_000)
      const where = `README.md:${block.line}\n${block.script}\n--- output ---\n${r.out.slice(-4000)}`
      expect(r.code, where).toBe(0)
      for (const text of block.expects) expect(r.out, `${where}\n--- expected: ${text}`).toContain(text)
    }
    // What the blocks left behind is what the guide says they make.
    expect(fs.existsSync(path.join(scratch, ".gyre", "runs", "say-1", "report.html"))).toBe(true)
    expect(fs.readFileSync(path.join(scratch, "say-1.html"), "utf8")).toContain('id="chart-timeline"')
    expect(fs.existsSync(path.join(scratch, "my-model-bf16", "config.json"))).toBe(true)
  }, 300_000)
})
