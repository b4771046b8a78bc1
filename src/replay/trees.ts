/**
 * `gyre replay --trees`: every execution's trajectory tree rebuilt from the recorded call records
 * (its calls subject of the trajectory stream, `readExecution`, through the trainer's
 * `DeltaDecoder`) and checked against what the core trainer journaled for its step (`StepMetrics.trees`: calls, unique tokens, paths, `treeDigest`);
 * then the step's planning replayed (`StepPlanner` on the plan the step's metrics carry, else on
 * its first `StartStep`'s journal copy, told the
 * step's `TrainExecution`s in journal order with the rebuilt trees) and each micro-batch's
 * `packedBatchDigest` compared with the journaled `batchDigests` (and all of them with
 * `allBatchesDigest`, which covers micro-batches past the listed ones). Steps are checked as the
 * journal completes them and executions rebuilt as they are told, one micro-batch built at a
 * time, so memory holds the steps in progress and one group, whatever the run's length. A mismatch names the step,
 * the execution (the first figure that differs, and, where the trainer recorded its node digests,
 * the first node that differs: its place in canonical preorder, where its tokens sit and the call
 * that made it) or the micro-batch and its executions.
 */
import { Effect, Stream } from "effect"
import { packedBatchDigest } from "../common/packed-batch.ts"
import type { StepExecutionRef, StepPlan } from "../protocols/device.ts"
import type { RunConfig } from "../protocols/run.ts"
import type { StepMetrics } from "../protocols/scheduler.ts"
import { readExecution } from "../protocols/trajectories.ts"
import type { TransportError } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { allBatchesDigest } from "../training/step-metrics.ts"
import { StepPlanner } from "../training/step-planner.ts"
import { firstDifferingNode, NODE_DIGEST_CHARS, nodeDigests, treeDigest } from "../tree/stats.ts"
import type { TrajectoryTree } from "../tree/tree.ts"
import { readEntries, type Entry } from "./read.ts"

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
export interface StepLog {
  readonly step: number
  plan?: StepPlan
  readonly told: Array<StepExecutionRef>
  metrics?: StepMetrics
}

/**
 * Folds the core's `StartStep`, `TrainExecution` and `sys.step` entries into each step's log,
 * handing a step over when its metrics arrive (every execution of a step is told before it is
 * done), so a reader holds only the steps in progress: `add` returns the step an entry
 * completes, `rest` the steps that never completed. A step's later metrics or tells (a repeat)
 * are ignored.
 */
export class StepCollector {
  private readonly open = new Map<number, StepLog>()
  private readonly done = new Set<number>()

  private of(step: number): StepLog | undefined {
    if (this.done.has(step)) return undefined
    let s = this.open.get(step)
    if (s === undefined) this.open.set(step, (s = { step, told: [] }))
    return s
  }

  add(e: Entry): StepLog | undefined {
    if (e.error !== undefined) return undefined
    if (e.metrics !== undefined) {
      const s = this.of(e.metrics.step)
      if (s === undefined) return undefined
      s.metrics = e.metrics
      this.open.delete(s.step)
      this.done.add(s.step)
      return s
    }
    if (e.via === "event") return undefined
    if (e.name === "StartStep") {
      const s = this.of((e.payload as StepPlan).step)
      if (s !== undefined) s.plan ??= e.payload as StepPlan
    } else if (e.name === "TrainExecution") {
      const ref = e.payload as StepExecutionRef
      const s = this.of(ref.step)
      if (s !== undefined && !s.told.some((r) => r.execution === ref.execution)) s.told.push(ref)
    }
    return undefined
  }

  /** The steps with no metrics, by step. */
  rest(): Array<StepLog> {
    return [...this.open.values()].sort((a, b) => a.step - b.step)
  }
}

/** The journal entries `StepCollector` folds. */
export const STEP_ENTRY_TYPES = ["StartStep", "TrainExecution", "step"]

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

/** The tree of `execution` rebuilt from its call records now (an empty tree when it has none). */
const rebuild = (log: JournalSource, execution: string) => Effect.map(readExecution(log, execution), (r) => r.trajectory.decoder.tree)

