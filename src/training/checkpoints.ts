/**
 * Training checkpoints: `<checkpointDir>/step-<v>` holds policy version v (the weights after
 * v steps) as a Hugging Face checkpoint (config.json, model.safetensors), the AdamW state
 * (optimizer.safetensors) and `run-state.json` (`RunState`). The core writes one every
 * `checkpointEvery` versions and at the run's last step, before it reports the step done.
 *
 * run-state.json is written last (to a temporary name, then renamed), so a directory without
 * it is an interrupted write and is skipped: `latestCheckpoint` returns the newest complete
 * one, which `restoreTrainingCheckpoint` loads into a live model and trainer for `--resume`.
 */
import { readFile, readdir, rename, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Schema } from "effect"
import { CheckpointError, loadCheckpoint, restoreOptimizer, saveCheckpoint } from "../engine/checkpoint.ts"
import type { Model } from "../engine/engine.ts"
import type { Trainer } from "../engine/trainer.ts"
import type { RunConfig } from "../protocols/run.ts"
import { StepMetrics } from "../protocols/scheduler.ts"

export const RUN_STATE_FILE = "run-state.json"

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

/** What a checkpoint says of the run when it was written. */
export const RunState = Schema.Struct({
  format: Schema.Literal("gyre-run-state"),
  run: Schema.String,
  /** Policy version of the weights (= steps done). */
  version: Count,
  /** AdamW steps the optimizer state has taken (steps that trained something). */
  optimizerSteps: Count,
  savedAt: Schema.Number,
  /** The metrics of the step that made this version. */
  metrics: Schema.optional(StepMetrics)
})
export type RunState = typeof RunState.Type

const RunStateJson = Schema.fromJsonString(RunState)

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

export const checkpointPath = (checkpointDir: string, version: number) => join(checkpointDir, `step-${version}`)

/** Whether version `version` is checkpointed: every `checkpointEvery` versions and the run's last. */
export const checkpointDue = (config: RunConfig, version: number): boolean =>
  version % config.training.checkpointEvery === 0 || version === config.policyConfig.steps

/** Writes `<checkpointDir>/step-<version>`; returns its path. */
export const saveTrainingCheckpoint = Effect.fn("saveTrainingCheckpoint")(function* (
  checkpointDir: string,
  model: Model,
  trainer: Trainer,
  state: Omit<RunState, "format" | "optimizerSteps" | "savedAt">
) {
  const dir = checkpointPath(checkpointDir, state.version)
  yield* saveCheckpoint(dir, model, trainer)
  const full: RunState = { format: "gyre-run-state", ...state, optimizerSteps: yield* trainer.stepCount(), savedAt: Date.now() }
  const path = join(dir, RUN_STATE_FILE)
  yield* Effect.tryPromise({
    try: async () => {
      await writeFile(`${path}.tmp`, `${Schema.encodeSync(RunStateJson)(full)}\n`)
      await rename(`${path}.tmp`, path)
    },
    catch: (e) => new CheckpointError({ path, message: messageOf(e) })
  })
  return dir
})

const readRunState = (dir: string) => {
  const path = join(dir, RUN_STATE_FILE)
  return Effect.tryPromise({ try: () => readFile(path, "utf8"), catch: (e) => new CheckpointError({ path, message: messageOf(e) }) }).pipe(
    Effect.flatMap((text) => Schema.decodeUnknownEffect(RunStateJson)(text)),
    Effect.mapError((e) => (e instanceof CheckpointError ? e : new CheckpointError({ path, message: String(e) })))
  )
}

/** The newest complete checkpoint under `checkpointDir`, or undefined (none, or no such directory). */
export const latestCheckpoint = Effect.fn("latestCheckpoint")(function* (checkpointDir: string) {
  const names = yield* Effect.tryPromise({
    try: () => readdir(checkpointDir),
    catch: (e) => new CheckpointError({ path: checkpointDir, message: messageOf(e) })
  }).pipe(Effect.catchIf((e) => e.message.includes("ENOENT"), () => Effect.succeed([] as Array<string>)))
  const versions = names.flatMap((n) => {
    const m = /^step-(\d+)$/.exec(n)
    return m === null ? [] : [Number(m[1])]
  })
  for (const version of versions.sort((a, b) => b - a)) {
    const dir = checkpointPath(checkpointDir, version)
    const state = yield* readRunState(dir).pipe(Effect.option)
    if (state._tag === "Some" && state.value.version === version) return { dir, state: state.value }
  }
  return undefined
})

/** Loads checkpoint `dir`'s weights into `model` and its optimizer state into `trainer`; returns its run state. */
export const restoreTrainingCheckpoint = Effect.fn("restoreTrainingCheckpoint")(function* (dir: string, model: Model, trainer: Trainer) {
  const state = yield* readRunState(dir)
  const loaded = yield* Effect.scoped(
    Effect.gen(function* () {
      const { model: stored, optimizer } = yield* loadCheckpoint(dir, { device: model.device })
      return { weights: yield* stored.getWeights(), optimizer }
    })
  )
  yield* model.setWeights(loaded.weights)
  if (loaded.optimizer === undefined) return yield* new CheckpointError({ path: dir, message: "no optimizer.safetensors" })
  yield* restoreOptimizer(dir, trainer, loaded.optimizer)
  return state
})
