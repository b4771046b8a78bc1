/**
 * `gyre demo`: the main job on the embedded default.
 *
 * Until the training loop lands this is the runtime demo: it starts a private nats-server
 * (or joins NATS_URL), hosts four evaluator actors on one node, sends them a batch of
 * evaluations (half as durable tells, half as asks), stops one actor and restarts it from its
 * snapshot, then reads the run's journal back and prints what happened and where it lives.
 */
import { Effect, Layer, Stream } from "effect"
import { Evaluator, EvaluatorProtocol } from "../../examples/evaluator.ts"
import { readJournal } from "../runtime/journal.ts"
import { Nats, natsOptionsFromEnv } from "../runtime/nats.ts"
import { address } from "../runtime/names.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, refOf } from "../runtime/system.ts"
import { parseFlags } from "./args.ts"
import type { Command } from "./main.ts"

const flags = {
  evaluations: { kind: "integer", doc: "how many evaluations to send", default: 200 },
  evaluators: { kind: "integer", doc: "how many evaluator actors", default: 4 },
  run: { kind: "string", doc: "run id", default: `demo-${Date.now().toString(36)}` }
} as const

const words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]
const sentence = (seed: number, n: number) => Array.from({ length: n }, (_, i) => words[(seed * 7 + i * 3 + (seed % (i + 2))) % words.length]).join(" ")

export const command: Command<typeof flags> = {
  summary: "run the main demo on the embedded default",
  flags,
  run: async (argv) => {
    const f = parseFlags("demo", flags, argv)
    const program = Effect.gen(function* () {
      const system = yield* ActorSystem
      const started = Date.now()
      const node = yield* startNode({ name: "demo", types: [Evaluator] })
      const ids = Array.from({ length: f.evaluators }, (_, i) => `e${i}`)
      for (const id of ids) yield* node.spawn("evaluator", id)
      const ref = (id: string) => refOf(EvaluatorProtocol, address("evaluator", id))
      console.log(`nats ${system.nats.servers} (${system.nats.embedded ? "embedded" : "external"} nats-server ${system.nats.serverVersion}), run ${system.run}`)

      let asked = 0
      let scoreSum = 0
      yield* Effect.forEach(
        Array.from({ length: f.evaluations }, (_, i) => i),
        (i) => {
          const id = ids[i % ids.length]!
          const payload = { candidate: sentence(i, 5), reference: sentence(i + (i % 3), 6) }
          return i % 2 === 0
            ? system.tell(ref(id), "Evaluate", payload).pipe(Effect.asVoid)
            : system.ask(ref(id), "Evaluate", payload).pipe(
                Effect.map((r) => {
                  asked++
                  scoreSum += r.score
                })
              )
        },
        { concurrency: 16, discard: true }
      )
      // Restart one evaluator: its statistics come back from the snapshot.
      const before = yield* waitForAll(system, ref, ids, f.evaluations)
      yield* node.stop("evaluator", ids[0]!)
      yield* node.spawn("evaluator", ids[0]!)
      const restored = yield* system.ask(ref(ids[0]!), "Stats", undefined)

      console.log("\nevaluator  evaluated  mean score")
      for (const [id, s] of before) console.log(`${id.padEnd(10)} ${String(s.evaluated).padStart(9)}  ${(s.scoreSum / Math.max(1, s.evaluated)).toFixed(3).padStart(10)}`)
      console.log(`\n${ids[0]} after a restart from its snapshot: ${restored.evaluated} evaluations (before: ${before.get(ids[0]!)!.evaluated})`)
      console.log(`asks answered: ${asked}, mean score of asked: ${(scoreSum / Math.max(1, asked)).toFixed(3)}`)

      const counts = new Map<string, number>()
      const entries = yield* Stream.runCollect(readJournal(system, { protocols: { evaluator: EvaluatorProtocol } }))
      for (const e of entries) counts.set(`${e.via} ${e.name}`, (counts.get(`${e.via} ${e.name}`) ?? 0) + 1)
      console.log(`\njournal ${system.layout.journalStream}: ${entries.length} messages`)
      for (const [k, n] of [...counts].sort()) console.log(`  ${k.padEnd(24)} ${n}`)
      console.log(`dead letters: stream ${system.layout.deadStream}; registry: KV ${system.layout.registryBucket}; snapshots: KV ${system.layout.stateBucket}`)
      console.log(`done in ${((Date.now() - started) / 1000).toFixed(1)} s`)
      yield* node.drain
    })
    const layer = ActorSystem.layer({ run: f.run }).pipe(Layer.provideMerge(Nats.layer(natsOptionsFromEnv("gyre-demo"))))
    await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(layer)))
    return 0
  }
}

/** Waits until the evaluators have handled `total` evaluations between them; returns their stats. */
const waitForAll = (
  system: typeof ActorSystem.Service,
  ref: (id: string) => ReturnType<typeof refOf<any>>,
  ids: ReadonlyArray<string>,
  total: number
) =>
  Effect.gen(function* () {
    while (true) {
      const stats = new Map<string, { evaluated: number; scoreSum: number }>()
      for (const id of ids) stats.set(id, (yield* system.ask(ref(id), "Stats", undefined)) as { evaluated: number; scoreSum: number })
      if ([...stats.values()].reduce((a, s) => a + s.evaluated, 0) >= total) return stats
      yield* Effect.sleep("50 millis")
    }
  })
