/**
 * Who harnesses and scorers run as, where the runner is root: the configured `runAs`, else
 * `GYRE_HARNESS_UID`/`GYRE_HARNESS_GID` (0 keeps root), else `nobody` (65534) once a probe shows
 * nobody can run node and reach the suites and the workspaces (else a warning says why they run
 * as root). An execution's directory is handed to that user (`chownTree`), so a harness cannot
 * read the runner's `/proc/<pid>/environ` or its files.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import { baseEnv } from "./environment.ts"
import { describeEnd, runInGroup, tailOf } from "./process-group.ts"

export interface HarnessUser {
  readonly uid: number
  readonly gid: number
}

/** `nobody`/`nogroup` on Debian, Ubuntu, Fedora and RHEL 8+. */
const NOBODY: HarnessUser = { uid: 65534, gid: 65534 }

/** A uid or gid variable: a non-negative integer, or a defect naming it. */
const idOf = (name: string, value: string): number => {
  const n = Number(value)
  if (value.trim() === "" || !Number.isInteger(n) || n < 0) throw new Error(`${name} must be a user or group id (an integer >= 0), got '${value}'`)
  return n
}

/** The user `GYRE_HARNESS_UID` (and `GYRE_HARNESS_GID`, default the uid) names, if set. */
export const runAsFromEnv = (): HarnessUser | undefined => {
  const { GYRE_HARNESS_UID: uid, GYRE_HARNESS_GID: gid } = process.env
  if (uid === undefined) return undefined
  return { uid: idOf("GYRE_HARNESS_UID", uid), gid: idOf("GYRE_HARNESS_GID", gid ?? uid) }
}

/**
 * Whether `user` can run this node and reach `suitesDir` (read) and `workspaceRoot` (traverse):
 * undefined when it can, else why not.
 */
const probe = (user: HarnessUser, suitesDir: string, workspaceRoot: string) =>
  Effect.promise((signal) =>
    runInGroup(
      {
        command: [process.execPath, "-e", `const fs = require("fs"); fs.accessSync(${JSON.stringify(suitesDir)}, 5); fs.accessSync(${JSON.stringify(workspaceRoot)}, 1)`],
        cwd: "/",
        env: baseEnv(),
        timeoutMs: 10_000,
        graceMs: 500,
        outputCapBytes: 4096,
        uid: user.uid,
        gid: user.gid
      },
      signal
    )
  ).pipe(Effect.map((r) => (r.exitCode === 0 ? undefined : `${describeEnd(r)}: ${tailOf(r.stderr.trim().split("\n").find((l) => l.startsWith("Error")) ?? r.stderr.trim(), 300)}`)))

export interface HarnessUserOptions {
  /** The user asked for (a runner's configuration), if any. */
  readonly runAs?: HarnessUser | undefined
  readonly suitesDir: string
  readonly workspaceRoot: string
}

/**
 * Who harnesses and scorers run as: `runAs`, else GYRE_HARNESS_UID/GID (read once, `fromEnv`),
 * else nobody where the runner is root and nobody passes the probe (a warning says why not),
 * else the runner's user (undefined).
 */
export const harnessUser = (options: HarnessUserOptions, fromEnv: HarnessUser | undefined) =>
  Effect.gen(function* () {
    const chosen = options.runAs ?? fromEnv
    if (chosen !== undefined || process.getuid?.() !== 0) return chosen
    const refused = yield* probe(NOBODY, options.suitesDir, options.workspaceRoot)
    if (refused === undefined) return NOBODY
    yield* Effect.logWarning(
      `harness runner: harnesses run as root and can read this process's environment: uid ${NOBODY.uid} cannot reach the suites or the workspaces (${refused}); make ${options.suitesDir} readable by others, or set GYRE_HARNESS_UID (0: root on purpose)`
    )
    return undefined
  })

/** Hands `dir` and everything in it to `user`. */
export const chownTree = async (dir: string, user: HarnessUser): Promise<void> => {
  await fs.chown(dir, user.uid, user.gid)
  for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name)
    if (entry.isDirectory()) await chownTree(p, user)
    else await fs.lchown(p, user.uid, user.gid)
  }
}
