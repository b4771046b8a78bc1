/**
 * Snapshot writes on a real nats-server, their failures classified: a compare-and-set conflict
 * (someone else wrote: a `SnapshotConflict`, never retried; an actor that meets one is fenced)
 * and a transport failure (the server does not answer: a `TransportError`, retried on the
 * schedule, and a retry that meets its own earlier write counts as written).
 */
import { Deferred, Duration, Effect, Exit, Fiber, Layer, Schedule, Schema, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { readJournal } from "../../src/runtime/journal.ts"
import { HandledIds } from "../../src/runtime/mailbox.ts"
import { address } from "../../src/runtime/names.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { startNode } from "../../src/runtime/node.ts"
import { encodeJson } from "../../src/runtime/protocol.ts"
import { acquire } from "../../src/runtime/claim.ts"
import { runIncarnation } from "../../src/runtime/host.ts"
import { makeSnapshotStore, Snapshot } from "../../src/runtime/snapshot.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Ledger, LedgerProtocol } from "../fixtures/actors.ts"
import { stopProcess, withSystem } from "./harness.ts"

const Counter = Schema.Struct({ n: Schema.Number })

const store = (
  system: typeof ActorSystem.Service,
  incarnation: number,
  options: { key?: string; retry?: Schedule.Schedule<unknown, unknown>; timeoutMs?: number } = {}
) => makeSnapshotStore({ kv: system.state, key: options.key ?? "counter/c1", actor: "counter/c1", incarnation, schema: Counter, ...options })

const failureTag = (exit: Exit.Exit<unknown, { readonly _tag: string }>) =>
  Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: { _tag: string } }).error?._tag : "success"

