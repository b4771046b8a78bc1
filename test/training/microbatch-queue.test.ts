/**
 * The step's micro-batch work queue on a real nats-server: a claim loop takes each micro-batch
 * once, and ends quietly (no failure) when the step's consumer is deleted while it waits for the
 * next one (the step ended; a pull from a deleted consumer is answered "no responders"), or when
 * the step has no consumer at all; a message that is not a micro-batch reference goes to the
 * device's dead letters with the reason. A micro-batch of several MiB goes through as an object of the
 * run's micro-batch store with a message of a few hundred bytes: claimed and read back intact,
 * handed back (nak) and redelivered, redelivered after its ack wait lapses, gone once acknowledged,
 * and its object gone with the step; no message of the queue or the store exceeds `max_payload`.
 */
import { Duration, Effect, Exit, Fiber, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { packedBatchDigest, type PackedBatch } from "../../src/common/packed-batch.ts"
import type { MicroBatchRef } from "../../src/protocols/device.ts"
import { rlLayout } from "../../src/protocols/layout.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { claimLoop, closeStepQueue, ensureMicroBatchStream, openStepQueue, publishMicroBatch, type Claim } from "../../src/training/microbatch-queue.ts"
import { openMicroBatchStore } from "../../src/training/microbatch-store.ts"
import { eventually, withSystem } from "../runtime/harness.ts"

/** A chain of `n` tokens whose arrays all differ (so a swapped or shifted array shows). */
const chain = (n: number, step: number): PackedBatch => ({
  length: n,
  tokens: Int32Array.from({ length: n }, (_, i) => (i * 7919) % 50_000),
  parents: Int32Array.from({ length: n }, (_, i) => i - 1),
  positions: Int32Array.from({ length: n }, (_, i) => i),
  weights: Float32Array.from({ length: n }, (_, i) => (i === 0 ? 0 : 1 / n)),
  advantages: Float32Array.from({ length: n }, (_, i) => Math.sin(i)),
  behaviourLogprobs: Float32Array.from({ length: n }, (_, i) => -((i % 13) + 1) / 7),
  proximalLogprobs: new Float32Array(n).fill(Number.NaN),
  versions: Int32Array.from({ length: n }, (_, i) => (i % 3 === 0 ? -1 : step))
})

const device = { kind: "device", id: "d.0" }

const refOf = (step: number, index: number, batch: PackedBatch, digest: string): MicroBatchRef => ({
  step,
  attempt: 0,
  core: "device/core",
  index,
  version: step,
  executions: [`b${step}-x${index}`],
  completesTokens: 2,
  tokens: batch.length,
  digest
})

/** Stores `batch` and publishes its reference. */
const enqueue = (step: number, index: number, batch: PackedBatch) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const store = yield* openMicroBatchStore(system)
    const digest = yield* store.put({ step, attempt: 0 }, index, batch)
    const ref = refOf(step, index, batch, digest)
    yield* publishMicroBatch(system, ref)
    return ref
  })

