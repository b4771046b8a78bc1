/**
 * Live progress of `gyre train` and `gyre demo`: a bar for the warm start (SFT steps), a bar of
 * the newest batch's executions finished and one of the running step's micro-batches trained
 * (relabelled as the run moves on: batches overlap steps under elastic and async), under a
 * status line (steps, executions, throughput, score, devices with their activity and weights
 * version) when stdout is a terminal (bars by `cli-progress`); a line per step done above them.
 * Plain lines when stdout is not a terminal (a line per step done, and a status line every
 * `plainEveryMs`), so CI logs stay readable.
 *
 * The run's figures come from its log as it is written: the policy records and step metrics
 * (the `policy` and `step` event channels, heard on core NATS and folded by `RunView`), and the running step's
 * micro-batch queue, read once a second.
 */
import cliProgress from "cli-progress"
import { Effect } from "effect"
import type { PolicyRecord, StepMetrics } from "../protocols/scheduler.ts"
import { Events } from "../protocols/topology.ts"
import { microBatchCounts, RunView, type MicroBatchCounts } from "../replay/status.ts"
import { on, subscribeEvents } from "../runtime/channel.ts"
import type { NatsShape } from "../runtime/nats.ts"

export interface ProgressOptions {
  /** Shown in place of the devices until one has joined (default "devices joining"). */
  readonly noDevices?: string
  /** Bars and a status screen (a terminal), or plain lines. */
  readonly tty: boolean
  readonly write: (line: string) => void
  readonly plainEveryMs?: number
}

/** The line printed when a step is done (both modes). */
export const stepLine = (m: StepMetrics, elapsedS: number) =>
  `step ${String(m.step).padStart(3)}  score ${m.meanScore.toFixed(3)}  loss ${m.loss.toFixed(4)}  entropy ${m.entropy.toFixed(3)}  kl ${m.behaviourKl.toFixed(4)}  tokens ${String(m.tokensTrained).padStart(6)}  devices ${m.devices.length}  ${elapsedS.toFixed(0)} s`

/** The run's devices with their activity and weights (`none` until one has joined). */
const deviceText = (view: RunView, none: string) =>
  view.cells.size === 0
    ? none
    : [...view.cells.values()].map((c) => `${c.device.replace(/^device\//, "")} ${c.activity} v${c.version}`).join(", ")

/** Shows a run's progress while it runs (see the module doc). */
export class RunProgress {
  private readonly view: RunView
  private readonly pending = new Map<number, PolicyRecord>()
  private readonly started = Date.now()
  private readonly bars: cliProgress.MultiBar | undefined
  private live: { status: cliProgress.SingleBar; rollout: cliProgress.SingleBar; training: cliProgress.SingleBar } | undefined
  private microBatches: MicroBatchCounts | undefined
  private tokens = 0
  private lastScore: number | undefined
  private lastPlain = 0

  constructor(readonly o: ProgressOptions, readonly executionsPerStep: number) {
    this.view = new RunView(executionsPerStep)
    this.bars = o.tty
      ? new cliProgress.MultiBar({ stream: process.stdout, format: "{label} [{bar}] {value}/{total} {unit}", hideCursor: true, clearOnComplete: false, barsize: 30, fps: 5 }, cliProgress.Presets.shades_classic)
      : undefined
  }

  private elapsed() {
    return (Date.now() - this.started) / 1000
  }

  /** A bar for the warm start's SFT steps; call the result with each step done. */
  warmStart(total: number): (step: number, loss: number) => void {
    let bar: cliProgress.SingleBar | undefined
    return (step, loss) => {
      if (this.bars !== undefined) {
        bar ??= this.bars.create(total, 0, { label: "warm start      ", unit: "SFT steps" })
        bar.update(step)
      }
      else if (step % 25 === 0 || step === total) this.o.write(`warm start: step ${step}/${total}  loss ${loss.toFixed(4)}`)
    }
  }

