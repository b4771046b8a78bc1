/**
 * `npm run bench:runtime`: the actor runtime against plain NATS on the same embedded server,
 * in the same run.
 *
 * - ask vs raw request/reply: sequential round trips of a small payload, alternating a raw
 *   one (`nc.request`), a bare one (the same echo asked through `src/runtime/replies.ts`, as
 *   an ask asks: none of `nc.request`'s per-request promise, timer and `Error`, so the
 *   transport's own round trip, `ask_over_bare_p50`), an ask, and each half of an ask alone
 *   (the client's, answered by a plain responder; the actor's, asked by a plain request) in a
 *   new seeded order every round, so all see the same load and none always follows the same
 *   other; p50/p99 latency and this process's CPU per trip (so an ask's cost splits into its
 *   client and actor halves).
 * - tell vs raw JetStream: N messages published with W in flight, consumed and acknowledged
 *   (the actor's durable consumer and handler vs a plain pull consumer that acks), messages/s
 *   from the first publish to the last acknowledgement.
 * CPU per round trip is this process's (client and actor, or client and echo responder).
 * Spans and metrics on, as issue 12 asks: the run has a tracer that records every span in
 * memory (effect's native spans, under a tracer of their own, so `tracing` in
 * src/runtime/protocol.ts sees a backend and spans are made); `--tracer none` (or `BENCH_TRACER=none`) runs it
 * with no tracer, as a process without OTLP runs (no spans). The JSON line says which (`spans`).
 * Prints a table and, last, one JSON line. Not a test: nothing here is asserted.
 */
import { AckPolicy } from "@nats-io/jetstream"
import { nuid } from "@nats-io/transport-node"
import { Deferred, Effect, Exit, Layer, Schema, Tracer } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import * as Actor from "../src/runtime/actor.ts"
import { Nats } from "../src/runtime/nats.ts"
import { makeReplies } from "../src/runtime/replies.ts"
import { address } from "../src/runtime/names.ts"
import { startNode } from "../src/runtime/node.ts"
import { encodeExitReply, requestHeaders } from "../src/runtime/protocol.ts"
import { ActorSystem, refOf } from "../src/runtime/system.ts"
import { mulberry32 } from "../src/tree/sample.ts"
import { atLeast, benchFlags } from "./flags.ts"
import { printResult } from "./results.ts"

// Each flag's default may come from its `BENCH_*` variable (`BENCH_TRACER=none npm run bench:runtime`).
const BENCH = "bench:runtime"
const f = benchFlags(BENCH, "the actor runtime's ask and tell against plain NATS on the same server", {
  asks: { kind: "integer", doc: "round trips of each kind [BENCH_ASKS]", default: Number(process.env.BENCH_ASKS ?? 3000) },
  tells: { kind: "integer", doc: "tells and raw JetStream messages [BENCH_TELLS]", default: Number(process.env.BENCH_TELLS ?? 5000) },
  tracer: { kind: "string", doc: "memory: spans recorded in memory, as issue 12 asks; none: no tracer, no spans [BENCH_TRACER]", default: process.env.BENCH_TRACER === "none" ? "none" : "memory", choices: ["memory", "none"] }
})
const ASKS = atLeast(BENCH, "asks", f.asks, 1)
const TELLS = atLeast(BENCH, "tells", f.tells, 1)
const IN_FLIGHT = 64
const payload = { text: "x".repeat(64), n: 7 }

/** `xs` in a random order (Fisher-Yates). */
const shuffle = <A>(xs: ReadonlyArray<A>, random: () => number): Array<A> => {
  const out = [...xs]
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1))
    ;[out[i], out[j]] = [out[j]!, out[i]!]
  }
  return out
}

const percentile = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!
}

const BenchProtocol = RpcGroup.make(
  Rpc.make("Echo", { payload: { text: Schema.String, n: Schema.Number }, success: Schema.Number }),
  Rpc.make("Sink", { payload: { text: Schema.String, n: Schema.Number } })
)

