/**
 * Fuzzing of every actor subject with fast-check: for each actor kind's protocol (gateway,
 * harness runner, rollout worker, scheduler, device, and the node actor itself) and each of its
 * requests, seeded hostile messages on the kind's ask and tell subjects: bytes that are not
 * UTF-8 or not JSON, arbitrary JSON, the schema's own field names with wrong values, deep
 * nesting, unknown / empty / 300-character tags, odd headers (`Nats-*`, a garbage
 * `traceparent` or `Gyre-Incarnation`), and bodies near `max_payload`. Every case is checked
 * against the protocol's decoder first and only bad ones are sent (a valid one is counted as
 * skipped).
 *
 * The receivers are the runtime's dispatch on a real nats-server: for the five kinds, actors
 * with the real protocols and a probe behaviour (a handler that runs counts as a failure: a
 * bad input must never reach one; the real behaviours need an engine and a run), and the real
 * node actor. Invariants: no incarnation crashes or restarts; every ask gets `Rejected` with a
 * reason; every bad message (ask or tell) is in the dead-letter stream with a reason.
 *
 * `fuzzSubjects` returns the figures; the short form runs in `test/runtime/fuzz.test.ts`, the
 * long one (>= 10,000 cases per schema) from `npm run test:chaos -- --long`.
 */
import { headers as natsHeaders, nuid } from "@nats-io/transport-node"
import { Cause, Duration, Effect, Exit, Layer, References, Schema, Stream } from "effect"
import type { Rpc, RpcGroup } from "effect/rpc"
import fc from "fast-check"
import * as Actor from "../../src/runtime/actor.ts"
import { address } from "../../src/runtime/names.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { NodeProtocol, startNode } from "../../src/runtime/node.ts"
import { Headers, codecsOf, parseJson, requestOf } from "../../src/runtime/protocol.ts"
import { RegistryEntry } from "../../src/runtime/registry.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { DEVICE_KIND, DeviceProtocol } from "../../src/protocols/device.ts"
import { GatewayProtocol } from "../../src/protocols/gateway.ts"
import { HarnessRunnerProtocol } from "../../src/protocols/harness.ts"
import { RolloutWorkerProtocol } from "../../src/protocols/rollout.ts"
import { SCHEDULER_KIND, SchedulerProtocol } from "../../src/protocols/scheduler.ts"

export interface SubjectFuzzOptions {
  /** Cases generated per request schema (bad ones are sent). */
  readonly casesPerSchema: number
  readonly seed?: number
  /** Messages in flight at once (default 32). */
  readonly concurrency?: number
  /** Seconds before an unfinished run fails naming its phase (default 240). */
  readonly limitS?: number
}

export interface SubjectFuzzFailure {
  readonly subject: string
  readonly reason: string
  /** The case: its tag and body (latin1, cut at 500 characters). */
  readonly tag: string
  readonly body: string
}

export interface SubjectFuzzReport {
  readonly seed: number
  /** Request schemas fuzzed (kind x request). */
  readonly schemas: number
  readonly casesPerSchema: number
  /** Cases generated, in all. */
  readonly cases: number
  /** Cases the decoder accepted (not sent). */
  readonly skippedValid: number
  readonly asks: number
  readonly tells: number
  /** Incarnation restarts, handlers that ran on a bad input, actors not running afterwards (target 0). */
  readonly crashes: number
  /** Asks not answered `Rejected` with a reason (target 0). */
  readonly unanswered: number
  /** Dead letters written, and bad messages without one or without a reason (target 0). */
  readonly deadLetters: number
  readonly missingDeadLetters: number
  readonly failures: ReadonlyArray<SubjectFuzzFailure>
  readonly seconds: number
}

