/**
 * Supervised warm start: a policy learns a suite's format from a scripted oracle's
 * demonstrations before RL takes over.
 *
 * A demonstration is one model call as a harness made it: the chat messages it sent and the
 * reply it wanted (the toy harness writes them with `TOY_POLICY=oracle TOY_DEMOS=<file>`).
 * Each call becomes the token sequence the gateway would have seen, the prompt rendered
 * with the gateway's chat template (`renderChat`) and the reply's bytes followed by
 * `<|end|>` as the generated part, so training and serving see identical tokens. The calls
 * of one task form a prefix tree (`src/tree`: encoded and decoded as the gateway and the
 * trainer do), trained in exact mode: every shared prefix once, each reply token weighted by
 * the paths through it, loss averaged within a task and then across tasks. Each step draws
 * `tasksPerStep` tasks, packs them into micro-batches and takes one AdamW step.
 */
import * as fs from "node:fs"
import { Effect, Schema } from "effect"
import type { Model } from "../engine/engine.ts"
import { encode, special } from "../engine/tokenizer.ts"
import { adamwDefaults, type Trainer } from "../engine/trainer.ts"
import { renderChat } from "../openai/chat.ts"
import { ChatMessage } from "../openai/messages.ts"
import { DeltaDecoder, DeltaEncoder, mulberry32, packMicroBatches, stepUnits, type StepExecution } from "../tree/index.ts"
import { plainCall } from "../tree/record.ts"
import { AgentRole } from "../tree/role.ts"

/** One demonstrated call (a line of the demonstrations JSONL). */
export const Demonstration = Schema.Struct({
  task: Schema.NonEmptyString,
  id: Schema.String,
  role: AgentRole,
  messages: Schema.Array(ChatMessage),
  reply: Schema.String
})
export type Demonstration = typeof Demonstration.Type

export class BadDemonstration extends Schema.TaggedError<BadDemonstration>()("BadDemonstration", {
  file: Schema.String,
  line: Schema.Number,
  message: Schema.String
}) {}

/** Reads demonstrations from JSONL files; a malformed line names its file and line. */
export const readDemonstrations = (files: ReadonlyArray<string>): Effect.Effect<Array<Demonstration>, BadDemonstration> =>
  Effect.gen(function* () {
    const out: Array<Demonstration> = []
    const decode = Schema.decodeUnknownExit(Schema.fromJsonString(Demonstration))
    for (const file of files) {
      const lines = fs.readFileSync(file, "utf8").split("\n")
      for (let i = 0; i < lines.length; i++) {
        if (lines[i]!.trim() === "") continue
        const d = decode(lines[i]!)
        if (d._tag === "Failure") return yield* Effect.fail(new BadDemonstration({ file, line: i + 1, message: String(d.cause) }))
        out.push(d.value)
      }
    }
    return out
  })

/** Task ids in order, numbers by value (`train-2` before `train-10`). */
const byTaskId = (a: string, b: string) => a.localeCompare(b, "en", { numeric: true })

/**
 * Builds one prefix tree per task from its demonstrated calls (a task's calls in file order),
 * the trees in task order: harnesses recorded side by side interleave their tasks in the file
 * by timing, and the warm start's seeded draws index this list, so its order must not.
 */
export const demonstrationTrees = (demos: ReadonlyArray<Demonstration>): Array<StepExecution> => {
  const byTask = new Map<string, Array<Demonstration>>()
  for (const d of demos) {
    const calls = byTask.get(d.task) ?? []
    calls.push(d)
    byTask.set(d.task, calls)
  }
  return [...byTask].sort(([a], [b]) => byTaskId(a, b)).map(([task, calls]) => {
    const execution = `demo-${task}`
    const encoder = new DeltaEncoder({ run: "warm-start", task, execution })
    const decoder = new DeltaDecoder(execution)
    calls.forEach((d, i) => {
      const prompt = renderChat(d.messages, [], undefined)
      const output = Int32Array.from([...encode(d.reply), special.end])
      const record = encoder.encode(plainCall(`c${i}`, d.role, prompt, output))
      const report = decoder.add(record)
      if (report.rejected.length > 0) throw new Error(`demonstration ${task}/${d.id}: ${report.rejected[0]!.detail}`)
    })
    return { execution, tree: decoder.tree, advantage: 1 }
  })
}

export interface WarmStartOptions {
  readonly steps: number
  readonly tasksPerStep: number
  /** Tokens per micro-batch (packing budget). */
  readonly microBatchTokens: number
  /** Peak learning rate: linear warm-up over the first 10% of steps, then cosine to 10%. */
  readonly lr: number
  readonly seed: number
  /** Called after every step with its number (from 1) and loss. */
  readonly onStep?: (step: number, loss: number) => void
}

const learningRate = (peak: number, step: number, steps: number) => {
  const warmup = Math.max(1, Math.round(steps * 0.1))
  if (step < warmup) return (peak * (step + 1)) / warmup
  const progress = (step - warmup) / Math.max(1, steps - warmup)
  return peak * (0.1 + 0.45 * (1 + Math.cos(Math.PI * progress)))
}

/** Trains `trainer`'s model on the trees; returns the mean loss of the last tenth of the steps. */
export const warmStart = (trainer: Trainer, trees: ReadonlyArray<StepExecution>, options: WarmStartOptions) =>
  Effect.gen(function* () {
    if (trees.length === 0) return yield* Effect.die(new Error("warm start: no demonstrations"))
    const random = mulberry32(options.seed)
    const tail: Array<number> = []
    for (let step = 0; step < options.steps; step++) {
      const chosen = Array.from({ length: Math.min(options.tasksPerStep, trees.length) }, () => trees[Math.floor(random() * trees.length)]!)
      const packed = packMicroBatches(stepUnits(chosen, { _tag: "exact" }).units, options.microBatchTokens)
      yield* trainer.zeroGrads()
      let loss = 0
      for (const mb of packed.microBatches) loss += (yield* trainer.train(mb.build(), { kind: "sft" })).stats.loss
      yield* trainer.step({ ...adamwDefaults, lr: learningRate(options.lr, step, options.steps) })
      options.onStep?.(step + 1, loss)
      if (step >= options.steps - Math.max(1, Math.floor(options.steps / 10))) tail.push(loss)
    }
    return tail.reduce((a, b) => a + b, 0) / tail.length
  })

export type { Model }