describe("snapshot writes", () => {
  it("a stale revision is a SnapshotConflict naming the writer, and is not retried", async () => {
    const result = await withSystem("snapconflict", Effect.gen(function* () {
      const system = yield* ActorSystem
      const a = store(system, 1)
      // Were a conflict retried, this schedule would hold the write for seconds.
      const b = store(system, 2, { retry: Schedule.spaced(Duration.seconds(2)).pipe(Schedule.upTo({ times: 5 })) })
      yield* a.restore
      yield* b.restore
      yield* a.write({ n: 1 }, new HandledIds())
      const t0 = performance.now()
      const lost = yield* Effect.exit(b.write({ n: 2 }, new HandledIds()))
      const lostAfterMs = performance.now() - t0
      yield* a.write({ n: 3 }, HandledIds.from(["m1"]))
      const stored = Schema.decodeUnknownSync(Snapshot)((yield* Effect.promise(() => system.state.get("counter/c1")))!.json())
      return { lost, lostAfterMs, stored }
    }))
    expect(failureTag(result.lost)).toBe("SnapshotConflict")
    if (Exit.isFailure(result.lost)) expect((result.lost.cause.reasons[0] as any).error.writtenBy).toBe(1)
    expect(result.lostAfterMs).toBeLessThan(1500)
    expect(result.stored).toMatchObject({ state: { n: 3 }, handled: ["m1"], incarnation: 1 })
  })

  it("a server that does not answer is a TransportError; retried, the write lands once the server is back", async () => {
    const result = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const server = yield* startEmbeddedServer()
          const layer = ActorSystem.layer({ run: "snaptransport" }).pipe(Layer.provide(Nats.layer({ url: server.url })))
          return yield* Effect.gen(function* () {
            const system = yield* ActorSystem
            // Without retries, a write to a server that does not answer (SIGSTOP) is a TransportError.
            const once = store(system, 1, { key: "counter/once", retry: Schedule.recurs(0), timeoutMs: 300 })
            yield* once.restore
            yield* stopProcess(server.pid)
            const failed = yield* Effect.exit(once.write({ n: 1 }, new HandledIds()))
            process.kill(server.pid, "SIGCONT")
            // With retries, the write lands once the server answers again, although its first
            // attempt (queued while the server was stopped) was stored before the retry came.
            let attempts = 0
            const patient = store(system, 2, {
              timeoutMs: 300,
              retry: Schedule.spaced(Duration.millis(300)).pipe(
                Schedule.upTo({ times: 20 }),
                Schedule.tap(() => Effect.sync(() => attempts++))
              )
            })
            yield* patient.restore
            yield* stopProcess(server.pid)
            const resume = setTimeout(() => process.kill(server.pid, "SIGCONT"), 1200)
            const written = yield* Effect.exit(patient.write({ n: 7 }, new HandledIds()))
            clearTimeout(resume)
            process.kill(server.pid, "SIGCONT")
            const entry = yield* Effect.promise(() => system.state.get("counter/c1"))
            // The store knows the new revision: its next write is no conflict.
            const next = yield* Effect.exit(patient.write({ n: 8 }, new HandledIds()))
            return { failed, written, attempts, stored: Schema.decodeUnknownSync(Snapshot)(entry!.json()), next }
          }).pipe(Effect.provide(layer))
        })
      )
    )
    expect(failureTag(result.failed)).toBe("TransportError")
    expect(Exit.isSuccess(result.written)).toBe(true)
    // Each failed attempt steps the schedule once: the write was retried while the server slept.
    expect(result.attempts).toBeGreaterThanOrEqual(2)
    expect(result.stored).toMatchObject({ state: { n: 7 }, incarnation: 2 })
    expect(Exit.isSuccess(result.next)).toBe(true)
  })

  it("an actor whose snapshot write conflicts is fenced: it stops, leaves the message unacknowledged, and says so", async () => {
    const result = await withSystem("fence", Effect.gen(function* () {
      const system = yield* ActorSystem
      const ledger = refOf(LedgerProtocol, address("ledger", "z"))
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "z")
      yield* system.tell(ledger, "Append", { item: "a" })
      yield* system.ask(ledger, "Items", undefined)
      // Someone else writes the actor's state.
      yield* Effect.promise(() => system.state.put("ledger/z", encodeJson({ state: { items: ["theirs"] }, handled: [], incarnation: 99, at: 0 })))
      const told = yield* system.tell(ledger, "Append", { item: "b" })
      const deadline = Date.now() + 10_000
      while (node.hosted().some((h) => h.kind === "ledger") && Date.now() < deadline) yield* Effect.sleep(Duration.millis(50))
      yield* Effect.sleep(Duration.millis(200))
      const consumer = yield* Effect.promise(() => system.nats.jsm.consumers.info(system.layout.journalStream, system.layout.consumer(address("ledger", "z"))))
      const events = yield* Stream.runCollect(readJournal(system))
      const stored = Schema.decodeUnknownSync(Snapshot)((yield* Effect.promise(() => system.state.get("ledger/z")))!.json())
      return { hosted: node.hosted().map((h) => h.kind), ackFloor: consumer.ack_floor.stream_seq, toldSeq: told.seq, events: events.filter((e) => e.via === "event").map((e) => [e.name, e.payload]), stored }
    }))
    expect(result.hosted).toEqual(["node"])
    expect(result.ackFloor).toBeLessThan(result.toldSeq)
    expect(result.events).toContainEqual(["fenced", { kind: "ledger", id: "z", node: "n1" }])
    expect(result.stored.incarnation).toBe(99)
  })

  it("an incarnation told it is fenced stops at once without acknowledging what it holds", async () => {
    const result = await withSystem("fenced", Effect.gen(function* () {
      const system = yield* ActorSystem
      const ledger = refOf(LedgerProtocol, address("ledger", "f"))
      const control = { drain: yield* Deferred.make<void>(), ready: yield* Deferred.make<void>(), fenced: yield* Deferred.make<void>() }
      const stats = { name: "ledger/f", subject: "", numRequests: 0, numErrors: 0, lastError: "", processingTimeNs: 0 }
      const claim = yield* acquire(system.registry, address("ledger", "f"), { holder: "n1", silentMs: 3000, whenHeld: "refuse" })
      const fiber = yield* Effect.forkChild(runIncarnation(Ledger, address("ledger", "f"), system, { node: "n1", heartbeatMs: 1000, ackWaitMs: 30_000, stats, claim }, control))
      yield* Deferred.await(control.ready)
      const told = yield* system.tell(ledger, "Append", { item: "held", holdMs: 5000 })
      yield* Effect.sleep(Duration.millis(300))
      const t0 = performance.now()
      yield* Deferred.succeed(control.fenced, undefined)
      const ended = yield* Fiber.join(fiber)
      const endedAfterMs = performance.now() - t0
      const consumer = yield* Effect.promise(() => system.nats.jsm.consumers.info(system.layout.journalStream, system.layout.consumer(address("ledger", "f"))))
      const snapshot = yield* Effect.promise(() => system.state.get("ledger/f"))
      return { ended, endedAfterMs, ackFloor: consumer.ack_floor.stream_seq, toldSeq: told.seq, snapshot }
    }))
    expect(result.ended).toBe("fenced")
    expect(result.endedAfterMs).toBeLessThan(2000)
    expect(result.ackFloor).toBeLessThan(result.toldSeq)
    expect(result.snapshot).toBeNull()
  })
})
