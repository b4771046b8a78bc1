/**
 * `gyre runs`: the runs a server holds (NATS_URL), or a stopped store holds (`--store DIR`), or,
 * with neither, every embedded store under `.gyre/runs/` (one private server each, one after
 * another): name, started, steps done of planned, policy, live / ended / stopped. `--json`: one
 * JSON array. Also home of `withRun`, how `replay`, `status` and `report` reach one run's log.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { openRun, readerNats } from "../replay/read.ts"
import { runListings, type RunListing } from "../replay/status.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { Nats, natsOptionsFromEnv } from "../runtime/nats.ts"
import { repoRoot } from "../runtime/nats-server.ts"
import { parseFlags, type Command } from "./args.ts"
import { checkStore } from "./checks.ts"

/** Where `gyre train` keeps its embedded stores (`.gyre/runs/<run>`). */
export const storesDir = path.join(repoRoot, ".gyre", "runs")

/** The connection for reading (read.ts): a private server on a copy of `store`, else NATS_URL. */
const readerLayer = (store: string | undefined) => {
  const env = natsOptionsFromEnv()
  return Layer.fresh(readerNats({ store, url: env.url, credsFile: env.credsFile }))
}

/** A command's failure the user can act on: one line on stderr, exit code 1. */
export const failed = (command: string, line: string) =>
  Effect.sync(() => {
    console.error(`gyre ${command}: ${line}`)
    return 1
  })

/**
 * Runs `use` on run `run`'s log: from `--store`, else NATS_URL, else the run's own embedded store
 * (`.gyre/runs/<run>`). A run the server does not hold is one line and exit code 1.
 */
export const withRun = <E>(command: string, run: string, store: string | undefined, use: (log: JournalSource) => Effect.Effect<number, E>) => {
  const own = path.join(storesDir, run)
  const where = checkStore(command, store ?? (natsOptionsFromEnv().url === undefined ? own : undefined), `give --store DIR, or NATS_URL of the server that holds run ${run}`)
  return Effect.gen(function* () {
    const opened = yield* openRun(yield* Nats, run).pipe(Effect.result)
    if (opened._tag === "Success") return yield* use(opened.success)
    const e = opened.failure
    return yield* e._tag === "RunNotFound" ? failed(command, `no run '${e.run}' there (runs: ${e.known.join(", ") || "none"})`) : Effect.fail(e)
  }).pipe(Effect.provide(readerLayer(where)), Effect.scoped)
}

const flags = {
  store: { kind: "string", doc: "a stopped embedded store directory (default: NATS_URL, else every store under .gyre/runs)" },
  json: { kind: "boolean", doc: "one JSON array", default: false }
} as const

const listingsOf = (store: string | undefined) => Effect.flatMap(Nats, runListings).pipe(Effect.provide(readerLayer(store)), Effect.scoped)

/** Every run of every store under `.gyre/runs` (a store holds its run and the run's evaluations). */
const localListings = Effect.gen(function* () {
  const dirs = fs.existsSync(storesDir) ? fs.readdirSync(storesDir).filter((d) => fs.existsSync(path.join(storesDir, d, "jetstream"))).sort() : []
  const out: Array<RunListing> = []
  for (const d of dirs) out.push(...(yield* listingsOf(path.join(storesDir, d))))
  return out
})

const line = (r: RunListing) =>
  `${r.run.padEnd(28)} ${(r.startedAt ?? "-").padEnd(24)} ${`${r.stepsDone}/${r.stepsPlanned ?? "-"}`.padStart(7)}  ${(r.policy ?? "-").padEnd(18)} ${r.state}`

export const command: Command<typeof flags> = {
  summary: "list the runs a server (NATS_URL) or store holds: started, steps, policy, live or ended (--json)",
  flags,
  run: async (argv) => {
    const f = parseFlags("runs", flags, argv)
    const local = f.store === undefined && natsOptionsFromEnv().url === undefined
    const runs = await Effect.runPromise(local ? localListings : listingsOf(checkStore("runs", f.store, "give --store DIR, or NATS_URL")))
    if (f.json) console.log(JSON.stringify(runs))
    else {
      console.log(`${"run".padEnd(28)} ${"started".padEnd(24)} ${"steps".padStart(7)}  ${"policy".padEnd(18)} state`)
      for (const r of runs) console.log(line(r))
    }
    return 0
  }
}
