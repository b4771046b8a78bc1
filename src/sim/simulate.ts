/**
 * The discrete-event cluster simulator: plays the cluster a policy schedules, with the
 * scenario's semantics, and measures the run.
 *
 * The simulator owns time and physics; the policy owns every decision. Each happening (a cell
 * joins, an execution ends, a switch completes, training drains its data or ends a step, a
 * version reaches the rollout cells) changes the cluster, then becomes a `PolicyEvent`; the
 * policy's actions are applied at once, then free rollout slots take waiting executions (each
 * start is an event too). Events are delivered one at a time, in the order they happened.
 *
 * Model (each choice and its reason is in ARCHITECTURE.md):
 * - rollout slots are one pool of `slots_per_cell` per serving cell; executions start in run
 *   order (paused ones first) and hold a slot for `duration_s`; when a cell leaves rollout its
 *   executions move to free slots elsewhere, and any that do not fit pause, keeping progress;
 * - training is a fluid: the step's cells train its finished executions' tokens at
 *   `train_tokens_per_s_per_cell` each, at most as many cells as the step has micro-batches
 *   (`micro_batch_tokens`; a cell claims whole ones); with nothing left to train they wait for data; the
 *   step's core (it holds the optimizer state and the accumulated gradients) leaves the step
 *   last and rejoins it first;
 * - a step whose batch has finished and is all trained ends `step_update_s` later (its update on
 *   the core; the policy hears the drained state first, as from the live core's last progress);
 *   a core that leaves for rollout during the update serves once it is done;
 * - a version published at t reaches the rollout cells at t + `weight_sync_s`; executions use
 *   the newest version that has arrived when they start;
 * - the makespan is the time the last step ends.
 * An action the cluster cannot carry out (a policy bug) throws a `PolicyViolation`.
 */
import type { Policy } from "../policy/policy.ts"
import type { PolicyAction, PolicyEvent } from "../policy/vocabulary.ts"
import { KeyHeap } from "../common/heap.ts"
import { policyConfigOf, type Executions, type Scenario } from "./scenario.ts"

type ActionOf<Tag extends PolicyAction["_tag"]> = Extract<PolicyAction, { readonly _tag: Tag }>

/** Micro-batches of each step: ceil(its executions' tokens / `microBatchTokens`), at least 1. */
const stepParallelism = (tokens: Float64Array, B: number, steps: number, microBatchTokens: number | undefined): ReadonlyArray<number> =>
  Array.from({ length: steps }, (_, k) =>
    microBatchTokens === undefined ? Infinity : Math.max(1, Math.ceil(tokens.subarray(k * B, (k + 1) * B).reduce((a, t) => a + t, 0) / microBatchTokens))
  )

export class PolicyViolation extends Error {
  readonly _tag = "PolicyViolation"
}

/** Cell states; a cell's timeline is a sequence of them. */
export const CellState = { absent: 0, rollout: 1, training: 2, toTraining: 3, toRollout: 4 } as const
export type CellState = (typeof CellState)[keyof typeof CellState]

export interface RunMetrics {
  readonly policy: string
  readonly makespan_s: number
  readonly steps: number
  /** Useful cell-time (durations / slots + tokens / rate) over cells x makespan. */
  readonly utilization: number
  /** Cell-seconds spent in each role, summed over cells (they add up to cells x makespan). */
  readonly time_per_role_s: { readonly rollout: number; readonly training: number; readonly switching: number }
  readonly switches: number
  /** Mean over executions of (batch - version it started with). */
  readonly mean_staleness: number
  /** Events delivered to the policy. */
  readonly events: number
}

export interface Timeline {
  /** Per cell: alternating [from_s, state, from_s, state, ...]; the last lasts to the makespan. */
  readonly cells: ReadonlyArray<ReadonlyArray<number>>
  /** Time each step's training ended. */
  readonly stepsDoneAt: ReadonlyArray<number>
}

export interface JournalEntry {
  readonly event: PolicyEvent
  readonly actions: ReadonlyArray<PolicyAction>
}

export interface RunResult extends RunMetrics {
  readonly timeline?: Timeline
  readonly journal?: ReadonlyArray<JournalEntry>
}

