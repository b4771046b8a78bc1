/**
 * Reads step 0 of the export in the directory given as the first argument the way
 * `gyre train --from-export` reads it (`readExportedStep`), and prints its trees' digests as one
 * JSON object: `test/replay/long.test.ts` runs it in a child process under a heap cap.
 */
import { Effect } from "effect"
import { readExportedStep } from "../../src/replay/from-export.ts"
import { treeDigest } from "../../src/tree/stats.ts"

const step = await Effect.runPromise(readExportedStep(process.argv[2]!, 0))
console.log(JSON.stringify(Object.fromEntries([...step.trees].map(([execution, tree]) => [execution, treeDigest(tree)]))))
