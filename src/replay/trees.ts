/**
 * `gyre replay --trees`: every execution's trajectory tree rebuilt from the recorded call records
 * (the trajectory stream, through the trainer's `DeltaDecoder`) and checked against what the core
 * trainer journaled for its step (`StepMetrics.trees`: calls, unique tokens, paths, `treeDigest`);
 * then the step's planning replayed (`StepPlanner` on the plan the step's metrics carry, else on
 * its first `StartStep`'s journal copy, told the
 * step's `TrainExecution`s in journal order with the rebuilt trees) and each micro-batch's
 * `packedBatchDigest` compared with the journaled `batchDigests`. A mismatch names the step,
 * the execution (the first figure that differs, and, where the trainer recorded its node digests,
 * the first node that differs: its place in canonical preorder, where its tokens sit and the call
 * that made it) or the micro-batch and its executions.
 */
import { Effect, Stream } from "effect"
import type { StepExecutionRef, StepPlan } from "../protocols/device.ts"
import type { RunConfig } from "../protocols/run.ts"
import type { StepMetrics } from "../protocols/scheduler.ts"
import { readTrajectories } from "../protocols/trajectories.ts"
import type { TransportError } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { StepPlanner } from "../training/step-planner.ts"
import { firstDifferingNode, NODE_DIGEST_CHARS, nodeDigests, treeDigest } from "../tree/stats.ts"
import { TrajectoryTree } from "../tree/tree.ts"
import { readEntries } from "./read.ts"

/** The first node where a rebuilt tree and the trainer's differ. */
export interface NodeDifference {
  /** Index in canonical preorder (the root not counted). */
  readonly index: number
  /** The rebuilt tree's node there (absent when the rebuilt tree has fewer nodes). */
  readonly rebuilt?: { readonly depth: number; readonly length: number; readonly call: string }
  readonly rebuiltNodes: number
  readonly recordedNodes: number
}

export interface TreeMismatch {
  readonly step: number
  readonly execution?: string
  readonly node?: NodeDifference
  readonly microBatch?: number
  readonly what: string
  readonly expected: unknown
  readonly recorded: unknown
}

export interface TreeCheck {
  readonly steps: number
  readonly executions: number
  readonly microBatches: number
  readonly mismatches: ReadonlyArray<TreeMismatch>
  /** Steps whose metrics carry no trees (a trainer older than this check), or no plan with no `StartStep` copy journaled either. */
  readonly unrecorded: ReadonlyArray<number>
}

/** What the journal says of one step's training: its plan, the executions told in order, its metrics. */
interface StepLog {
  plan?: StepPlan
  readonly told: Array<StepExecutionRef>
  metrics?: StepMetrics
}

/** The journal's record of each step, from the core's `StartStep`, `TrainExecution` and `sys.step` entries. */
export const stepLogs = (log: JournalSource): Effect.Effect<Map<number, StepLog>, TransportError> =>
  Effect.gen(function* () {
    const steps = new Map<number, StepLog>()
    const of = (step: number) => {
      let s = steps.get(step)
      if (s === undefined) steps.set(step, (s = { told: [] }))
      return s
    }
    yield* readEntries(log, { filter: { types: ["StartStep", "TrainExecution", "step"] } }).pipe(
      Stream.runForEach((e) =>
        Effect.sync(() => {
          if (e.error !== undefined) return
          if (e.metrics !== undefined) of(e.metrics.step).metrics = e.metrics
          else if (e.name === "StartStep") of((e.payload as StepPlan).step).plan ??= e.payload as StepPlan
          else if (e.name === "TrainExecution") {
            const ref = e.payload as StepExecutionRef
            const s = of(ref.step)
            if (!s.told.some((r) => r.execution === ref.execution)) s.told.push(ref)
          }
        })
      )
    )
    return steps
  })

const figuresOf = (tree: TrajectoryTree) => ({ calls: tree.callCount, uniqueTokens: tree.uniqueTokens, paths: tree.leaves().length, digest: treeDigest(tree) })

/** Where the rebuilt tree first differs from the trainer's node digests (`recorded`). */
export const nodeDifference = (tree: TrajectoryTree, recorded: string): NodeDifference | undefined => {
  const index = firstDifferingNode(nodeDigests(tree), recorded)
  if (index === undefined) return undefined
  const order = tree.preorder()
  const node = order[index]
  return {
    index,
    ...(node === undefined ? {} : { rebuilt: { depth: tree.depthOf(node), length: tree.lengthOf(node), call: tree.call(tree.creatorOf(node)).id } }),
    rebuiltNodes: order.length,
    recordedNodes: recorded.length / NODE_DIGEST_CHARS
  }
}

/** Checks the trees and micro-batches of every step (see the module comment). */
export const checkTrees = (log: JournalSource, config: RunConfig): Effect.Effect<TreeCheck, TransportError> =>
  Effect.gen(function* () {
    const steps = yield* stepLogs(log)
    const { executions } = yield* readTrajectories(log)
    const treeOf = (execution: string) => executions.get(execution)?.decoder.tree
    const mismatches: Array<TreeMismatch> = []
    const unrecorded: Array<number> = []
    let checkedExecutions = 0
    let checkedBatches = 0
    for (const [step, s] of [...steps.entries()].sort((a, b) => a[0] - b[0])) {
      const m = s.metrics
      // The plan the step's metrics carry (durable), else the first StartStep's journal copy (older trainers).
      const plan = m?.plan ?? s.plan
      if (m?.trees === undefined || m.batchDigests === undefined || plan === undefined) {
        if (m !== undefined) unrecorded.push(step)
        continue
      }
      for (const recorded of m.trees) {
        checkedExecutions++
        const tree = treeOf(recorded.execution)
        const rebuilt = tree === undefined ? undefined : figuresOf(tree)
        const field = (["calls", "uniqueTokens", "paths", "digest"] as const).find((k) => rebuilt?.[k] !== recorded[k])
        if (field === undefined) continue
        const node = tree !== undefined && recorded.nodes !== undefined ? nodeDifference(tree, recorded.nodes) : undefined
        mismatches.push({ step, execution: recorded.execution, ...(node === undefined ? {} : { node }), what: field, expected: rebuilt?.[field] ?? "no call records", recorded: recorded[field] })
      }
      const planner = new StepPlanner(plan, config.training, config.seed)
      const digests: Array<{ readonly digest: string; readonly executions: ReadonlyArray<string> }> = []
      for (const ref of s.told) {
        const told = planner.tell(ref, treeOf(ref.execution) ?? new TrajectoryTree())
        if (told._tag === "Queued") for (const mb of told.microBatches) digests.push({ digest: planner.figures.batchDigests[mb.index]!, executions: mb.executions })
      }
      const n = Math.max(digests.length, m.batchDigests.length)
      for (let i = 0; i < n; i++) {
        checkedBatches++
        if (digests[i]?.digest === m.batchDigests[i]) continue
        mismatches.push({ step, microBatch: i, what: `micro-batch ${i} (executions ${digests[i]?.executions.join(", ") ?? "none"})`, expected: digests[i]?.digest ?? "none", recorded: m.batchDigests[i] ?? "none" })
        break
      }
    }
    return { steps: steps.size, executions: checkedExecutions, microBatches: checkedBatches, mismatches, unrecorded }
  })
