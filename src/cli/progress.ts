/**
 * Live progress of `gyre train` and `gyre demo`: a bar per warm start (SFT steps) and, per RL
 * step, a bar of the batch's executions finished and one of its micro-batches trained, under a
 * one-screen status (devices with their activity and weights version, throughput, step, score)
 * when stdout is a terminal (bars by `cli-progress`); plain lines when it is not (a line per
 * step done, and a status line every `plainEveryMs`), so CI logs stay readable.
 *
 * The run's figures come from its log as it is written: the policy records and step metrics
 * on `gyre.<run>.sys.>` (a core NATS subscription, folded by `RunView`), and the running step's
 * micro-batch queue, read once a second.
 */
import cliProgress from "cli-progress"
import { Effect, Schema } from "effect"
import { PolicyRecord, StepMetrics } from "../protocols/scheduler.ts"
import { microBatchCounts, RunView, type MicroBatchCounts } from "../replay/status.ts"
import type { NatsShape } from "../runtime/nats.ts"

const decodeRecord = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.toCodecJson(PolicyRecord)))
const decodeMetrics = Schema.decodeUnknownOption(Schema.fromJsonString(StepMetrics))

export interface ProgressOptions {
  /** Bars and a status screen (a terminal), or plain lines. */
  readonly tty: boolean
  readonly write: (line: string) => void
  readonly plainEveryMs?: number
}

/** The line printed when a step is done (both modes). */
export const stepLine = (m: StepMetrics, elapsedS: number) =>
  `step ${String(m.step).padStart(3)}  score ${m.meanScore.toFixed(3)}  loss ${m.loss.toFixed(4)}  entropy ${m.entropy.toFixed(3)}  kl ${m.behaviourKl.toFixed(4)}  tokens ${String(m.tokensTrained).padStart(6)}  devices ${m.devices.length}  ${elapsedS.toFixed(0)} s`

const deviceText = (view: RunView) =>
  [...view.cells.values()].map((c) => `${c.device.replace(/^device\//, "")} ${c.activity} v${c.version}`).join(", ")

/** Shows a run's progress while it runs (see the module doc). */
export class RunProgress {
  private readonly view: RunView
  private readonly pending = new Map<number, PolicyRecord>()
  private readonly started = Date.now()
  private readonly bars: cliProgress.MultiBar | undefined
  private status: cliProgress.SingleBar | undefined
  private readonly stepBars = new Map<number, { rollout: cliProgress.SingleBar; training: cliProgress.SingleBar }>()
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
    const bar = this.bars?.create(total, 0, { label: "warm start      ", unit: "SFT steps" })
    return (step, loss) => {
      if (bar !== undefined) bar.update(step)
      else if (step % 25 === 0 || step === total) this.o.write(`warm start: step ${step}/${total}  loss ${loss.toFixed(4)}`)
    }
  }

  /** Feeds one message of `gyre.<run>.sys.>`. */
  onMessage(subject: string, data: string) {
    if (subject.endsWith(".sys.policy")) {
      const r = decodeRecord(data)
      if (r._tag === "None" || r.value.index <= this.view.index) return
      this.pending.set(r.value.index, r.value)
      // Records are applied in index order; one that arrives early waits for those before it.
      for (let next = this.pending.get(this.view.index + 1); next !== undefined; next = this.pending.get(this.view.index + 1)) {
        this.pending.delete(next.index)
        this.view.apply(next)
      }
    } else if (subject.endsWith(".sys.step")) {
      const m = decodeMetrics(data)
      if (m._tag === "None") return
      this.tokens += m.value.tokensTrained
      this.lastScore = m.value.meanScore
      this.log(stepLine(m.value, this.elapsed()))
    }
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
    return `steps ${v.stepsDone} done, executions ${v.finished} finished / ${v.started - v.finished} running, ${rate.toFixed(0)} tokens trained/s, score ${score} | ${deviceText(v)}`
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
    this.status ??= this.bars.create(1, 0, { label: "", unit: "" }, { format: "{line}" })
    this.status.update(0, { line: this.statusText() })
    // Bars of the dispatched batches, from the last step done on.
    const batches = Math.floor(v.dispatched / Math.max(1, B))
    for (let k = Math.max(0, v.stepsDone - 1); k < batches; k++) {
      let bars = this.stepBars.get(k)
      if (bars === undefined) {
        bars = {
          rollout: this.bars.create(B, 0, { label: `step ${String(k).padStart(3)} rollout`, unit: "executions finished" }),
          training: this.bars.create(1, 0, { label: `step ${String(k).padStart(3)} training`, unit: "micro-batches trained" })
        }
        this.stepBars.set(k, bars)
      }
      bars.rollout.update(Math.max(0, Math.min(B, v.finished - k * B)))
      const mb = this.microBatches
      if (k < v.stepsDone) bars.training.update(bars.training.getTotal())
      else if (mb !== undefined && mb.step === k) {
        bars.training.setTotal(Math.max(1, mb.pending + mb.claimed + mb.done))
        bars.training.update(mb.done)
      }
    }
    for (const [k, bars] of this.stepBars) {
      if (k >= v.stepsDone - 1) continue
      this.bars.remove(bars.rollout)
      this.bars.remove(bars.training)
      this.stepBars.delete(k)
    }
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
    const sub = nats.nc.subscribe(`gyre.${run}.sys.>`, { callback: (err, msg) => void (err === null && progress.onMessage(msg.subject, msg.string())) })
    yield* Effect.addFinalizer(() => Effect.sync(() => (sub.unsubscribe(), progress.stop())))
    const poll = Effect.gen(function* () {
      const step = progress.runningStep()
      progress.setMicroBatches(step === undefined ? undefined : yield* microBatchCounts(nats, run, step))
    })
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(poll, Effect.sleep("1 second"))))
  })
