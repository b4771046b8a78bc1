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
 *   run finishes (with the default GYRE_DEAD_AFTER_MS; see NATS_DEAD_AFTER_MS);
 * - kill -9 of the scheduler alone: `gyre train --no-scheduler` hosts none, two `gyre node
 *   --scheduler` candidates stand by, and the leader's node is killed; the other takes the
 *   lapsed lease, replays the journal and finishes the run as the next term.
 *
 * Not here: the core's node (it is the main node: killing it stops the run, which `--resume`
 * continues). The file takes about 2 min alone; the tests run in the normal suite except where
 * they say.
 */
import { Effect, Stream } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import type { RunConfig } from "../../src/protocols/run.ts"
import { schedulerRef } from "../../src/actors/scheduler.ts"
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
 * and kills a node the moment a record makes its device (`device/<node>.cpu0`, one of `nodes`)
 * the core of a step (`StartStep` with its cell as the core) or a satellite (`JoinStep` of its cell).
 */
const killWhen = (role: "core" | "satellite", run: string, url: string, nodes: Readonly<Record<string, NodeProcess>>) =>
  Effect.promise(() =>
    asClient(run, url, undefined, Effect.gen(function* () {
      const system = yield* ActorSystem
      const config = (yield* eventually(readRunConfig(system), 150_000, 100)) as RunConfig
      const cells = new Map<number, string>()
      let stepsDone = 0
      let hit: string | undefined
      const aimed = (r: PolicyRecord) => {
        if (r.event._tag === "CellJoined" && r.device !== undefined) cells.set(r.event.cell, r.device)
        if (r.event._tag === "StepDone") stepsDone++
        // a core starts a step; a satellite joins a running one or starts with it (colocate)
        const aimedCells = r.actions.flatMap((a) =>
          a._tag === "StartStep" ? (role === "core" ? [a.core] : a.cells.filter((c) => c !== a.core)) : a._tag === "JoinStep" && role === "satellite" ? [a.cell] : []
        )
        hit = aimedCells.map((c) => cells.get(c)).find((d) => d !== undefined && nodes[nodeOf(d)] !== undefined)
        return stepsDone < config.policyConfig.steps && hit !== undefined
      }
      yield* readStored(system.nats, system.layout.journalStream, { seq: 1 }, system.layout.sys("policy"), true).pipe(
        Stream.map((m) => m.json() as PolicyRecord),
        Stream.takeUntil(aimed),
        Stream.runDrain,
        Effect.timeout("150 seconds")
      )
      return hit!
    }))
  ).pipe(Effect.flatMap((device) => killOther(nodes[nodeOf(device)]!, device)))

/** The node of a device `device/<node>.<backend><i>`. */
const nodeOf = (device: string) => device.slice("device/".length).split(".")[0]!

describe("run-level faults during gyre train", () => {
  it("kill -9 of the second node (a device of the run): the run finishes on the main node, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun("train: second node kill -9", "chaos-node", 1, {}, (_server, { other }) =>
      killOther(other!).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at))))
    )
    expectCellLost(j, killedAt)
  })

  // Only in `npm run test:chaos` (GYRE_CHAOS_FAULTS set): whether the second cell joins a step
  // at all depends on the run's timing (in 1 of 3 CI runs it never did; under colocate too, in 1
  // of 1 loaded CI run, though 2 of 2 local runs passed), so in the plain suite it is skipped,
  // not counted as passing.
  it.runIf(process.env.GYRE_CHAOS_FAULTS !== undefined)("kill -9 of the second node while its device trains as a satellite of the step: the step and the run finish, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun(
      "train: second node kill -9 as a training satellite",
      "chaos-satellite",
      3,
      {},
      (server, { other }) => killWhen("satellite", "chaos-satellite", server.url, { other: other! }).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at)))),
      { afterStep0: false, steps: 5 }
    )
    expect(roleAt(j, OTHER_DEVICE, killedAt)).toBe("training satellite")
    expectCellLost(j, killedAt)
  })

  // The core is the first cell to join, so `gyre train --devices 0` hosts none and two device
  // nodes join: the test kills whichever one's device starts a step as its core.
  it("kill -9 of the node whose device is the core of the running step (gyre train --devices 0, two device nodes): the step starts again on the other cell, the run finishes, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killed = { at: 0, device: "" }
    const j = await faultedRun(
      "train: the training core's node kill -9",
      "chaos-core",
      5,
      {},
      (server, nodes) => killWhen("core", "chaos-core", server.url, nodes).pipe(Effect.tap((k) => Effect.sync(() => (killed = k)))),
      { afterStep0: false, trainArgs: ["--devices", "0"], nodes: { other: ["--devices", "1"], spare: ["--devices", "1"] } }
    )
    expect(roleAt(j, killed.device, killed.at)).toBe("training core")
    expectCellLost(j, killed.at, killed.device)
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

  it("kill -9 of the scheduler's node (two standby candidates, none in gyre train): the other takes over, the run finishes, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let leaderTerm = 0
    const j = await faultedRun(
      "train: scheduler kill -9 (a standby takes over)",
      "chaos-scheduler",
      4,
      {},
      (server, nodes) =>
        Effect.gen(function* () {
          const status = yield* Effect.promise(() => asClient("chaos-scheduler", server.url, undefined, Effect.gen(function* () {
            const system = yield* ActorSystem
            return yield* eventually(system.ask(schedulerRef, "Status", undefined, { timeoutMs: 2000 }).pipe(Effect.option, Effect.map((o) => (o._tag === "Some" ? o.value : undefined))), 60_000, 250)
          })))
          const [leader, term] = status.leader.split("#") as [string, string]
          leaderTerm = Number(term)
          const victim = nodes[leader]
          if (victim === undefined) return yield* Effect.die(new Error(`the scheduler leads on ${leader}, not on a standby node`))
          const at = Date.now()
          victim.child.kill("SIGKILL")
          yield* Effect.promise(() => victim.exited)
          return { at, detail: () => `leader ${leader} (term ${term}) killed after ${status.stepsDone} steps` }
        }),
      // Steps enough that the run cannot end between the Status answer and the kill (it did once:
      // a 4-step run journaled run-done under the leader it was about to lose).
      { steps: 6, trainArgs: ["--no-scheduler"], nodes: { other: ["--devices", "1"], "sched-a": ["--scheduler"], "sched-b": ["--scheduler"] } }
    )
    // The killed leader's term wrote records, and a newer one finished the run.
    expect(j.audit.terms).toContain(leaderTerm)
    expect(Math.max(...j.audit.terms)).toBeGreaterThan(leaderTerm)
  })
})
