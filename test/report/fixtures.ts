/**
 * Recorded runs for the status and report tests: short runs of the real live scheduler with the
 * scripted devices and harness runner of test/scheduling (real actors on a real nats-server),
 * and an evaluation run's outcomes on its trajectory stream (as the harness runner writes them).
 */
import { Effect } from "effect"
import { ensureTrajectoryStream, rlLayout } from "../../src/protocols/layout.ts"
import { readRecords } from "../../src/scheduling/records.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import type { ExecutionOutcome } from "../../src/tree/outcome.ts"
import { observed } from "../scheduling/fakes.ts"
import { runConfig, runDone, schedulerOptions, standingBy, startFakes, switchesSettled } from "../scheduling/run.ts"

/**
 * Runs `run` under `policy` on three scripted cells to its end; `during` runs once the first
 * step is journaled, while the run is live. Needs `Nats`.
 */
export const recordedRun = <A>(run: string, policy: string, during: Effect.Effect<A, unknown, ActorSystem>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const system = yield* ActorSystem
      const config = { ...runConfig(run), policy, ...(policy === "async" ? { rolloutCells: 1 } : {}) }
      const seen = observed()
      yield* startFakes(seen)
      yield* standingBy(schedulerOptions(config))
      for (;;) {
        const records = yield* readRecords(system)
        if (records.some((r) => r.record.event._tag === "StepDone")) break
        yield* Effect.sleep("50 millis")
      }
      const seenLive = yield* during
      yield* runDone(system)
      yield* switchesSettled(system)
      return seenLive
    })
  ).pipe(Effect.provide(ActorSystem.layer({ run })))

/** Writes the outcomes of evaluation run `run` (one scored execution per score). Needs `Nats`. */
export const recordedEvaluation = (run: string, scores: ReadonlyArray<number>) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    yield* ensureTrajectoryStream(system)
    for (const [i, score] of scores.entries()) {
      const outcome: ExecutionOutcome = { run, task: `heldout-${i}`, execution: `eval-x${i}`, ended: "finished", evaluation: "scored", score, attempts: 1, detail: "" }
      yield* Effect.promise(() => system.nats.js.publish(rlLayout(run).outcomes(outcome.execution), JSON.stringify(outcome)))
    }
  }).pipe(Effect.provide(ActorSystem.layer({ run })))