export interface SimOptions {
  /** Record each cell's role timeline (for `--svg`). */
  readonly timeline?: boolean
  /** Record every event with the actions it produced (for replay checks). */
  readonly journal?: boolean
}

/** Runs `policy` on `scenario` until its last step is trained. */
export const simulate = <S>(
  scenario: Scenario,
  executions: Executions,
  policy: Policy<S>,
  options: SimOptions = {}
): RunResult => new Simulation(scenario, executions, policy, options).run()

class Simulation<S> {
  // scenario
  private readonly C: number
  private readonly S: number
  private readonly B: number
  private readonly steps: number
  private readonly rate: number
  /** Cells that can train step k at once: its micro-batches (Infinity without `micro_batch_tokens`). */
  private readonly parallel: ReadonlyArray<number>
  private readonly update: number
  private readonly n: number
  private readonly dur: Float64Array
  private readonly tok: Float64Array

  // time and events
  private now = 0
  private readonly heap = new KeyHeap()
  private readonly pending: Array<PolicyEvent> = []
  private pendingHead = 0
  private state: S
  private events = 0
  private readonly journal: Array<JournalEntry> | undefined

  // rollout pool
  private capacity = 0
  private running = 0
  private nextStart = 0
  private dispatchedEnd = 0
  private dispatchedBatches = 0
  private readonly finishAt: Float64Array
  private readonly startAt: Float64Array
  private readonly remaining: Float64Array
  private paused: Array<number> = []
  private pausedHead = 0
  private published = 0
  private publishRequested = 0
  private stalenessSum = 0

  // cells
  private readonly cellState: Uint8Array
  private readonly cellSince: Float64Array
  private readonly inStep: Uint8Array
  private readonly switchAt: Float64Array
  private readonly roleTime = new Float64Array(5)
  private switches = 0
  private readonly timeline: Array<Array<number>> | undefined

  // training (a fluid: `trained` tokens at time `t0`, rising at `trainRate` up to `target`)
  private readonly finishedTokens: Float64Array
  private readonly finishedCount: Int32Array
  private trainStep = -1
  private core = -1
  private members = 0
  private trainRate = 0
  private trained = 0
  private t0 = 0
  private target = 0
  private wakeAt = Infinity
  private drainedNotified = false
  /** When the running step's update ends; NaN while none runs. */
  private updateEnd = NaN
  private stepsDone = 0
  private readonly stepsDoneAt: Array<number> = []

  // heap ids: [0, n) executions, n + c switch of cell c, n + C training wake, n + C + 1 update
  // end, n + C + 2 + v publish v
  private readonly idSwitch: number
  private readonly idWake: number
  private readonly idUpdate: number
  private readonly idPublish: number

  constructor(
    private readonly scenario: Scenario,
    executions: Executions,
    private readonly policy: Policy<S>,
    options: SimOptions
  ) {
    this.C = scenario.cells
    this.S = scenario.slots_per_cell
    this.B = scenario.executions_per_step
    this.steps = scenario.steps
    this.rate = scenario.train_tokens_per_s_per_cell
    this.parallel = stepParallelism(executions.tokens, this.B, this.steps, scenario.micro_batch_tokens)
    this.update = scenario.step_update_s ?? 0
    this.n = this.steps * this.B
    this.dur = executions.durations
    this.tok = executions.tokens
    this.finishAt = new Float64Array(this.n).fill(NaN)
    this.startAt = new Float64Array(this.n)
    this.remaining = new Float64Array(this.n)
    this.cellState = new Uint8Array(this.C)
    this.cellSince = new Float64Array(this.C)
    this.inStep = new Uint8Array(this.C)
    this.switchAt = new Float64Array(this.C)
    this.finishedTokens = new Float64Array(this.steps)
    this.finishedCount = new Int32Array(this.steps)
    this.idSwitch = this.n
    this.idWake = this.n + this.C
    this.idUpdate = this.n + this.C + 1
    this.idPublish = this.n + this.C + 2
    this.state = policy.initial(policyConfigOf(scenario))
    this.journal = options.journal ? [] : undefined
    this.timeline = options.timeline ? Array.from({ length: this.C }, () => []) : undefined
  }

