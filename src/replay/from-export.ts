/**
 * `gyre train --from-export DIR`: one training step of an exported run (`--export`, export.ts)
 * with no rollout at all. The recorded calls (tokens, behaviour log-probs, versions, never
 * regenerated) become each execution's tree again (`DeltaEncoder` -> `DeltaDecoder`, as the
 * gateway and trainer do); the step's plan and its executions, told in the recorded order, go
 * through the trainer's `StepPlanner`, so the micro-batches are the live step's; each micro-batch's
 * gradient is computed alone on the step's weights with the run's loss (`stepLoss`), summed in
 * index order (`InOrderSum`), and the update applied (`stepUpdate`), exactly as the core does.
 * The result is saved as a checkpoint and compared, byte for byte, with the live run's
 * checkpoint of that version when one exists.
 *
 * The export is read streaming (`forEachLine`): only the step's plan line and the calls of the
 * executions it told are kept, as their trees; micro-batches are built one at a time.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Schema } from "effect"
import { packedBatchDigest } from "../common/packed-batch.ts"
import { loadCheckpoint, MODEL_FILE, saveCheckpoint } from "../engine/checkpoint.ts"
import { StepExecutionRef, StepPlan } from "../protocols/device.ts"
import { RunConfig } from "../protocols/run.ts"
import { checkpointPath, restoreTrainingCheckpoint } from "../training/checkpoints.ts"
import { InOrderSum } from "../training/gradients.ts"
import { StepPlanner, stepLoss, type PlannedMicroBatch } from "../training/step-planner.ts"
import { ppoEpochs, stepUpdate } from "../training/update.ts"
import { DeltaDecoder } from "../tree/decoder.ts"
import { DeltaEncoder } from "../tree/encoder.ts"
import { plainCall } from "../tree/record.ts"
import type { AgentRole } from "../tree/role.ts"
import type { TrajectoryTree } from "../tree/tree.ts"
import type { ExportedCall } from "./export.ts"
import { forEachLine } from "./lines.ts"

/** The export cannot be trained from: a missing file, a bad line, a step it does not hold. */
export class BadExport extends Schema.TaggedError<BadExport>()("BadExport", { dir: Schema.String, message: Schema.String }) {}

const StepLine = Schema.Struct({ step: Schema.Number, plan: StepPlan, told: Schema.Array(StepExecutionRef) })
const decodeStepLine = Schema.decodeUnknownSync(StepLine)

const fileOf = (dir: string, name: string): string => {
  const file = path.join(dir, name)
  if (!fs.existsSync(file)) throw new Error(`no ${name} in ${dir} (export it with gyre replay RUN --export DIR)`)
  return file
}

/** Each line of `name` parsed as JSON, streamed (`forEachLine`). */
const forEachJson = (dir: string, name: string, f: (value: unknown) => void): void =>
  forEachLine(fileOf(dir, name), (line, n) => {
    let value: unknown
    try {
      value = JSON.parse(line)
    } catch {
      throw new Error(`${name} line ${n} is not JSON`)
    }
    f(value)
  })

export interface ExportedStep {
  readonly config: RunConfig
  readonly plan: StepPlan
  readonly told: ReadonlyArray<StepExecutionRef>
  readonly trees: ReadonlyMap<string, TrajectoryTree>
}

/**
 * The trees of the exported calls of `executions` (calls in export order), read from
 * `calls.jsonl` one line at a time: the calls of other executions are skipped as they are read.
 */
export const exportedTrees = (dir: string, executions: ReadonlySet<string>): Map<string, TrajectoryTree> => {
  const coders = new Map<string, { readonly encoder: DeltaEncoder; readonly decoder: DeltaDecoder }>()
  forEachJson(dir, "calls.jsonl", (value) => {
    const c = value as ExportedCall
    if (!executions.has(c.execution)) return
    let coder = coders.get(c.execution)
    if (coder === undefined) coders.set(c.execution, (coder = { encoder: new DeltaEncoder({ run: "export", task: c.task, execution: c.execution }), decoder: new DeltaDecoder(c.execution) }))
    const call = plainCall(c.callId, c.role as AgentRole, c.prompt, c.output, {
      logprobs: Float32Array.from(c.logprobs),
      versions: Int32Array.from(c.versions),
      ...(c.finishReason === "" ? {} : { finishReason: c.finishReason }),
      startedAt: c.startedAt,
      finishedAt: c.finishedAt
    })
    const report = coder.decoder.add(coder.encoder.encode(call))
    if (report.rejected.length > 0) throw new Error(`call ${c.callId} of ${c.execution}: ${report.rejected[0]!.detail}`)
  })
  return new Map([...coders].map(([e, c]) => [e, c.decoder.tree]))
}

