/**
 * An execution run again (its harness runner died with it and the scheduler asked for it again)
 * is rebuilt from its last start: the calls its dead attempt recorded stay in the stream, but are
 * not part of the tree the trainer reads back, and the records of the attempt that counts are.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { ensureTrajectoryStream } from "../../src/protocols/layout.ts"
import { markExecutionStart, readExecution } from "../../src/protocols/trajectories.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"
import { agentCalls, publishExecution } from "./fixtures.ts"

describe("trajectories of an execution run again", () => {
  it("are rebuilt from the execution's last start", async () => {
    const out = await withSystem(
      "restart",
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const treeOf = (execution: string) => readExecution(system, execution).pipe(Effect.map((r) => r.trajectory.decoder.tree))
        yield* ensureTrajectoryStream(system)
        // x0: started, two calls recorded, its runner died; started again, the whole execution ran
        yield* markExecutionStart(system, "x0", "harness-runner/r#1")
        const dead = yield* publishExecution("x0", "t", agentCalls(1).slice(0, 2))
        yield* markExecutionStart(system, "x0", "harness-runner/r#2")
        const again = agentCalls(2).map((c) => ({ ...c, callId: `${c.callId}-again` }))
        const counted = yield* publishExecution("x0", "t", again)
        // x1: the same two attempts with no start marked between them
        yield* publishExecution("x1", "t", agentCalls(1).slice(0, 2))
        yield* publishExecution("x1", "t", again)
        return { dead, counted, x0: yield* treeOf("x0"), x1: yield* treeOf("x1") }
      })
    )
    expect(out.x0.uniqueTokens).toBe(out.counted)
    expect(out.x0.callIndex("c0")).toBeUndefined()
    expect(out.x0.callIndex("c0-again")).toBeDefined()
    expect(out.x1.uniqueTokens).toBeGreaterThan(out.counted)
    expect(out.x1.callIndex("c0")).toBeDefined()
    expect(out.dead).toBeGreaterThan(0)
  })
})
