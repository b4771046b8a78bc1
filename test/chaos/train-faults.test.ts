/**
 * Run-level faults during `gyre train` (issue 13, "Chaos suite"), on the run of
 * `train-run.ts` (the main node: `gyre train --devices 1` with core device, scheduler,
 * gateway and harness runner; a second node `gyre node --devices 1` joining it):
 *
 * - kill -9 of the second node; its device's role at that moment (rollout cell, training core
 *   or satellite, switching) is read from the policy records: the run finishes without it;
 * - kill -9 of the second node at the first moment the live journal shows its device training
 *   as a satellite of the running step (a fault aimed at a role): the step finishes on the core;
 * - kill -9 of the nats-server, restarted by its supervisor on the same store and port: the
 *   run finishes (with the default GYRE_DEAD_AFTER_MS; see NATS_DEAD_AFTER_MS).
 *
 * Not here: the core's node (it is the main node: killing it stops the run, which `--resume`
 * continues). The file takes about 2 min alone; the tests run in the normal suite except where
 * they say.
 */
import { Effect, Stream } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import type { RunConfig } from "../../src/protocols/run.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { readRunConfig } from "../../src/scheduling/records.ts"
import { eventually, type NodeProcess } from "../runtime/harness.ts"
import { asClient } from "./helpers.ts"
import { OTHER_DEVICE, expectCellLost, faultedRun, initCheckpoint, killChildren, killOther, roleAt } from "./train-run.ts"

/**
 * GYRE_DEAD_AFTER_MS of the processes of the nats-server fault: the runtime's default (5 s)
 * unless GYRE_CHAOS_DEAD_AFTER_MS says otherwise. For about 5 s after the server is back the
 * clients' requests still time out; liveness must not take that for death (ARCHITECTURE.md).
 */
const NATS_DEAD_AFTER_MS = Number(process.env.GYRE_CHAOS_DEAD_AFTER_MS ?? 5_000)

beforeAll(initCheckpoint)
afterEach(killChildren)

/**
 * Follows the run's policy records from the first (an ordered consumer that waits for new ones)
 * and kills the second node the moment a record makes its device a satellite of a step
 * (`JoinStep` of its cell).
 */
const killOtherAsSatellite = (run: string, url: string, other: NodeProcess) =>
  Effect.promise(() =>
    asClient(run, url, undefined, Effect.gen(function* () {
      const system = yield* ActorSystem
      const config = (yield* eventually(readRunConfig(system), 150_000, 100)) as RunConfig
      let cell: number | undefined
      let stepsDone = 0
      const satellite = (r: PolicyRecord) => {
        if (r.event._tag === "CellJoined" && r.device === OTHER_DEVICE) cell = r.event.cell
        if (r.event._tag === "StepDone") stepsDone++
        return stepsDone < config.policyConfig.steps && r.actions.some((a) => a._tag === "JoinStep" && a.cell === cell)
      }
      yield* readStored(system.nats, system.layout.journalStream, { seq: 1 }, system.layout.sys("policy"), true).pipe(
        Stream.map((m) => m.json() as PolicyRecord),
        Stream.takeUntil(satellite),
        Stream.runDrain,
        Effect.timeout("150 seconds")
      )
    }))
  ).pipe(Effect.andThen(killOther(other)))

describe("run-level faults during gyre train", () => {
  it("kill -9 of the second node (a device of the run): the run finishes on the main node, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun("train: second node kill -9", "chaos-node", 1, {}, (_server, { other }) =>
      killOther(other!).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at))))
    )
    expectCellLost(j, killedAt)
  })

  // Only in `npm run test:chaos` (GYRE_CHAOS_FAULTS set): whether the second cell joins a step
  // at all depends on the run's timing (in 1 of 3 CI runs it never did), so in the plain suite
  // it is skipped, not counted as passing.
  it.runIf(process.env.GYRE_CHAOS_FAULTS !== undefined)("kill -9 of the second node while its device trains as a satellite of the step: the step and the run finish, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun(
      "train: second node kill -9 as a training satellite",
      "chaos-satellite",
      3,
      {},
      (server, { other }) => killOtherAsSatellite("chaos-satellite", server.url, other!).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at)))),
      { afterStep0: false, steps: 5 }
    )
    expect(roleAt(j, OTHER_DEVICE, killedAt)).toBe("training satellite")
    expectCellLost(j, killedAt)
  })

  it("kill -9 of the nats-server (restarted on the same store and port): the run finishes, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    await faultedRun("train: nats-server kill -9 (restarted)", "chaos-nats", 2, { GYRE_DEAD_AFTER_MS: String(NATS_DEAD_AFTER_MS) }, (server) =>
      Effect.gen(function* () {
        const at = Date.now()
        const restarts = server.restarts
        process.kill(server.pid, "SIGKILL")
        yield* eventually(Effect.sync(() => (server.restarts > restarts ? true : undefined)), 30_000)
        const restartedS = ((Date.now() - at) / 1000).toFixed(1)
        return { at, detail: () => `server back after ${restartedS} s` }
      })
    )
  })
})