/** Every actor subject the system has: kind and protocol. */
const subjects: ReadonlyArray<{ readonly kind: string; readonly protocol: RpcGroup.RpcGroup<any> }> = [
  { kind: "gateway", protocol: GatewayProtocol },
  { kind: "harness-runner", protocol: HarnessRunnerProtocol },
  { kind: "rollout-worker", protocol: RolloutWorkerProtocol },
  { kind: SCHEDULER_KIND, protocol: SchedulerProtocol },
  { kind: DEVICE_KIND, protocol: DeviceProtocol },
  { kind: "node", protocol: NodeProtocol }
]

interface FuzzCase {
  readonly via: "ask" | "tell"
  readonly tag: string
  readonly body: Uint8Array
  readonly headers: ReadonlyArray<readonly [string, string]>
}

/** The field names of a payload schema, when it is a struct. */
const fieldsOf = (rpc: Rpc.AnyWithProps): Array<string> => {
  const fields = (rpc.payloadSchema as { readonly fields?: Record<string, unknown> }).fields
  return fields === undefined ? [] : Object.keys(fields)
}

const json = (v: unknown) => Buffer.from(JSON.stringify(v) ?? "null")
const printable = (s: string) => s.replace(/[^\x20-\x7e]/g, "?")

/** Bad messages for `tag` of `protocol`: a body, maybe another tag, odd headers. */
const caseOf = (protocol: RpcGroup.RpcGroup<any>, tag: string): fc.Arbitrary<FuzzCase> => {
  const fields = fieldsOf(requestOf(protocol, tag)!)
  const tags = [...protocol.requests.keys()]
  const values = fc.jsonValue({ maxDepth: 3 })
  const body = fc.oneof(
    fc.uint8Array({ maxLength: 256 }),
    values.map(json),
    fc.string({ maxLength: 128 }).map((s) => Buffer.from(s)),
    (fields.length > 0 ? fc.dictionary(fc.constantFrom(...fields), values, { maxKeys: fields.length + 1 }) : fc.object()).map(json),
    fc.integer({ min: 1, max: 2000 }).map((depth) => Buffer.from("[".repeat(depth) + "]".repeat(depth)))
  )
  const caseTag = fc.oneof(
    { weight: 8, arbitrary: fc.constant(tag) },
    { weight: 1, arbitrary: fc.constantFrom(...tags) },
    { weight: 1, arbitrary: fc.string({ maxLength: 300 }).map(printable) }
  )
  const header = fc.tuple(
    fc.constantFrom("traceparent", Headers.incarnation, Headers.sender, "Nats-Expected-Stream", "Nats-Rollup", "X-Fuzz"),
    fc.string({ maxLength: 80 }).map(printable)
  )
  return fc.record({ via: fc.constantFrom<"ask" | "tell">("ask", "ask", "ask", "tell"), tag: caseTag, body, headers: fc.array(header, { maxLength: 3 }) })
}

/** Whether the runtime would hand `c` to a handler (then it is not a bad input). */
const decodes = (protocol: RpcGroup.RpcGroup<any>, c: FuzzCase): boolean => {
  const rpc = requestOf(protocol, c.tag)
  if (rpc === undefined) return false
  const parsed = parseJson(c.body)
  return parsed.ok && Exit.isSuccess(codecsOf(rpc).decodePayload(parsed.value))
}

/** Two bodies near max_payload per schema: one with a 6,000-character unknown tag, one with the right tag. */
const oversize = (tag: string, maxPayload: number): Array<FuzzCase> => [
  { via: "ask", tag: "X".repeat(6000), body: new Uint8Array(maxPayload - 6500).fill(0x7b), headers: [] },
  { via: "tell", tag, body: new Uint8Array(maxPayload - 2000).fill(0x5b), headers: [] }
]

