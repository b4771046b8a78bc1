/**
 * Training units: each execution of a step serialised once, in canonical DFS preorder,
 * with the per-token loss weights of one of the two training modes (ARCHITECTURE.md,
 * "Trajectory trees", has the math):
 *
 * - `exact`: the whole tree; a generated token t gets weight c(t) / (E * N_e), c(t) the
 *   number of root-to-leaf paths through t and N_e = sum over the execution's generated
 *   tokens of c(t). The gradient equals training every path as its own sequence with the
 *   loss averaged over the execution's path tokens, then over the E executions.
 * - `sampled`: the union of the paths bounded dedup sampling chose; each generated token in
 *   it is trained once, weight 1 / (E * T_e), T_e the execution's trained tokens.
 *
 * A unit is a forest in preorder: `parents[i] < i`, positions are depths in the tree, so
 * attention restricted to ancestors sees exactly each token's own prefix. Executions with
 * no trainable token produce no unit and do not count in E, unless the caller fixes E
 * (`scaleExecutions`: a streaming trainer makes the units of a step group by group and
 * scales them all by the step's planned executions).
 *
 * Advantages are per token: an execution's own (execution credit), or with `callAdvantages`
 * (call credit) the mean advantage of the calls that generated the token (one call, unless
 * several sampled the same tokens from the same prefix).
 *
 * `tokensConstant` replaces every execution's own N_e (or T_e) by the same constant: the loss
 * is then a sum over tokens, not a mean per execution (Dr. GRPO's fix of GRPO's length bias:
 * with a per-execution mean, each token of a long execution with a negative advantage is
 * pushed down less than one of a short execution).
 */
import { Schema } from "effect"
import { samplePaths, seedFor, type PathSample } from "./sample.ts"
import { ROOT, type TrajectoryTree } from "./tree.ts"

/** How a step trains its trees. */
export const TrainingMode = Schema.Union([
  Schema.TaggedStruct("exact", {}),
  Schema.TaggedStruct("sampled", {
    /** J_max: paths per execution. */
    maxPaths: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
    seed: Schema.Int
  })
])
export type TrainingMode = typeof TrainingMode.Type

/** One execution's tokens to train, before packing. */
export interface TrainingUnit {
  readonly execution: string
  readonly length: number
  readonly tokens: Int32Array
  readonly parents: Int32Array
  readonly positions: Int32Array
  /** Loss weight of the term predicting `tokens[i]`: count * lossScale for generated tokens, else 0. */
  readonly weights: Float32Array
  readonly behaviourLogprobs: Float32Array
  readonly versions: Int32Array
  /** Advantage of the term predicting `tokens[i]` (call credit: 0 where the weight is 0). */
  readonly advantages: Float32Array
  /** 1 / (E * N_e) (exact) or 1 / (E * T_e) (sampled); 1 / (E * tokensConstant) when given. */
  readonly lossScale: number
}

/** An execution of the step: its tree and group-relative advantage. */
export interface StepExecution {
  readonly execution: string
  readonly tree: TrajectoryTree
  readonly advantage: number
  /** Call credit: each call's advantage, by call index (replaces `advantage` on generated tokens). */
  readonly callAdvantages?: ArrayLike<number>
}

export interface StepUnits {
  readonly units: ReadonlyArray<TrainingUnit>
  /** E: executions that train (have trainable tokens). */
  readonly executions: number
  /** Per execution, the paths sampling chose (sampled mode only). */
  readonly samples: ReadonlyMap<string, PathSample>
}

/** Per node: root-to-leaf paths through it (leaves below it, 1 for a leaf). */
export const pathCounts = (tree: TrajectoryTree, order: Int32Array = tree.preorder()): Float64Array => {
  const counts = new Float64Array(tree.nodeCount)
  for (let i = order.length - 1; i >= 0; i--) {
    const node = order[i]!
    if (counts[node] === 0) counts[node] = 1
    const parent = tree.parentOf(node)
    if (parent !== ROOT) counts[parent] = counts[parent]! + counts[node]!
  }
  return counts
}