  run(): RunResult {
    for (let c = 0; c < this.C; c++) {
      this.setCell(c, CellState.rollout)
      this.capacity += this.S
      this.deliver({ _tag: "CellJoined", cell: c, at: 0 })
      this.drain()
    }
    while (this.stepsDone < this.steps) {
      this.drain()
      if (this.stepsDone >= this.steps) break
      if (this.heap.size === 0) {
        throw new PolicyViolation(
          `${this.policy.name}: stalled at t=${this.now.toFixed(1)}s after ${this.stepsDone} of ${this.steps} steps (nothing left to happen)`
        )
      }
      const t = this.heap.peekKey()
      const id = this.heap.pop()
      this.happen(t, id)
    }
    return this.result()
  }

  // ---- events --------------------------------------------------------------------------------

  private emit(event: PolicyEvent): void {
    this.pending.push(event)
  }

  private drain(): void {
    while (this.pendingHead < this.pending.length && this.stepsDone < this.steps) {
      this.deliver(this.pending[this.pendingHead++]!)
    }
    if (this.pendingHead === this.pending.length) {
      this.pending.length = 0
      this.pendingHead = 0
    }
  }

  private deliver(event: PolicyEvent): void {
    this.events++
    const t = this.policy.step(this.state, event)
    this.state = t.state
    this.journal?.push({ event, actions: t.actions })
    for (let i = 0; i < t.actions.length; i++) this.apply(t.actions[i]!)
    this.fill()
  }

  /** The heap entry (t, id) comes due: change the cluster and emit the event, unless stale. */
  private happen(t: number, id: number): void {
    if (id < this.n) {
      if (this.finishAt[id] !== t) return // paused since
      this.now = t
      this.finish(id)
    } else if (id < this.idWake) {
      const c = id - this.idSwitch
      if (this.switchAt[c] !== t) return
      this.now = t
      const role = this.cellState[c] === CellState.toTraining ? "training" : "rollout"
      this.setCell(c, role === "training" ? CellState.training : CellState.rollout)
      if (role === "rollout") this.capacity += this.S
      this.emit({ _tag: "SwitchDone", cell: c, role, at: t })
    } else if (id === this.idWake) {
      if (this.wakeAt !== t) return
      this.now = t
      this.advance()
      this.reschedule()
    } else if (id === this.idUpdate) {
      if (this.updateEnd !== t) return
      this.now = t
      this.updateEnd = NaN
      this.stepDone()
    } else {
      const v = id - this.idPublish
      this.now = t
      this.published = Math.max(this.published, v)
      this.emit({ _tag: "WeightsPublished", version: v, at: t })
    }
  }

  private finish(i: number): void {
    this.finishAt[i] = NaN
    this.running--
    const b = (i / this.B) | 0
    this.finishedTokens[b] += this.tok[i]!
    this.finishedCount[b]++
    this.emit({ _tag: "ExecutionFinished", execution: i, batch: b, tokens: this.tok[i]!, duration_s: this.dur[i]!, at: this.now })
    if (b === this.trainStep && this.trained >= this.target) {
      // The step was waiting for data: it resumes now.
      this.advance()
      this.reschedule()
    }
  }

  // ---- rollout pool --------------------------------------------------------------------------

  /** Free slots take paused executions first, then dispatched ones in run order. */
  private fill(): void {
    while (this.running < this.capacity) {
      if (this.pausedHead < this.paused.length) {
        const i = this.paused[this.pausedHead++]!
        this.launch(i, this.remaining[i]!)
      } else if (this.nextStart < this.dispatchedEnd) {
        const i = this.nextStart++
        const b = (i / this.B) | 0
        if (b - this.published > this.scenario.max_staleness) {
          throw new PolicyViolation(
            `${this.policy.name}: execution ${i} of batch ${b} would start on version ${this.published}, more than max_staleness ${this.scenario.max_staleness} behind`
          )
        }
        this.stalenessSum += b - this.published
        this.startAt[i] = this.now
        this.launch(i, this.dur[i]!)
        this.emit({ _tag: "ExecutionStarted", execution: i, batch: b, at: this.now })
      } else break
    }
    if (this.pausedHead === this.paused.length && this.pausedHead > 0) {
      this.paused = []
      this.pausedHead = 0
    }
  }