/** A probe behaviour: every handler that runs is a failure, counted in `reached`. */
const probe = (kind: string, protocol: RpcGroup.RpcGroup<any>, reached: Map<string, number>, starts: Map<string, number>) =>
  Actor.make({
    kind,
    protocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    maxQueuedAsks: 100_000,
    behaviour: () =>
      Effect.sync(() => {
        starts.set(kind, (starts.get(kind) ?? 0) + 1)
        const handler = () =>
          Effect.suspend(() => {
            reached.set(kind, (reached.get(kind) ?? 0) + 1)
            return Effect.die(new Error(`a fuzz case reached a ${kind} handler`))
          })
        return Object.fromEntries([...protocol.requests.keys()].map((t) => [t, handler])) as never
      })
  })

/** Runs `op` over `items` with at most `width` in flight. */
const lanes = async <A>(items: ReadonlyArray<A>, width: number, op: (a: A) => Promise<void>) => {
  let next = 0
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) await op(items[next++]!)
  }))
}

/** Where a fuzz run is, for the message of one that does not finish. */
interface Progress {
  phase: string
  asks: number
  answered: number
  tells: number
  stored: number
}

const fuzz = (options: SubjectFuzzOptions, progress: Progress) =>
  Effect.gen(function* () {
    const t0 = performance.now()
    const seed = options.seed ?? 42
    const system = yield* ActorSystem
    const { nc, js, jsm } = system.nats
    const reached = new Map<string, number>()
    const starts = new Map<string, number>()
    const probed = subjects.filter((s) => s.kind !== "node")
    progress.phase = "starting the probe actors"
    const node = yield* startNode({ name: "fuzz", types: probed.map((s) => probe(s.kind, s.protocol, reached, starts)) })
    for (const s of probed) yield* node.spawn(s.kind, "f1")
    const maxPayload = nc.info!.max_payload
    const failures: Array<SubjectFuzzFailure> = []
    let schemas = 0
    let cases = 0
    let skippedValid = 0
    let asks = 0
    let tells = 0
    let storedTells = 0
    let unanswered = 0
    // The subjects at once (each actor handles one message at a time), their schemas in turn.
    progress.phase = "sending the cases"
    yield* Effect.forEach(subjects, (s, k) => Effect.gen(function* () {
      const to = address(s.kind, s.kind === "node" ? "fuzz" : "f1")
      for (const [i, tag] of [...s.protocol.requests.keys()].entries()) {
        schemas++
        const generated = fc.sample(caseOf(s.protocol, tag), { numRuns: options.casesPerSchema, seed: seed + 1000 * k + i })
        cases += generated.length
        const bad = [...generated.filter((c) => !decodes(s.protocol, c)), ...oversize(tag, maxPayload)]
        skippedValid += generated.length + 2 - bad.length
        const failed = (c: FuzzCase, subject: string, reason: string) =>
          failures.push({ subject, reason, tag: c.tag.slice(0, 100), body: Buffer.from(c.body.subarray(0, 500)).toString("latin1") })
        yield* Effect.promise(() =>
          lanes(bad, options.concurrency ?? 32, async (c) => {
            const h = natsHeaders()
            h.set(Headers.request, c.tag)
            for (const [k, v] of c.headers) if (c.via === "ask" || !k.startsWith("Nats-")) h.append(k, v)
            if (c.via === "tell") {
              tells++
              const subject = system.layout.tell(to)
              progress.tells++
              // As a client would: a publish whose acknowledgement timed out is sent again with
              // its message id (JetStream stores it once), up to 5 times.
              const msgID = nuid.next()
              const publish = (attempt: number): Promise<unknown> =>
                js.publish(subject, c.body, { headers: h, msgID }).catch((e: unknown) =>
                  attempt < 5 && e instanceof Error && e.name === "TimeoutError" ? publish(attempt + 1) : Promise.reject(e)
                )
              await publish(1).then(
                () => void (storedTells++, progress.stored++),
                (e) => failed(c, subject, `tell not stored after 5 tries: ${e}`)
              )
              return
            }
            asks++
            h.set(Headers.msgId, nuid.next())
            const subject = system.layout.ask(to)
            progress.asks++
            const reply = await nc.request(subject, c.body, { headers: h, timeout: 15_000 }).then(
              (m) => (progress.answered++, parseJson(m.data)),
              (e) => ({ ok: false as const, reason: `no answer: ${e}` })
            )
            const answer = reply.ok ? (reply.value as { _tag?: unknown; reason?: unknown }) : undefined
            if (answer?._tag !== "Rejected" || typeof answer.reason !== "string" || answer.reason === "") {
              unanswered++
              failed(c, subject, reply.ok ? `answered ${JSON.stringify(reply.value).slice(0, 200)}` : reply.reason)
            }
          })
        )
      }
    }), { concurrency: "unbounded", discard: true })
    // Every bad message is dead-lettered with a reason (tells are handled after their publish).
    progress.phase = "waiting for the dead letters"
    const expected = asks + storedTells
    const deadAt = (yield* Effect.promise(() => jsm.streams.info(system.layout.deadStream))).state
    let deadLetters = deadAt.messages
    // a wall-clock deadline (a loaded machine makes each stream info slow): missing ones are reported, not waited for
    for (const deadline = Date.now() + 60_000; deadLetters < expected && Date.now() < deadline; ) {
      yield* Effect.sleep("200 millis")
      deadLetters = (yield* Effect.promise(() => jsm.streams.info(system.layout.deadStream))).state.messages
    }
    progress.phase = "reading the dead letters"
    const withoutReason = yield* readStored(system.nats, system.layout.deadStream).pipe(
      Stream.filter((m) => (m.headers?.get(Headers.deadReason) ?? "") === ""),
      Stream.runCount
    )
    progress.phase = "reading the registry"
    let crashes = [...reached.values()].reduce((a, b) => a + b, 0) + [...starts.values()].reduce((a, n) => a + n - 1, 0)
    for (const s of subjects) {
      const key = `${s.kind}/${s.kind === "node" ? "fuzz" : "f1"}`
      const entry = yield* Effect.promise(() => system.registry.get(key))
      const decoded = entry === null ? undefined : Schema.decodeUnknownSync(RegistryEntry)(entry.json())
      if (decoded?.status !== "running" || decoded.incarnation !== 1) crashes++
    }
    progress.phase = "stopping the probe actors"
    return {
      seed,
      schemas,
      casesPerSchema: options.casesPerSchema,
      cases,
      skippedValid,
      asks,
      tells,
      crashes,
      unanswered,
      deadLetters,
      missingDeadLetters: Math.max(0, expected - deadLetters) + withoutReason,
      failures: failures.slice(0, 20),
      seconds: +((performance.now() - t0) / 1000).toFixed(1)
    } satisfies SubjectFuzzReport
  })

/** Fuzzes every actor subject on a fresh embedded nats-server; resolves with the figures. */
export const fuzzSubjects = (options: SubjectFuzzOptions): Promise<SubjectFuzzReport> => {
  const layer = ActorSystem.layer({ run: `fuzz${Date.now()}` }).pipe(Layer.provideMerge(Nats.layer({})))
  const progress: Progress = { phase: "connecting", asks: 0, answered: 0, tells: 0, stored: 0 }
  const limitS = options.limitS ?? 240
  const stuck = () => new Error(`subject fuzz did not finish in ${limitS} s: ${progress.phase}; ${progress.asks} asks sent, ${progress.answered} answered; ${progress.tells} tells sent, ${progress.stored} stored`)
  return Effect.runPromise(
    Effect.scoped(fuzz(options, progress)).pipe(
      Effect.provide(layer),
      Effect.timeoutOrElse({ duration: Duration.seconds(limitS), orElse: () => Effect.die(stuck()) }),
      // One warning per dead letter is the runtime's due, not this report's.
      Effect.provideService(References.MinimumLogLevel, "Error"),
      Effect.catchCause((cause) => Effect.die(new Error(`subject fuzz failed: ${Cause.pretty(cause)}`)))
    )
  )
}
