/**
 * Paced devices: a device that computes every token for real, then completes each work item
 * no earlier than a device of the pace's fixed rates would (`src/protocols/pace.ts`). The
 * devices of one machine then take as long as devices that each own their compute, as
 * accelerators do, however they share the machine's cores.
 *
 * `makePacer(pace)` is one device's: `paced(work, amounts)` runs `work`, then waits (a timer,
 * the event loop stays free) until `pacedSeconds(pace, amounts)` have passed since it started.
 * The batcher paces each engine step (`{decode: 1, prefill: n}`: a decode step and n prompt
 * tokens), the training role each `train` call (`pacedTrainer`: `{train: tokens}`). A work item
 * whose real compute took longer than its paced time is an overrun: the pace is then not what
 * the device delivers, and the figures of a paced run read that way are not an accelerator's.
 * `counts()`: work items paced and overruns since the start (`DeviceLoad.pacedWork` /
 * `paceOverruns`; with `device`, also the Prometheus counters `gyre_pace_work_total{device,
 * outcome: in_pace | overrun}`). Without a pace (or for amounts no rate applies to) `paced` is
 * `work`.
 */
import { Duration, Effect, Metric } from "effect"
import type { Trainer } from "../engine/trainer.ts"
import { paceKinds, type Pace, type PaceKind } from "../protocols/pace.ts"

/** How much of each kind a work item does: decode steps, prompt tokens, trained tokens. */
export type PaceAmounts = { readonly [K in PaceKind]?: number }

export interface PaceCounts {
  readonly pacedWork: number
  readonly paceOverruns: number
}

export interface Pacer {
  readonly pace: Pace | undefined
  /** `work`, completing no earlier than its paced time after it started (a failure is not waited for). */
  readonly paced: <A, E, R>(work: Effect.Effect<A, E, R>, amounts: PaceAmounts) => Effect.Effect<A, E, R>
  readonly counts: () => PaceCounts
}

/** Seconds a device of `pace` takes for `amounts`: the sum over the kinds it has a rate for. */
export const pacedSeconds = (pace: Pace | undefined, amounts: PaceAmounts): number =>
  pace === undefined ? 0 : paceKinds.reduce((s, k) => s + (pace[k] === undefined ? 0 : (amounts[k] ?? 0) / pace[k]!), 0)

/** Waits until `seconds` have passed since `started` (`performance.now()` ms); timers may fire early, so it checks. */
const waitUntil = (started: number, seconds: number): Effect.Effect<void> =>
  Effect.suspend(() => {
    const left = seconds * 1000 - (performance.now() - started)
    return left <= 0 ? Effect.void : Effect.sleep(Duration.millis(Math.ceil(left))).pipe(Effect.andThen(waitUntil(started, seconds)))
  })

/** The Prometheus counter of `device`'s paced work items of `outcome`. */
export const paceWorkCounter = (device: string, outcome: "in_pace" | "overrun") =>
  Metric.counter("gyre_pace_work_total", { description: "a paced device's work items, by whether its real compute fit the pace", attributes: { device, outcome }, incremental: true })

export const makePacer = (pace: Pace | undefined, device?: string): Pacer => {
  let pacedWork = 0
  let paceOverruns = 0
  const counters = device === undefined ? undefined : { in_pace: paceWorkCounter(device, "in_pace"), overrun: paceWorkCounter(device, "overrun") }
  return {
    pace,
    paced: (work, amounts) => {
      const seconds = pacedSeconds(pace, amounts)
      if (seconds <= 0) return work
      return Effect.suspend(() => {
        const started = performance.now()
        return Effect.tap(work, () =>
          Effect.suspend(() => {
            pacedWork++
            const overrun = performance.now() - started > seconds * 1000
            if (overrun) paceOverruns++
            const counted = counters === undefined ? Effect.void : Metric.update(overrun ? counters.overrun : counters.in_pace, 1)
            return Effect.andThen(counted, waitUntil(started, seconds))
          })
        )
      })
    },
    counts: () => ({ pacedWork, paceOverruns })
  }
}

/** `trainer` with each `train` call paced by its batch's tokens (the same trainer when not paced). */
export const pacedTrainer = (trainer: Trainer, pacer: Pacer): Trainer => {
  if (pacer.pace?.train === undefined) return trainer
  const paced: Trainer = Object.create(trainer)
  paced.train = (batch, loss, options) => pacer.paced(trainer.train(batch, loss, options), { train: batch.length })
  return paced
}