  private launch(i: number, seconds: number): void {
    this.running++
    const t = this.now + seconds
    this.finishAt[i] = t
    this.heap.push(t, i)
  }

  /** Capacity fell below the running executions: the most recently started ones pause. */
  private pauseExcess(): void {
    while (this.running > this.capacity) {
      let victim = -1
      this.heap.forEach((t, id) => {
        if (id < this.n && this.finishAt[id] === t && (victim < 0 || this.startAt[id]! > this.startAt[victim]!)) victim = id
      })
      this.remaining[victim] = this.finishAt[victim]! - this.now
      this.finishAt[victim] = NaN
      this.running--
      this.paused.push(victim)
    }
  }

  // ---- training ------------------------------------------------------------------------------

  /** Brings `trained` up to now. */
  private advance(): void {
    if (this.trainStep >= 0 && this.trained < this.target) {
      this.trained = this.now >= this.wakeAt ? this.target : Math.min(this.target, this.trained + this.trainRate * (this.now - this.t0))
    }
    this.t0 = this.now
  }

  /** After a change of data or rate: schedule the next drain, or report the drained state. */
  private reschedule(): void {
    if (this.trainStep < 0) return
    this.target = this.finishedTokens[this.trainStep]!
    if (this.trained >= this.target) {
      this.wakeAt = Infinity
      const complete = this.finishedCount[this.trainStep] === this.B
      if (complete && this.update === 0) return this.stepDone()
      if (!this.drainedNotified) {
        this.drainedNotified = true
        this.emit({ _tag: "MicroStepDone", step: this.trainStep, trained_tokens: this.trained, at: this.now })
      }
      if (complete && Number.isNaN(this.updateEnd)) {
        this.updateEnd = this.now + this.update
        this.heap.push(this.updateEnd, this.idUpdate)
      }
      return
    }
    this.drainedNotified = false
    this.wakeAt = this.trainRate > 0 ? this.now + (this.target - this.trained) / this.trainRate : Infinity
    if (this.wakeAt < Infinity) this.heap.push(this.wakeAt, this.idWake)
  }

  private setRate(): void {
    this.advance()
    this.trainRate = Math.min(this.members, this.parallel[this.trainStep] ?? Infinity) * this.rate
    this.reschedule()
  }

  private stepDone(): void {
    const k = this.trainStep
    for (let c = 0; c < this.C; c++) this.inStep[c] = 0
    this.trainStep = -1
    this.core = -1
    this.members = 0
    this.trainRate = 0
    this.stepsDone++
    this.stepsDoneAt.push(this.now)
    this.emit({ _tag: "StepDone", step: k, at: this.now })
  }

  // ---- actions -------------------------------------------------------------------------------

  private violation(action: PolicyAction, why: string): PolicyViolation {
    return new PolicyViolation(`${this.policy.name}: cannot ${JSON.stringify(action)} at t=${this.now.toFixed(1)}s: ${why}`)
  }

  private cellOf(action: PolicyAction, c: number): number {
    if (!Number.isInteger(c) || c < 0 || c >= this.C || this.cellState[c] === CellState.absent) {
      throw this.violation(action, `no cell ${c}`)
    }
    return this.cellState[c]!
  }

  private apply(a: PolicyAction): void {
    switch (a._tag) {
      case "Dispatch":
        return this.dispatch(a)
      case "SwitchRole":
        return this.switchRole(a)
      case "StartStep":
        return this.startStep(a)
      case "JoinStep":
        return this.joinStep(a)
      case "PublishWeights":
        return this.publishWeights(a)
    }
  }

  private dispatch(a: ActionOf<"Dispatch">): void {
    if (a.batch !== this.dispatchedBatches || a.batch >= this.steps) {
      throw this.violation(a, `next batch to dispatch is ${this.dispatchedBatches} of ${this.steps}`)
    }
    this.dispatchedBatches++
    this.dispatchedEnd += this.B
  }