describe("micro-batch queue", () => {
  it("claims each micro-batch once and ends quietly when the step's consumer is deleted under a waiting pull or between two", async () => {
    const result = await withSystem("mbq", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* ensureMicroBatchStream(system)
      const none = yield* Effect.exit(claimLoop(system, { step: 5, ackWaitMs: 5000, device, stop: () => false }, () => Effect.void))
      yield* openStepQueue(system, 0, 5000)
      yield* enqueue(0, 0, chain(2, 0))
      // Not a micro-batch reference: to the claiming device's dead letters, never to the handler.
      yield* Effect.promise(() => system.nats.js.publish(rlLayout(system.run).microBatches(0), "{\"step\": 0}"))
      yield* enqueue(0, 1, chain(2, 0))
      const claimed: Array<number> = []
      const loop = yield* Effect.forkChild(
        claimLoop(system, { step: 0, ackWaitMs: 5000, device, stop: () => false }, (c) =>
          Effect.sync(() => claimed.push(c.microBatch.index)).pipe(Effect.andThen(c.ack), Effect.orDie)
        )
      )
      yield* eventually(Effect.sync(() => (claimed.length === 2 ? true : undefined)))
      yield* Effect.sleep(Duration.millis(200)) // the loop waits in its next pull
      yield* closeStepQueue(system, 0)
      const ended = yield* Fiber.await(loop).pipe(Effect.timeout(Duration.seconds(5)))

      // Deleted between two pulls (the step ended while the last claim was handled).
      yield* openStepQueue(system, 1, 5000)
      yield* enqueue(1, 0, chain(2, 1))
      const between = yield* Effect.exit(
        claimLoop(system, { step: 1, ackWaitMs: 5000, device, stop: () => false }, (c) => c.ack.pipe(Effect.andThen(closeStepQueue(system, 1)), Effect.orDie)).pipe(
          Effect.timeout(Duration.seconds(5))
        )
      )
      const dead = yield* Stream.runCollect(readStored(system.nats, system.layout.deadStream))
      return { none, claimed, ended, between, dead: [...dead].map((m) => ({ subject: m.subject, reason: m.headers?.get("Gyre-Dead-Reason") })) }
    }))
    expect(result.dead).toEqual([{ subject: "gyre.mbq.dead.device.d.0", reason: expect.stringContaining("not a micro-batch reference") }])
    expect(Exit.isSuccess(result.none)).toBe(true)
    expect(result.claimed).toEqual([0, 1])
    expect(Exit.isSuccess(result.ended)).toBe(true)
    expect(result.between).toEqual(Exit.succeed(undefined))
  })

  it("moves a micro-batch of several MiB by reference: read back intact, handed back, redelivered after its ack wait, gone when acknowledged and with its step", async () => {
    const tokens = 160_000 // 5 MiB of arrays
    const ackWaitMs = 4000 // room for reading 5 MiB back on a loaded machine before the claim lapses
    const result = await withSystem("mbbig", Effect.gen(function* () {
      const system = yield* ActorSystem
      const names = rlLayout(system.run)
      const store = yield* openMicroBatchStore(system)
      yield* ensureMicroBatchStream(system)
      yield* openStepQueue(system, 3, ackWaitMs)
      const batch = chain(tokens, 3)
      const ref = yield* enqueue(3, 0, batch)
      const deliveries: Array<{ readonly count: number; readonly at: number; readonly intact: boolean }> = []
      // 1st delivery: read and handed back (nak); 2nd: read and left to lapse; 3rd: read and acknowledged.
      const handle = (c: Claim) =>
        Effect.gen(function* () {
          const at = Date.now()
          const read = yield* store.get(c.microBatch)
          const entry = { count: c.deliveryCount, at, intact: packedBatchDigest(read) === packedBatchDigest(batch) && read.length === tokens }
          // Recorded once its answer is settled: the 3rd is counted only after the server confirmed its ack.
          if (c.deliveryCount === 1) yield* c.handBack
          else if (c.deliveryCount >= 3) yield* c.ack
          deliveries.push(entry)
        }).pipe(Effect.orDie)
      const loop = yield* Effect.forkChild(claimLoop(system, { step: 3, ackWaitMs, device, stop: () => deliveries.length >= 3 }, handle))
      yield* eventually(Effect.sync(() => (deliveries.length >= 3 ? true : undefined)), 40_000)
      yield* Fiber.interrupt(loop)
      const left = (yield* Effect.promise(() => system.nats.jsm.streams.info(names.microBatchStream))).state.messages
      const maxPayload = system.nats.nc.info!.max_payload
      const sizes = (stream: string) => Stream.runCollect(readStored(system.nats, stream)).pipe(Effect.map((ms) => [...ms].map((m) => m.data.length)))
      const objectChunks = yield* sizes(`OBJ_${names.batchesBucket}`)
      yield* closeStepQueue(system, 3)
      yield* store.removeStep(3)
      const afterStep = yield* Effect.flip(store.get(ref))
      return { ref, deliveries, left, maxPayload, objectChunks, afterStep }
    }))
    const { ref, deliveries, left, maxPayload, objectChunks, afterStep } = result
    expect(JSON.stringify(ref).length).toBeLessThan(512)
    expect(ref.digest).toBe(packedBatchDigest(chain(tokens, 3)))
    expect(deliveries.map((d) => [d.count, d.intact])).toEqual([[1, true], [2, true], [3, true]])
    // The 3rd came only after the 2nd's ack wait lapsed; the 2nd at once after the nak.
    expect(deliveries[2]!.at - deliveries[1]!.at).toBeGreaterThanOrEqual(ackWaitMs - 100)
    expect(left).toBe(0)
    expect(objectChunks.reduce((a, n) => a + n, 0)).toBeGreaterThanOrEqual(tokens * 32)
    expect(Math.max(...objectChunks)).toBeLessThanOrEqual(maxPayload)
    expect(objectChunks.length).toBeGreaterThan(1)
    expect(afterStep).toMatchObject({ _tag: "MicroBatchUnreadable" })
  })
})