export const stepUnits = (executions: ReadonlyArray<StepExecution>, mode: TrainingMode, scaleExecutions?: number, tokensConstant?: number): StepUnits => {
  const samples = new Map<string, PathSample>()
  const plans = executions.map((step) => {
    const order = step.tree.preorder()
    const trainable = step.tree.trainableCounts()
    if (mode._tag === "exact") {
      const counts = pathCounts(step.tree, order)
      let total = 0
      for (const node of order) total += counts[node]! * trainable[node]!
      return { step, order, nodeWeights: counts, total }
    }
    const sample = samplePaths(step.tree, mode.maxPaths, seedFor(mode.seed, step.execution))
    samples.set(step.execution, sample)
    const nodeWeights = Float64Array.from(sample.inUnion)
    return { step, order: order.filter((node) => sample.inUnion[node] === 1), nodeWeights, total: sample.trainedTokens }
  })
  const training = plans.filter((plan) => plan.total > 0)
  const E = scaleExecutions ?? training.length
  const units = training.map(({ step, order, nodeWeights, total }) => serialize(step, order, nodeWeights, 1 / (E * (tokensConstant ?? total))))
  return { units, executions: training.length, samples }
}

/** Per tree token (at `base[node] + depth - depthOf(node)`), the mean advantage of the calls whose output holds it. */
const generatedAdvantages = (tree: TrajectoryTree, callAdvantages: ArrayLike<number>) => {
  const base = new Int32Array(tree.nodeCount + 1)
  for (let n = 0; n < tree.nodeCount; n++) base[n + 1] = base[n]! + tree.lengthOf(n)
  const sum = new Float64Array(base[tree.nodeCount]!)
  const count = new Int32Array(sum.length)
  for (let c = 0; c < tree.callCount; c++) {
    const { promptLength, length } = tree.call(c)
    let node = length > promptLength ? tree.locate(c, length - 1).node : ROOT
    for (let last = length - 1; last >= promptLength; node = tree.parentOf(node)) {
      const first = tree.depthOf(node)
      for (let d = Math.max(first, promptLength); d <= last; d++) {
        sum[base[node]! + d - first]! += callAdvantages[c]!
        count[base[node]! + d - first]!++
      }
      last = first - 1
    }
  }
  return { base, mean: (i: number) => (count[i]! > 0 ? sum[i]! / count[i]! : 0) }
}

/** Serialises `order` (a preorder of nodes closed under parents) into a unit. */
const serialize = (step: StepExecution, order: Int32Array, nodeWeights: Float64Array, lossScale: number): TrainingUnit => {
  const { tree } = step
  let length = 0
  for (const node of order) length += tree.lengthOf(node)
  const tokens = new Int32Array(length)
  const parents = new Int32Array(length)
  const positions = new Int32Array(length)
  const weights = new Float32Array(length)
  const behaviourLogprobs = new Float32Array(length)
  const versions = new Int32Array(length)
  const advantages = new Float32Array(length)
  const perToken = step.callAdvantages === undefined ? undefined : generatedAdvantages(tree, step.callAdvantages)
  const lastIndex = new Int32Array(tree.nodeCount)
  let k = 0
  for (const node of order) {
    const parent = tree.parentOf(node)
    const first = tree.depthOf(node)
    const nodeVersions = tree.versionsOf(node)
    const weight = nodeWeights[node]! * lossScale
    tokens.set(tree.tokensOf(node), k)
    behaviourLogprobs.set(tree.logprobsOf(node), k)
    versions.set(nodeVersions, k)
    for (let j = 0; j < nodeVersions.length; j++, k++) {
      parents[k] = j > 0 ? k - 1 : parent === ROOT ? -1 : lastIndex[parent]!
      positions[k] = first + j
      weights[k] = nodeVersions[j]! >= 0 && first + j > 0 ? weight : 0
      advantages[k] = perToken === undefined ? step.advantage : weights[k] === 0 ? 0 : perToken.mean(perToken.base[node]! + j)
    }
    lastIndex[node] = k - 1
  }
  return { execution: step.execution, length, tokens, parents, positions, weights, behaviourLogprobs, versions, advantages, lossScale }
}