  /** Feeds one policy record (`gyre.<run>.sys.policy`). */
  onPolicy(record: PolicyRecord) {
    if (record.index <= this.view.index) return
    this.pending.set(record.index, record)
    // Records are applied in index order; one that arrives early waits for those before it.
    for (let next = this.pending.get(this.view.index + 1); next !== undefined; next = this.pending.get(this.view.index + 1)) {
      this.pending.delete(next.index)
      this.view.apply(next)
    }
    this.render()
  }

  /** Feeds one step's metrics (`gyre.<run>.sys.step`). */
  onStep(m: StepMetrics) {
    this.tokens += m.tokensTrained
    this.lastScore = m.meanScore
    this.log(stepLine(m, this.elapsed()))
    this.render()
  }

  private log(line: string) {
    if (this.bars !== undefined) this.bars.log(`${line}\n`)
    else this.o.write(line)
  }

  private statusText() {
    const v = this.view
    const s = this.elapsed()
    const rate = s > 0 ? this.tokens / s : 0
    const score = this.lastScore === undefined ? "-" : this.lastScore.toFixed(3)
    return `steps ${v.stepsDone} done, executions ${v.finished} finished / ${v.started - v.finished} running, ${rate.toFixed(0)} tokens trained/s, score ${score} | ${deviceText(v, this.o.noDevices ?? "devices joining")}`
  }

  /** The running step's micro-batch counts (read by the caller once a second). */
  setMicroBatches(counts: MicroBatchCounts | undefined) {
    this.microBatches = counts
    this.render()
  }

  private render() {
    const v = this.view
    const B = this.executionsPerStep
    if (this.bars === undefined) {
      if (Date.now() - this.lastPlain < (this.o.plainEveryMs ?? 10_000)) return
      this.lastPlain = Date.now()
      return this.o.write(`progress: ${this.statusText()}`)
    }
    this.live ??= {
      status: this.bars.create(1, 0, { line: "" }, { format: "{line}" }),
      rollout: this.bars.create(B, 0, { label: "rollout         ", unit: "" }),
      training: this.bars.create(1, 0, { label: "training        ", unit: "" })
    }
    const { status, rollout, training } = this.live
    status.update(0, { line: this.statusText() })
    // Rollout: the newest dispatched batch; training: the running step, else the last one done.
    const batch = Math.max(0, Math.floor(v.dispatched / Math.max(1, B)) - 1)
    rollout.update(Math.max(0, Math.min(B, v.finished - batch * B)), { label: `batch ${String(batch).padStart(3)} rollout`, unit: "executions finished" })
    const step = v.running?.step ?? Math.max(0, v.stepsDone - 1)
    const mb = this.microBatches
    if (v.running === undefined && v.stepsDone === 0) training.update(0, { label: `step    0 waiting`, unit: "micro-batches trained" })
    else if (v.running === undefined) training.update(training.getTotal(), { label: `step  ${String(step).padStart(3)} trained`, unit: "micro-batches" })
    else if (mb !== undefined && mb.step === step) {
      training.setTotal(Math.max(1, mb.pending + mb.claimed + mb.done))
      training.update(mb.done, { label: `step  ${String(step).padStart(3)} training`, unit: "micro-batches trained" })
    } else training.update(0, { label: `step  ${String(step).padStart(3)} training`, unit: "micro-batches trained" })
  }

  /** The step being trained, if any (for the micro-batch poll). */
  runningStep(): number | undefined {
    return this.view.running?.step
  }

  stop() {
    this.bars?.stop()
  }
}

/**
 * Follows run `run` on `nats` for the lifetime of the scope: subscribes to its system events and
 * polls the running step's micro-batch queue once a second.
 */
export const followRun = (progress: RunProgress, nats: NatsShape, run: string) =>
  Effect.gen(function* () {
    yield* Effect.addFinalizer(() => Effect.sync(() => progress.stop()))
    yield* subscribeEvents(nats, run, [on(Events.policy, (r) => progress.onPolicy(r)), on(Events.step, (m) => progress.onStep(m))])
    const poll = Effect.gen(function* () {
      const step = progress.runningStep()
      progress.setMicroBatches(step === undefined ? undefined : yield* microBatchCounts(nats, run, step))
    })
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(poll, Effect.sleep("1 second"))))
  })