const program = Effect.gen(function* () {
  const system = yield* ActorSystem
  const { nc, js, jsm } = system.nats
  let sunk = 0
  const allSunk = yield* Deferred.make<void>()
  const Bench = Actor.make({
    kind: "bench",
    protocol: BenchProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    behaviour: () =>
      Effect.succeed({
        Echo: ({ n }: { readonly n: number }) => Effect.succeed(n + 1),
        Sink: () =>
          Effect.suspend(() => {
            sunk++
            return sunk === TELLS ? Deferred.succeed(allSunk, undefined).pipe(Effect.asVoid) : Effect.void
          })
      })
  })
  const node = yield* startNode({ name: "bench", types: [Bench] })
  yield* node.spawn("bench", "b1")
  const ref = refOf(BenchProtocol, address("bench", "b1"))

  // Round trips, alternated so all see the same machine load: a raw request/reply; a bare one
  // (the same echo asked through `replies.ts`, as an ask asks: none of nats.js's per-request
  // promise, timer and `Error`, so the transport's own round trip); an ask; the ask's client
  // half alone (system.ask answered by a plain responder with a prepared reply); the ask's
  // actor half alone (a plain request with the ask's bytes and headers).
  const echo = nc.subscribe("bench.raw.echo", { callback: (_e, m) => void m.respond(m.data) })
  const replies = yield* makeReplies(nc)
  const fakeReply = encodeExitReply(BenchProtocol.requests.get("Echo")!, Exit.succeed(8))
  const fake = nc.subscribe(system.layout.ask(address("bench", "fake")), { callback: (_e, m) => void m.respond(fakeReply) })
  const body = JSON.stringify(payload)
  const bodyBytes = Buffer.from(body)
  const askHeaders = () => requestHeaders("Echo", nuid.next(), undefined, undefined)
  const fakeRef = refOf(BenchProtocol, address("bench", "fake"))
  const parts: Record<"raw" | "bare" | "ask" | "client" | "actor", Effect.Effect<unknown, unknown>> = {
    raw: Effect.promise(() => nc.request("bench.raw.echo", body, { timeout: 5000 })),
    bare: Effect.callback<void>(
      (resume) => void replies.request("bench.raw.echo", bodyBytes, undefined, 5000, (o) => resume(o._tag === "Reply" ? Effect.void : Effect.die(new Error(`bare request: ${o._tag}`))))
    ),
    ask: system.ask(ref, "Echo", payload),
    client: system.ask(fakeRef, "Echo", payload),
    actor: Effect.promise(() => nc.request(system.layout.ask(ref.address), body, { timeout: 5000, headers: askHeaders() }))
  }
  const lat: Record<keyof typeof parts, Array<number>> = { raw: [], bare: [], ask: [], client: [], actor: [] }
  const cpu: Record<keyof typeof parts, number> = { raw: 0, bare: 0, ask: 0, client: 0, actor: 0 }
  const names = Object.keys(parts) as Array<keyof typeof parts>
  const random = mulberry32(1) // seeded: every run draws the same orders
  for (let i = 0; i < ASKS + 200; i++) {
    // A new order every round: in a fixed one each part would always run right after the same
    // other part, on the caches that part left (an ask right after a raw request measured
    // 0.14-0.19 of the ratio slower than one right after another ask).
    for (const name of shuffle(names, random)) {
      const c0 = process.cpuUsage()
      const t0 = performance.now()
      yield* parts[name]
      const t1 = performance.now()
      const c1 = process.cpuUsage(c0)
      if (i < 200) continue
      lat[name].push((t1 - t0) * 1000)
      cpu[name] += c1.user + c1.system
    }
  }
  echo.unsubscribe()
  fake.unsubscribe()
  const rawLat = lat.raw
  const askLat = lat.ask

  // Raw JetStream: publish with IN_FLIGHT outstanding, pull-consume, ack.
  yield* Effect.promise(() => jsm.streams.add({ name: "BENCH_RAW", subjects: ["bench.raw.js"] }))
  yield* Effect.promise(() => jsm.consumers.add("BENCH_RAW", { durable_name: "raw", ack_policy: AckPolicy.Explicit, max_ack_pending: 256 }))
  const rawStart = performance.now()
  const rawDone = yield* Effect.promise(async () => {
    const consumer = await js.consumers.get("BENCH_RAW", "raw")
    let acked = 0
    const done = new Promise<number>((resolve) => {
      void consumer.consume({
        max_messages: 128,
        callback: (m) => {
          m.ack()
          if (++acked === TELLS) resolve(performance.now())
        }
      })
    })
    await pipelined(TELLS, (i) => js.publish("bench.raw.js", body, { msgID: `raw-${i}` }))
    return done
  })
  const rawSeconds = (rawDone - rawStart) / 1000

  // Tell.
  const tellStart = performance.now()
  yield* Effect.promise(() => pipelined(TELLS, () => Effect.runPromise(system.tell(ref, "Sink", payload))))
  yield* Deferred.await(allSunk)
  const tellSeconds = (performance.now() - tellStart) / 1000

  const result = {
    ask_p50_us: Math.round(percentile(askLat, 50)),
    ask_p99_us: Math.round(percentile(askLat, 99)),
    raw_request_p50_us: Math.round(percentile(rawLat, 50)),
    raw_request_p99_us: Math.round(percentile(rawLat, 99)),
    ask_over_raw_p50: +(percentile(askLat, 50) / percentile(rawLat, 50)).toFixed(3),
    bare_request_p50_us: Math.round(percentile(lat.bare, 50)),
    ask_over_bare_p50: +(percentile(askLat, 50) / percentile(lat.bare, 50)).toFixed(3),
    ask_cpu_us: Math.round(cpu.ask / ASKS),
    raw_request_cpu_us: Math.round(cpu.raw / ASKS),
    bare_request_cpu_us: Math.round(cpu.bare / ASKS),
    ask_client_half_cpu_us: Math.round(cpu.client / ASKS),
    ask_actor_half_cpu_us: Math.round(cpu.actor / ASKS),
    tell_per_s: Math.round(TELLS / tellSeconds),
    raw_js_per_s: Math.round(TELLS / rawSeconds),
    tell_over_raw: +(rawSeconds / tellSeconds).toFixed(3),
    asks: ASKS,
    tells: TELLS,
    in_flight: IN_FLIGHT,
    spans: SPANS,
    server: system.nats.serverVersion
  }
  const rows: Array<[string, string, string, string]> = [
    ["round trip p50 (us)", String(result.ask_p50_us), String(result.raw_request_p50_us), String(result.ask_over_raw_p50)],
    ["round trip p99 (us)", String(result.ask_p99_us), String(result.raw_request_p99_us), (result.ask_p99_us / result.raw_request_p99_us).toFixed(3)],
    ["bare round trip p50 (us)", String(result.ask_p50_us), String(result.bare_request_p50_us), String(result.ask_over_bare_p50)],
    ["CPU per round trip (us)", String(result.ask_cpu_us), String(result.raw_request_cpu_us), (result.ask_cpu_us / result.raw_request_cpu_us).toFixed(3)],
    ["  client half alone", String(result.ask_client_half_cpu_us), String(result.raw_request_cpu_us), (result.ask_client_half_cpu_us / result.raw_request_cpu_us).toFixed(3)],
    ["  actor half alone", String(result.ask_actor_half_cpu_us), String(result.raw_request_cpu_us), (result.ask_actor_half_cpu_us / result.raw_request_cpu_us).toFixed(3)],
    ["durable msgs/s", String(result.tell_per_s), String(result.raw_js_per_s), String(result.tell_over_raw)]
  ]
  console.log(`nats-server ${result.server}; ${ASKS} asks, ${TELLS} tells with ${IN_FLIGHT} in flight; spans ${SPANS ? "on (in-memory tracer)" : "off (no tracer)"}`)
  console.log(["measure".padEnd(24), "gyre".padStart(10), "raw NATS".padStart(10), "gyre/raw".padStart(10)].join(" "))
  for (const r of rows) console.log([r[0].padEnd(24), r[1].padStart(10), r[2].padStart(10), r[3].padStart(10)].join(" "))
  printResult(BENCH, result)
})

/** Runs `count` async operations with at most IN_FLIGHT outstanding. */
const pipelined = async (count: number, op: (i: number) => Promise<unknown>) => {
  let next = 0
  const lane = async () => {
    while (next < count) await op(next++)
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, lane))
}

const SPANS = f.tracer === "memory"
/** Effect's in-memory spans under a tracer that is not `nativeTracer` itself: spans on, exported nowhere. */
const recording = Tracer.make({ span: (options) => Tracer.nativeTracer.span(options) })
const layer = ActorSystem.layer({ run: "bench" }).pipe(Layer.provideMerge(Nats.layer({})))
const traced = <A, E>(effect: Effect.Effect<A, E>) => (SPANS ? Effect.withTracer(effect, recording) : effect)
await Effect.runPromise(traced(Effect.scoped(program).pipe(Effect.provide(layer))))
process.exit(0)
