/**
 * Entry point of the `gyre` command: picks the sub-command and runs it.
 *
 * Each sub-command lives in its own module under `src/cli/` and exports a `Command`
 * (`summary`, `flags`, `run`). Modules are imported lazily so `gyre sim` never loads the
 * native engine and `gyre engine` never connects to NATS. Exit codes (README, ARCHITECTURE):
 * 0 done; 1 the command failed (a run that cannot be read, a check that failed, an error: its
 * message on one line); 2 a usage error (a bad flag or value: one line naming it). `gyre node`
 * and `gyre serve` drain on SIGINT / SIGTERM and then exit with 0. A read command whose stdout
 * is closed (`gyre replay RUN | head`) exits with 0 at once.
 */
import { errorLine } from "../common/error-line.ts"
import { UsageError, usage, type Command } from "./args.ts"

const commands: Record<string, () => Promise<{ readonly command: Command }>> = {
  node: () => import("./node.ts"),
  engine: () => import("./engine.ts"),
  sim: () => import("./sim.ts"),
  demo: () => import("./demo.ts"),
  serve: () => import("./serve.ts"),
  eval: () => import("./eval.ts"),
  train: () => import("./train.ts"),
  replay: () => import("./replay.ts"),
  auth: () => import("./auth.ts"),
  runs: () => import("./runs.ts"),
  status: () => import("./status.ts"),
  report: () => import("./report.ts")
}

const printHelp = async () => {
  const lines = ["usage: gyre <command> [--flag value ...]", "", "commands:"]
  for (const [name, load] of Object.entries(commands)) {
    const { command } = await load()
    lines.push(`  ${name.padEnd(10)} ${command.summary}`)
  }
  lines.push("", "gyre <command> --help lists a command's flags.")
  console.log(lines.join("\n"))
}

const main = async (argv: ReadonlyArray<string>): Promise<number> => {
  const [name, ...rest] = argv
  if (name === undefined || name === "--help" || name === "help") {
    await printHelp()
    return name === undefined ? 2 : 0
  }
  const load = commands[name]
  if (load === undefined) throw new UsageError(`gyre: unknown command '${name}' (known: ${Object.keys(commands).join(", ")})`)
  const { command } = await load()
  if (rest.includes("--help")) {
    console.log(usage(name, command.summary, command.flags, command.configured))
    return 0
  }
  return command.run(rest)
}

/** Commands whose output is all they do: when its reader goes away (`gyre replay ... | head`), they stop, with 0. */
const readers = new Set(["replay", "runs", "status", "report", "sim"])

// A closed stdout is not an error of the command's: a reader stops as on Ctrl-C (its scopes
// closed: a `--store` copy removed), or at once when it has no such handler; a host (`node`,
// `serve`, `train`, `demo`) and a writer (`engine`, `eval`) keep running with the output dropped.
let readerGone = false
process.stdout.on("error", (e: NodeJS.ErrnoException) => {
  if (e.code !== "EPIPE" && e.code !== "ERR_STREAM_DESTROYED") throw e
  if (readerGone || !readers.has(process.argv[2] ?? "")) return
  readerGone = true
  if (process.listenerCount("SIGINT") > 0) process.emit("SIGINT")
  else process.exit(0)
})

/**
 * A run that has ended (`train`, `demo`, `eval`: their summary printed, their scopes closed) exits
 * even when something it started left a handle open (a timer, a socket of a connection that
 * reconnected): after `LINGER_MS` the process exits with the command's code, naming the kinds of
 * handles still open on stderr. Other commands (readers writing to a slow pipe) end as Node does.
 */
const LINGER_MS = 5_000
const runs = new Set(["train", "demo", "eval"])
const exitIfLingering = () => {
  if (!runs.has(process.argv[2] ?? "")) return
  setTimeout(() => {
    const open = process.getActiveResourcesInfo().filter((r) => r !== "Timeout" && r !== "TTYWrap")
    process.stderr.write(`gyre ${process.argv[2]}: ended, exiting with handles still open (${open.join(", ") || "timers"})\n`)
    process.exit()
  }, LINGER_MS).unref()
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code
    exitIfLingering()
  },
  (error: unknown) => {
    if (error instanceof UsageError) {
      console.error(error.message)
      process.exitCode = 2
    } else {
      // One line naming the command that failed (`gyre replay: ...`), as the commands' own lines do.
      const name = process.argv[2]
      console.error(`gyre${name !== undefined && name in commands ? ` ${name}` : ""}: ${errorLine(error)}`)
      if (process.env.GYRE_DEBUG) console.error(error)
      process.exitCode = 1
    }
    exitIfLingering()
  }
)
