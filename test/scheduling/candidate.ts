/**
 * A scheduler candidate as its own process, for the takeover test: connects to NATS_URL,
 * starts a node hosting only the scheduler type and stands by for the run's lease.
 * Options come as JSON in GYRE_TEST_CANDIDATE (`{name, run, options}`); prints
 * `{"event":"ready"}` once standing by. Run with `node --import tsx`.
 */
import { Effect, Layer } from "effect"
import { makeScheduler, type SchedulerOptions } from "../../src/actors/scheduler.ts"
import { HarnessRunner } from "../../src/protocols/topology.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem } from "../../src/runtime/system.ts"

const { name, run, options: json } = JSON.parse(process.env.GYRE_TEST_CANDIDATE ?? "{}") as { name: string; run: string; options: SchedulerOptions }
// The runners' references came as JSON (their addresses): typed again here.
const options: SchedulerOptions = { ...json, runners: json.runners.map((r) => HarnessRunner.ref(r.address.id)) }

const program = Effect.gen(function* () {
  const system = yield* ActorSystem
  const scheduler = makeScheduler(options)
  const node = yield* startNode({ name, types: [scheduler.type], heartbeatMs: 300, ackWaitMs: 1500, deadAfterMs: 2000 })
  console.log(JSON.stringify({ event: "ready", node: name }))
  yield* scheduler.standBy(node, system)
})

const layer = ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({ url: process.env.NATS_URL })))
Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(layer))).catch((e) => {
  console.error(e)
  process.exit(1)
})
