/**
 * The cached supervised warm start of the `tiny` policy on a suite's oracle demonstrations
 * (`src/training/warm-start.ts` does the training): `gyre train` and `gyre demo` start RL from it.
 *
 * Cached in `.gyre/cache/warm-start-<key>`, the key a digest of everything that shapes it (the
 * suite's files, the chat template, the tokenizer, the warm-start code and the settings), so a
 * second run starts at once and a change to any of them trains a new one. The demonstrations are
 * seeded and their trees taken in task order (however the side-by-side harnesses interleaved
 * them), so the cached checkpoint is reproducible.
 */
import { createHash } from "node:crypto"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import { CONFIG_FILE, MODEL_FILE, saveCheckpoint } from "../engine/checkpoint.ts"
import { Engine } from "../engine/engine.ts"
import { presets } from "../engine/presets.ts"
import { loadSuite } from "../harness/suites.ts"
import { repoRoot } from "../runtime/nats-server.ts"
import { recordDemonstrations } from "../training/demonstrations.ts"
import { demonstrationTrees, readDemonstrations, warmStart } from "../training/warm-start.ts"

export interface WarmStartSettings {
  readonly suite: string
  /** Suite knobs of the demonstrations (the same the RL executions get). */
  readonly env: Readonly<Record<string, string>>
  /** Train tasks the oracle demonstrates. */
  readonly tasks: number
  readonly steps: number
  readonly lr: number
  readonly seed: number
  /** Ignore a cached checkpoint. */
  readonly fresh: boolean
  /** Progress lines go here (stdout by default). */
  readonly log?: (line: string) => void
  /** Called after each SFT step (a progress bar); the periodic loss lines are then left out. */
  readonly onStep?: (step: number, loss: number) => void
}

const digestOf = (parts: ReadonlyArray<string>) => {
  const h = createHash("sha256")
  for (const p of parts) h.update(p).update("\0")
  return h.digest("hex").slice(0, 16)
}

/** Files whose content shapes the warm start, relative to the repository. */
const shapingFiles = (suite: string) => [
  ...fs.readdirSync(path.join(repoRoot, "suites", suite)).sort().map((f) => `suites/${suite}/${f}`),
  "src/openai/chat.ts",
  "src/openai/messages.ts",
  "src/engine/tokenizer.ts",
  "src/training/warm-start.ts"
]

/** The warm-started checkpoint directory: from the cache, or trained now and cached. */
export const warmStartedCheckpoint = (s: WarmStartSettings): Effect.Effect<string, unknown, Engine> =>
  Effect.scoped(
    Effect.gen(function* () {
      const log = s.log ?? ((line: string) => console.log(line))
      const suite = yield* loadSuite(path.join(repoRoot, "suites"), s.suite)
      const key = digestOf([
        ...shapingFiles(s.suite).map((p) => fs.readFileSync(path.join(repoRoot, p), "utf8")),
        JSON.stringify({ preset: presets.tiny, env: s.env, tasks: s.tasks, steps: s.steps, lr: s.lr, seed: s.seed })
      ])
      const dir = path.join(repoRoot, ".gyre", "cache", `warm-start-${key}`)
      if (!s.fresh && fs.existsSync(path.join(dir, CONFIG_FILE)) && fs.existsSync(path.join(dir, MODEL_FILE))) {
        log(`warm start: cached in ${path.relative(process.cwd(), dir)}`)
        return dir
      }
      const started = Date.now()
      const work = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-warm-start-"))
      const demosFile = path.join(work, "demonstrations.jsonl")
      const tasks = suite.tasks.filter((t) => t.split === "train").slice(0, s.tasks).map((t) => t.id)
      yield* recordDemonstrations(suite, tasks, demosFile, { env: { ...s.env, TOY_TOOL_MS: "0", TOY_RANDOM_SEED: String(s.seed) } })
      const trees = demonstrationTrees(yield* readDemonstrations([demosFile]))
      const calls = trees.reduce((a, t) => a + t.tree.callCount, 0)
      log(`warm start: ${calls} oracle calls on ${trees.length} train tasks; ${s.steps} SFT steps of the tiny preset...`)
      const engine = yield* Engine
      const model = yield* engine.createModel(presets.tiny, { seed: s.seed })
      const budget = 4096
      const trainer = yield* model.trainer({ maxTokens: budget })
      const loss = yield* warmStart(trainer, trees, {
        steps: s.steps,
        tasksPerStep: 2,
        microBatchTokens: budget,
        lr: s.lr,
        seed: s.seed,
        onStep: (step, l) => {
          if (s.onStep !== undefined) s.onStep(step, l)
          else if (step % 25 === 0) log(`  step ${String(step).padStart(4)}  loss ${l.toFixed(4)}  ${((Date.now() - started) / 1000).toFixed(0)} s`)
        }
      })
      const staging = `${dir}.tmp-${process.pid}`
      yield* saveCheckpoint(staging, model)
      const seconds = (Date.now() - started) / 1000
      const record = { key, demonstrations: calls, tasks: trees.length, steps: s.steps, lr: s.lr, finalLoss: loss, seconds }
      fs.writeFileSync(path.join(staging, "warm-start.json"), `${JSON.stringify(record, null, 2)}\n`)
      fs.rmSync(dir, { recursive: true, force: true })
      fs.renameSync(staging, dir)
      fs.rmSync(work, { recursive: true, force: true })
      log(`warm start: final loss ${loss.toFixed(4)} in ${seconds.toFixed(0)} s, cached in ${path.relative(process.cwd(), dir)}`)
      return dir
    })
  )
