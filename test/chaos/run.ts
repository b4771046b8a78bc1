/**
 * `npm run test:chaos [-- --long]`: runs the chaos and security tests (test/chaos,
 * test/security) with vitest and prints, as its last line, one JSON object of figures:
 * `faults`, `recovered`, `recovery_p50_s`, `recovery_p99_s`, `executions_lost`,
 * `trained_twice`, `fuzz_cases`, `crashes`, `permission_refusals`, `permission_attempts`.
 *
 * Each fault test appends what it injected and saw to `$GYRE_CHAOS_FAULTS`; the permission
 * test writes its counts to `$GYRE_CHAOS_PERMISSIONS`. `--long` runs the fault tests
 * `--rounds` times (default 3) for steadier percentiles. The first round also runs the two
 * fuzzers' tests (test/runtime/fuzz.test.ts over every actor subject, test/gateway/http-fuzz.test.ts
 * over `gyre serve`'s HTTP): short forms (25 cases per schema, 400 requests), or with `--long`
 * 10,000 per schema and 10,000 requests (about 6 minutes and 22 s on 2 cores); each appends its cases sent and
 * crashes to `$GYRE_CHAOS_FUZZ`, summed in `fuzz_cases` and `crashes` (`notes` names a fuzzer
 * that reported nothing). `trained_twice` is the sum over the
 * run-level faults during `gyre train` (test/chaos/train-faults.chaos.ts: kill -9 of a second
 * node, as a training satellite, as the training core, of the nats-server and of the scheduler
 * alone; test/chaos/cluster.test.ts: kill -9 of one server of a 3-server cluster, the run's
 * streams at R3; test/chaos/proxy.test.ts: a TCP proxy that delays and cuts the second node's
 * NATS connection; each `--long` round seeds their moments anew, GYRE_CHAOS_SEED
 * = 12 + round unless set); null, with a note, when none ran.
 * `by_fault` counts the faults by name; `run_faults` lists each run-level fault's recovery,
 * executions re-dispatched and duplicates suppressed.
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import type { FaultRecord } from "./helpers.ts"

const here = path.dirname(fileURLToPath(import.meta.url))
const root = path.resolve(here, "..", "..")
const argv = process.argv.slice(2)
const long = argv.includes("--long")
const roundsAt = argv.indexOf("--rounds")
const rounds = long ? Math.max(1, Number(roundsAt >= 0 ? argv[roundsAt + 1] : 3) || 3) : 1

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-chaos-run-"))
const env = {
  ...process.env,
  GYRE_CHAOS_FAULTS: path.join(dir, "faults.jsonl"),
  GYRE_CHAOS_PERMISSIONS: path.join(dir, "permissions.json"),
  GYRE_CHAOS_FUZZ: path.join(dir, "fuzz.jsonl"),
  ...(long ? { GYRE_CHAOS_LONG: "1" } : {})
}
const vitest = path.join(root, "node_modules", "vitest", "vitest.mjs")
let failed = 0
for (let round = 1; round <= rounds; round++) {
  // Round 1 also runs the fuzzers (short forms, or the long ones with --long), which report to GYRE_CHAOS_FUZZ.
  const targets = round === 1 ? ["test/chaos", "test/security", "test/runtime/fuzz.test.ts", "test/gateway/http-fuzz.test.ts"] : ["test/chaos"]
  // Each round its own seed of the run-level faults' moments (round 1: 13, the tests' default).
  const seeded = { ...env, GYRE_CHAOS_SEED: process.env.GYRE_CHAOS_SEED ?? String(12 + round) }
  const r = spawnSync(process.execPath, [vitest, "run", ...targets], { cwd: root, env: seeded, stdio: "inherit" })
  if (r.status !== 0) failed++
}

const lines = (file: string) => (fs.existsSync(file) ? fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "") : [])
const faults = lines(env.GYRE_CHAOS_FAULTS).map((l) => JSON.parse(l) as FaultRecord)
const permissions = fs.existsSync(env.GYRE_CHAOS_PERMISSIONS)
  ? (JSON.parse(fs.readFileSync(env.GYRE_CHAOS_PERMISSIONS, "utf8")) as { permission_attempts: number; permission_refusals: number })
  : { permission_attempts: 0, permission_refusals: 0 }
const fuzz = lines(env.GYRE_CHAOS_FUZZ).map((l) => JSON.parse(l) as { fuzzer: string; cases: number; crashes: number })

const recoveries = faults.filter((f) => f.recovered).map((f) => f.recoveryS).sort((a, b) => a - b)
const quantile = (q: number) => (recoveries.length === 0 ? null : Number(recoveries[Math.min(recoveries.length - 1, Math.ceil(q * recoveries.length) - 1)]!.toFixed(3)))
const runFaults = faults.filter((f) => f.trainedTwice !== undefined)
const notes = [
  ...(["subjects", "http"].filter((f) => !fuzz.some((r) => r.fuzzer === f)).map((f) => `the ${f} fuzzer reported nothing (its test failed or did not run): fuzz_cases counts without it`)),
  ...(runFaults.length === 0 ? ["no run-level fault during gyre train ran (test/chaos/train-faults.chaos.ts, cluster.test.ts, proxy.test.ts): trained_twice null"] : []),
  ...(failed > 0 ? [`${failed} of ${rounds} vitest rounds failed`] : [])
]
console.log(
  JSON.stringify({
    faults: faults.length,
    recovered: faults.filter((f) => f.recovered).length,
    recovery_p50_s: quantile(0.5),
    recovery_p99_s: quantile(0.99),
    executions_lost: faults.reduce((n, f) => n + f.executionsLost, 0),
    trained_twice: runFaults.length === 0 ? null : runFaults.reduce((n, f) => n + f.trainedTwice!, 0),
    fuzz_cases: fuzz.reduce((n, f) => n + f.cases, 0),
    crashes: fuzz.reduce((n, f) => n + f.crashes, 0),
    permission_refusals: permissions.permission_refusals,
    permission_attempts: permissions.permission_attempts,
    by_fault: Object.fromEntries([...new Set(faults.map((f) => f.fault))].map((k) => [k, faults.filter((f) => f.fault === k).length])),
    run_faults: runFaults.map((f) => ({ fault: f.fault, recovery_s: f.recoveryS, redispatched: f.executionsRedispatched, duplicates_suppressed: f.duplicatesSuppressed, detail: f.detail })),
    notes
  })
)
fs.rmSync(dir, { recursive: true, force: true })
process.exitCode = failed > 0 ? 1 : 0
