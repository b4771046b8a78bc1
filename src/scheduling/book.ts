/**
 * The scheduler's book: what it must know beyond the policy's state to carry out the policy's
 * actions: the cell map, the dispatcher's queue and slots, the finished executions of batches
 * not yet trained, the running step (its core and members) and the versions asked for and
 * published.
 *
 * The book changes only by folding journaled records in (`apply`: the event, then the actions),
 * so a standby that replays the journal rebuilds it exactly; the shell's effects
 * (`actions.ts`) read it but never write it. Inputs are checked against it before they become
 * events (`accepts*`): a redelivered or repeated completion is not an event twice.
 */
import type { ExecutionOutcome } from "../tree/outcome.ts"
import type { PolicyRecord } from "../protocols/scheduler.ts"
import { batchPlan, type PlannedExecution, type RunConfig } from "../protocols/run.ts"
import { CellMap } from "./cells.ts"
import { Dispatcher } from "./dispatcher.ts"

export interface Finished {
  readonly plan: PlannedExecution
  readonly tokens: number
  /** Known live (from the runner's answer); read back from the trajectory stream after a takeover. */
  readonly outcome: ExecutionOutcome | undefined
}

/** The running step: its core, and how each member entered it (`start`: the core; `join`). */
export interface StepView {
  readonly step: number
  /** The journal index of the record that started this attempt at the step (`StepPlan.attempt`). */
  readonly attempt: number
  readonly core: number
  readonly coreDevice: string
  readonly members: Map<number, "start" | "join">
}

/** What a record carries for the book beside the policy's event (not journaled with it). */
export interface RecordContext {
  readonly outcome?: ExecutionOutcome
}

export class Book {
  readonly cells = new CellMap()
  readonly dispatcher = new Dispatcher()
  /** Finished executions of batches not yet trained, by batch. */
  readonly finished = new Map<number, Array<Finished>>()
  step: StepView | undefined = undefined
  stepsDone = 0
  trainedTokens = 0
  /** Newest version a `PublishWeights` asked for (it exists in the object store). */
  requested = 0
  /** Newest version every rollout cell has loaded. */
  published = 0

  constructor(
    readonly config: RunConfig,
    readonly trainTasks: ReadonlyArray<string>
  ) {}

  get done(): boolean {
    return this.stepsDone >= this.config.policyConfig.steps
  }

  /** The rollout slots free to take an execution: serving cells x slots per cell. */
  get slots(): number {
    return this.cells.serving * this.config.policyConfig.slots_per_cell
  }

  plan(batch: number): Array<PlannedExecution> {
    return batchPlan(this.config, this.trainTasks, batch)
  }

  finishedOf(batch: number): ReadonlyArray<Finished> {
    return this.finished.get(batch) ?? []
  }

  /** Folds a journaled record in: its event, then its actions. */
  apply(record: PolicyRecord, context: RecordContext = {}): void {
    this.observe(record, context)
    for (const a of record.actions) {
      switch (a._tag) {
        case "Dispatch":
          this.dispatcher.queue(this.plan(a.batch))
          break
        case "SwitchRole":
          this.cells.startSwitch(a.cell, a.role, record.index)
          this.step?.members.delete(a.cell)
          break
        case "StartStep": {
          const members = new Map<number, "start" | "join">(a.cells.map((c) => [c, c === a.core ? "start" : "join"]))
          this.step = { step: a.step, attempt: record.index, core: a.core, coreDevice: this.cells.get(a.core)?.device ?? "", members }
          this.trainedTokens = 0
          break
        }
        case "JoinStep":
          this.step?.members.set(a.cell, "join")
          break
        case "PublishWeights":
          this.requested = Math.max(this.requested, a.version)
          break
      }
    }
  }

  private observe(record: PolicyRecord, context: RecordContext): void {
    const e = record.event
    switch (e._tag) {
      case "CellJoined":
        this.cells.join(e.cell, record.device ?? "", record.incarnation)
        return
      case "CellLost":
        this.cells.lose(e.cell)
        this.step?.members.delete(e.cell)
        if (this.step?.core === e.cell) {
          // The core is gone with the step's gradients: the policy starts the step again.
          this.step = undefined
          this.trainedTokens = 0
        }
        return
      case "ExecutionStarted":
        this.dispatcher.start(e.execution, e.at)
        return
      case "ExecutionFinished": {
        const ran = this.dispatcher.finish(e.execution)
        if (ran === undefined) return
        const list = this.finished.get(e.batch) ?? []
        list.push({ plan: ran.plan, tokens: e.tokens, outcome: context.outcome })
        this.finished.set(e.batch, list)
        return
      }
      case "SwitchDone":
        this.cells.endSwitch(e.cell, e.role)
        return
      case "MicroStepDone":
        if (e.step === this.step?.step) this.trainedTokens = e.trained_tokens
        return
      case "StepDone":
        this.finished.delete(e.step)
        this.step = undefined
        this.stepsDone = e.step + 1
        this.trainedTokens = 0
        return
      case "WeightsPublished":
        this.published = Math.max(this.published, e.version)
        return
    }
  }

  // ---- inputs checked before they become events -------------------------------------------

  /** A switch completion is new when the cell is switching to `role` by the record `index`. */
  acceptsSwitch(cell: number, role: string, index: number): boolean {
    const c = this.cells.get(cell)
    return c !== undefined && c.switching && c.role === role && c.switchIndex === index
  }

  acceptsWeights(version: number): boolean {
    return version > this.published && version <= this.requested
  }

  /** Whether `sender` may report on the running step: its core (a report with no sender is taken as the core's). */
  private fromCore(sender: string | undefined): boolean {
    return sender === undefined || sender === this.step?.coreDevice
  }

  acceptsProgress(step: number, trainedTokens: number, sender?: string): boolean {
    return this.step?.step === step && trainedTokens > this.trainedTokens && this.fromCore(sender)
  }

  acceptsStepDone(step: number, sender?: string): boolean {
    return this.step?.step === step && this.fromCore(sender)
  }
}