  private switchRole(a: ActionOf<"SwitchRole">): void {
    const st = this.cellOf(a, a.cell)
    const from = a.role === "training" ? CellState.rollout : CellState.training
    if (st !== from) throw this.violation(a, "cell is not serving the other role")
    if (from === CellState.rollout) {
      this.capacity -= this.S
      this.pauseExcess()
    } else if (this.inStep[a.cell]) {
      if (a.cell === this.core && this.members > 1) throw this.violation(a, "the core leaves its step last")
      this.inStep[a.cell] = 0
      this.members--
      this.setRate()
    }
    this.switches++
    this.setCell(a.cell, a.role === "training" ? CellState.toTraining : CellState.toRollout)
    const switched = this.now + (a.role === "training" ? this.scenario.switch_to_train_s : this.scenario.switch_to_rollout_s)
    // A core serving again before its step's update is done waits for it (one device's compute).
    const t = a.cell === this.core && this.updateEnd > switched ? this.updateEnd : switched
    this.switchAt[a.cell] = t
    this.heap.push(t, this.idSwitch + a.cell)
  }

  private startStep(a: ActionOf<"StartStep">): void {
    if (this.trainStep >= 0) throw this.violation(a, `step ${this.trainStep} is running`)
    if (a.step !== this.stepsDone || a.step >= this.dispatchedBatches) {
      throw this.violation(a, `next step is ${this.stepsDone}, ${this.dispatchedBatches} batches dispatched`)
    }
    if (!a.cells.includes(a.core)) throw this.violation(a, "the core is not among the cells")
    for (const c of a.cells) {
      if (this.cellOf(a, c) !== CellState.training || this.inStep[c]) throw this.violation(a, `cell ${c} is not a free training cell`)
    }
    for (const c of a.cells) this.inStep[c] = 1
    this.trainStep = a.step
    this.core = a.core
    this.members = a.cells.length
    this.trained = 0
    this.target = 0
    this.drainedNotified = false
    this.setRate()
  }

  private joinStep(a: ActionOf<"JoinStep">): void {
    if (a.step !== this.trainStep) throw this.violation(a, `running step is ${this.trainStep}`)
    if (this.cellOf(a, a.cell) !== CellState.training || this.inStep[a.cell]) {
      throw this.violation(a, `cell ${a.cell} is not a free training cell`)
    }
    if (a.cell !== this.core && !this.inStep[this.core]) throw this.violation(a, "the core rejoins its step first")
    this.inStep[a.cell] = 1
    this.members++
    this.setRate()
  }

  private publishWeights(a: ActionOf<"PublishWeights">): void {
    if (a.version > this.stepsDone || a.version <= this.publishRequested) {
      throw this.violation(a, `${this.stepsDone} steps trained, version ${this.publishRequested} already published`)
    }
    this.publishRequested = a.version
    this.heap.push(this.now + this.scenario.weight_sync_s, this.idPublish + a.version)
  }

  // ---- accounting ----------------------------------------------------------------------------

  private setCell(c: number, st: CellState): void {
    const old = this.cellState[c]!
    this.roleTime[old] += this.now - this.cellSince[c]!
    this.cellState[c] = st
    this.cellSince[c] = this.now
    this.timeline?.[c]!.push(this.now, st)
  }

  private result(): RunResult {
    for (let c = 0; c < this.C; c++) this.roleTime[this.cellState[c]!] += this.now - this.cellSince[c]!
    let duration = 0
    let tokens = 0
    for (let i = 0; i < this.n; i++) {
      duration += this.dur[i]!
      tokens += this.tok[i]!
    }
    const makespan = this.now
    const useful = duration / this.S + tokens / this.rate
    return {
      policy: this.policy.name,
      makespan_s: makespan,
      steps: this.stepsDone,
      utilization: makespan > 0 ? useful / (this.C * makespan) : 1,
      time_per_role_s: {
        rollout: this.roleTime[CellState.rollout]!,
        training: this.roleTime[CellState.training]!,
        switching: this.roleTime[CellState.toTraining]! + this.roleTime[CellState.toRollout]!
      },
      switches: this.switches,
      mean_staleness: this.stalenessSum / this.n,
      events: this.events,
      ...(this.timeline ? { timeline: { cells: this.timeline, stepsDoneAt: this.stepsDoneAt } } : {}),
      ...(this.journal ? { journal: this.journal } : {})
    }
  }
}
