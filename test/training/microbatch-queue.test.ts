/**
 * The step's micro-batch work queue on a real nats-server: a claim loop takes each micro-batch
 * once, and ends quietly (no failure) when the step's consumer is deleted while it waits for the
 * next one (the step ended; a pull from a deleted consumer is answered "no responders"), or when
 * the step has no consumer at all.
 */
import { Duration, Effect, Exit, Fiber } from "effect"
import { describe, expect, it } from "vitest"
import type { MicroBatchJson } from "../../src/protocols/device.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { claimLoop, closeStepQueue, ensureMicroBatchStream, openStepQueue, publishMicroBatch } from "../../src/training/microbatch-queue.ts"
import { eventually, withSystem } from "../runtime/harness.ts"

const microBatch = (step: number, index: number): MicroBatchJson => ({
  step,
  attempt: 0,
  core: "device/core",
  index,
  version: step,
  executions: [`b${step}-x${index}`],
  completesTokens: 2,
  batch: {
    length: 2,
    tokens: Int32Array.from([1, 2]),
    parents: Int32Array.from([-1, 0]),
    positions: Int32Array.from([0, 1]),
    weights: Float32Array.from([0, 1]),
    advantages: Float32Array.from([0, 1]),
    behaviourLogprobs: Float32Array.from([0, -1]),
    proximalLogprobs: Float32Array.from([0, -1]),
    versions: Int32Array.from([step, step])
  }
})

describe("micro-batch queue", () => {
  it("claims each micro-batch once and ends quietly when the step's consumer is deleted under a waiting pull or between two", async () => {
    const result = await withSystem("mbq", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* ensureMicroBatchStream(system)
      const none = yield* Effect.exit(claimLoop(system, { step: 5, ackWaitMs: 5000, stop: () => false }, () => Effect.void))
      yield* openStepQueue(system, 0, 5000)
      for (const i of [0, 1]) yield* publishMicroBatch(system, microBatch(0, i))
      const claimed: Array<number> = []
      const loop = yield* Effect.forkChild(
        claimLoop(system, { step: 0, ackWaitMs: 5000, stop: () => false }, (c) =>
          Effect.sync(() => claimed.push(c.microBatch.index)).pipe(Effect.andThen(c.ack), Effect.orDie)
        )
      )
      yield* eventually(Effect.sync(() => (claimed.length === 2 ? true : undefined)))
      yield* Effect.sleep(Duration.millis(200)) // the loop waits in its next pull
      yield* closeStepQueue(system, 0)
      const ended = yield* Fiber.await(loop).pipe(Effect.timeout(Duration.seconds(5)))

      // Deleted between two pulls (the step ended while the last claim was handled).
      yield* openStepQueue(system, 1, 5000)
      yield* publishMicroBatch(system, microBatch(1, 0))
      const between = yield* Effect.exit(
        claimLoop(system, { step: 1, ackWaitMs: 5000, stop: () => false }, (c) => c.ack.pipe(Effect.andThen(closeStepQueue(system, 1)), Effect.orDie)).pipe(
          Effect.timeout(Duration.seconds(5))
        )
      )
      return { none, claimed, ended, between }
    }))
    expect(Exit.isSuccess(result.none)).toBe(true)
    expect(result.claimed).toEqual([0, 1])
    expect(Exit.isSuccess(result.ended)).toBe(true)
    expect(result.between).toEqual(Exit.succeed(undefined))
  })
})
