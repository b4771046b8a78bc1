/**
 * Flag values that name files, checked before a command starts anything: a checkpoint directory,
 * a suite. A missing one is a usage error (one line naming the flag, exit 2); what is inside is
 * checked when it is loaded (a malformed file is the command's failure, exit 1).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { CONFIG_FILE, INDEX_FILE, MODEL_FILE } from "../engine/checkpoint.ts"
import { listSuites } from "../harness/suites.ts"
import { UsageError } from "./args.ts"

/** Fails with a UsageError unless `suitesDir` holds the suite `name` (a suite.json there; its contents are checked when loaded). */
export const checkSuite = (command: string, suitesDir: string, name: string) => {
  if (!fs.existsSync(suitesDir)) throw new UsageError(`gyre ${command}: --suites ${suitesDir} is not there`)
  const known = listSuites(suitesDir)
  if (!known.includes(name)) throw new UsageError(`gyre ${command}: --suite ${name}: no ${path.join(suitesDir, name, "suite.json")} (suites there: ${known.join(", ") || "none"})`)
}

/** Fails with a UsageError unless `dir` holds a checkpoint. */
export const checkCheckpoint = (command: string, dir: string) => {
  if (!fs.existsSync(path.join(dir, CONFIG_FILE))) throw new UsageError(`gyre ${command}: --checkpoint ${dir} has no ${CONFIG_FILE}`)
  if (!fs.existsSync(path.join(dir, MODEL_FILE)) && !fs.existsSync(path.join(dir, INDEX_FILE))) {
    throw new UsageError(`gyre ${command}: --checkpoint ${dir} has neither ${MODEL_FILE} nor ${INDEX_FILE}`)
  }
}