/** Checks one completed step against its metrics; adds what it checked to `check`. */
const checkStep = (log: JournalSource, config: RunConfig, s: StepLog, check: MutableCheck) =>
  Effect.gen(function* () {
    const m = s.metrics!
    // The plan the step's metrics carry (durable), else the first StartStep's journal copy (older trainers).
    const plan = m.plan ?? s.plan
    if (m.trees === undefined || m.batchDigests === undefined || plan === undefined) return void check.unrecorded.push(s.step)
    const recorded = new Map(m.trees.map((t) => [t.execution, t]))
    const checkTree = (execution: string, tree: TrajectoryTree) => {
      const r = recorded.get(execution)
      if (r === undefined) return
      recorded.delete(execution)
      check.executions++
      const rebuilt = figuresOf(tree)
      const field = (["calls", "uniqueTokens", "paths", "digest"] as const).find((k) => rebuilt[k] !== r[k])
      if (field === undefined) return
      const node = r.nodes !== undefined ? nodeDifference(tree, r.nodes) : undefined
      check.mismatches.push({ step: s.step, execution, ...(node === undefined ? {} : { node }), what: field, expected: rebuilt[field], recorded: r[field] })
    }
    const planner = new StepPlanner(plan, config.training, config.seed)
    const digests: Array<string> = []
    let firstDifference: TreeMismatch | undefined
    for (const ref of s.told) {
      const tree = yield* rebuild(log, ref.execution)
      checkTree(ref.execution, tree)
      const told = planner.tell(ref, tree)
      if (told._tag !== "Queued") continue
      for (const mb of told.microBatches) {
        const digest = packedBatchDigest(mb.build())
        digests.push(digest)
        if (firstDifference === undefined && mb.index < m.batchDigests.length && digest !== m.batchDigests[mb.index]) {
          firstDifference = { step: s.step, microBatch: mb.index, what: `micro-batch ${mb.index} (executions ${mb.executions.join(", ")})`, expected: digest, recorded: m.batchDigests[mb.index]! }
        }
      }
    }
    // Executions the metrics name but the journal told no TrainExecution of.
    for (const execution of [...recorded.keys()]) checkTree(execution, yield* rebuild(log, execution))
    check.microBatches += Math.max(digests.length, m.microBatches)
    if (firstDifference === undefined && digests.length !== m.microBatches) {
      firstDifference = { step: s.step, microBatch: Math.min(digests.length, m.microBatches), what: `micro-batch count`, expected: digests.length, recorded: m.microBatches }
    }
    if (firstDifference === undefined && m.allBatchesDigest !== undefined && allBatchesDigest(digests) !== m.allBatchesDigest) {
      firstDifference = { step: s.step, what: `micro-batches past the first ${m.batchDigests.length} (allBatchesDigest)`, expected: allBatchesDigest(digests), recorded: m.allBatchesDigest }
    }
    if (firstDifference !== undefined) check.mismatches.push(firstDifference)
  })

interface MutableCheck {
  steps: number
  executions: number
  microBatches: number
  readonly mismatches: Array<TreeMismatch>
  readonly unrecorded: Array<number>
}

/**
 * Checks the trees and micro-batches of every step (see the module comment), one step at a
 * time as the journal completes it: the reader holds the steps in progress and one group's
 * trees, not the run's.
 */
export const checkTrees = (log: JournalSource, config: RunConfig): Effect.Effect<TreeCheck, TransportError> =>
  Effect.gen(function* () {
    const check: MutableCheck = { steps: 0, executions: 0, microBatches: 0, mismatches: [], unrecorded: [] }
    const steps = new StepCollector()
    yield* readEntries(log, { filter: { types: STEP_ENTRY_TYPES } }).pipe(
      Stream.runForEach((e) => {
        const done = steps.add(e)
        if (done === undefined) return Effect.void
        check.steps++
        return checkStep(log, config, done, check)
      })
    )
    check.steps += steps.rest().length
    check.unrecorded.sort((a, b) => a - b)
    check.mismatches.sort((a, b) => a.step - b.step)
    return check
  })