/** Reads step `step` of the export in `dir`: its plan line, and the trees of the executions it told only. */
export const readExportedStep = (dir: string, step: number): Effect.Effect<ExportedStep, BadExport> =>
  Effect.try({
    try: () => {
      const config = Schema.decodeUnknownSync(Schema.toCodecJson(RunConfig))(JSON.parse(fs.readFileSync(fileOf(dir, "config.json"), "utf8")))
      let line: typeof StepLine.Type | undefined
      forEachJson(dir, "plans.jsonl", (value) => {
        const l = decodeStepLine(value)
        if (l.step === step) line ??= l
      })
      if (line === undefined) throw new Error(`the export holds no plan of step ${step}`)
      return { config, plan: line.plan, told: line.told, trees: exportedTrees(dir, new Set(line.told.map((r) => r.execution))) }
    },
    catch: (e) => new BadExport({ dir, message: e instanceof Error ? e.message : String(e) })
  })

/** The step's micro-batches, as the core planned them (each built when asked). */
export const plannedMicroBatches = (s: ExportedStep): Array<PlannedMicroBatch> => {
  const planner = new StepPlanner(s.plan, s.config.training, s.config.seed)
  const out: Array<PlannedMicroBatch> = []
  for (const ref of s.told) {
    const tree = s.trees.get(ref.execution)
    if (tree === undefined) throw new Error(`no calls of ${ref.execution} in the export`)
    const told = planner.tell(ref, tree)
    if (told._tag === "Queued") out.push(...told.microBatches)
  }
  return out.sort((a, b) => a.index - b.index)
}

export interface ExportTraining {
  readonly step: number
  readonly microBatches: number
  readonly batchDigests: ReadonlyArray<string>
  readonly gradNorm: number
  readonly out: string
  /** The live checkpoint of the same version, and whether its weights are byte-identical. */
  readonly live: { readonly dir: string; readonly identical: boolean } | undefined
}

/** Trains step `step` of the export in `dir` and writes the new weights to `out` (see the module comment). */
export const trainFromExport = (dir: string, step: number, out: string) =>
  Effect.gen(function* () {
    const s = yield* readExportedStep(dir, step)
    const batches = yield* Effect.try({ try: () => plannedMicroBatches(s), catch: (e) => new BadExport({ dir, message: String(e) }) })
    const from = step === 0 ? s.config.checkpoint : checkpointPath(s.config.checkpointDir, step)
    const { model } = yield* loadCheckpoint(from)
    const trainer = yield* model.trainer({ maxTokens: s.config.training.microBatchTokens })
    if (step > 0) yield* restoreTrainingCheckpoint(from, model, trainer)
    const sum = new InOrderSum(model.paramCount, ppoEpochs(s.config) > 1)
    const batchDigests: Array<string> = []
    for (const mb of batches) {
      const batch = mb.build()
      batchDigests.push(packedBatchDigest(batch))
      yield* trainer.zeroGrads()
      const { tokenLogprobs } = yield* trainer.train(batch, stepLoss(s.config, step))
      const grads = yield* trainer.getGrads()
      sum.offer(mb.index, { grads, logprobs: tokenLogprobs })
      yield* sum.drain(() => Effect.die(new Error("no stored gradients offline")))
    }
    const load = (i: number) => Effect.sync(() => batches[i]!.build())
    const gradNorm = batches.length > 0 ? (yield* stepUpdate(trainer, s.config, step, { count: batches.length, load }, sum)).gradNorm : 0
    yield* saveCheckpoint(out, model, trainer)
    const liveDir = checkpointPath(s.config.checkpointDir, step + 1)
    const liveModel = path.join(liveDir, MODEL_FILE)
    const live = fs.existsSync(liveModel)
      ? { dir: liveDir, identical: Buffer.compare(fs.readFileSync(liveModel), fs.readFileSync(path.join(out, MODEL_FILE))) === 0 }
      : undefined
    return { step, microBatches: batches.length, batchDigests, gradNorm, out, live } satisfies ExportTraining
  })
