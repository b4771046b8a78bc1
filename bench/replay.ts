/**
 * `npm run bench:replay`: how fast `gyre replay` reads and verifies a long journal. Not a test:
 * a table, then one JSON line with `events`, `decode_per_s`, `verify_per_s`.
 *
 * The journal: the simulator's run of a long scenario (`--steps`, default 800 steps of 64
 * executions on 4 cells, >= 100k policy events) under the elastic policy, each event journaled as
 * the live scheduler journals it (a `PolicyRecord` with its actions and the policy-state digest,
 * on `gyre.<run>.sys.policy`, after a `run-config`), on an embedded nats-server. Then, timed:
 * - decode: every entry read and decoded (`readEntries`: subject, headers, JSON, the record's
 *   schema), three times over; `decode_per_s` is the median read, target >= 50k entries/s, and
 *   `decode_first_per_s` the first (a cold process: the JIT compiles the read path during it);
 * - verify: `verifyRun` (the read, the integrity scan, every record replayed through the policy
 *   and its digest compared), target >= 20k entries/s.
 */
import { Effect, Layer, Schema, Stream } from "effect"
import { fixedPolicies, type Policy } from "../src/policy/index.ts"
import { RunConfig } from "../src/protocols/run.ts"
import type { PolicyRecord } from "../src/protocols/scheduler.ts"
import { openRun, readEntries } from "../src/replay/read.ts"
import { verified, verifyRun } from "../src/replay/verify.ts"
import { layout } from "../src/runtime/names.ts"
import { Nats } from "../src/runtime/nats.ts"
import { stateDigest } from "../src/scheduling/driver.ts"
import { executionsOf, parseScenario } from "../src/sim/scenario.ts"
import { simulate } from "../src/sim/simulate.ts"
import { atLeast, benchFlags } from "./flags.ts"
import { printResult } from "./results.ts"

const BENCH = "bench:replay"
const f = benchFlags(BENCH, "how fast gyre replay reads and verifies a long journal", {
  steps: { kind: "integer", doc: "simulated steps journaled (64 executions each)", default: 800 }
})
const steps = atLeast(BENCH, "steps", f.steps, 1)
const run = "bench-replay"

const scenario = parseScenario(
  {
    cells: 4,
    slots_per_cell: 16,
    train_tokens_per_s_per_cell: 20_000,
    switch_to_train_s: 2,
    switch_to_rollout_s: 1,
    weight_sync_s: 1,
    steps,
    executions_per_step: 64,
    max_staleness: 1,
    generator: { kind: "lognormal", median_s: 60, sigma: 1, max_s: 1200, tokens_per_s: 50, seed: 3 }
  },
  "bench:replay"
)

const config: RunConfig = {
  run,
  policy: "elastic",
  policyConfig: { slots_per_cell: scenario.slots_per_cell, executions_per_step: scenario.executions_per_step, steps, max_staleness: scenario.max_staleness },
  suite: "none",
  groupSize: 4,
  env: {},
  seed: 1,
  training: { advantage: "grpo", mode: "exact", maxPaths: 5, loss: "ppo", clipLow: 0.2, clipHigh: 0.28, isCap: 2, lr: 5e-4, microBatchTokens: 4096, checkpointEvery: 4 },
  checkpoint: "/none",
  checkpointDir: "/none",
  startedAt: Date.now()
}

/** The simulated run as the live scheduler would have journaled it. */
const records = (): Array<PolicyRecord> => {
  const policy = fixedPolicies.elastic! as Policy<unknown>
  const sim = simulate(scenario, executionsOf(scenario), policy, { journal: true })
  let state = policy.initial(config.policyConfig)
  return sim.journal!.map(({ event }, index) => {
    const t = policy.step(state, event)
    state = t.state
    return { index, term: 1, event, actions: t.actions, digest: stateDigest(policy, t.state) }
  })
}

const timed = async <A>(f: () => Promise<A>) => {
  const t0 = performance.now()
  const value = await f()
  return { value, s: (performance.now() - t0) / 1000 }
}

const main = async () => {
  const journal = records()
  const encode = Schema.encodeSync(Schema.toCodecJson(RunConfig))
  const program = Effect.gen(function* () {
    const nats = yield* Nats
    const names = layout(run)
    yield* Effect.promise(() => nats.jsm.streams.add({ name: names.journalStream, subjects: names.journalSubjects }))
    // Plain publishes into the stream (no ack per message), then wait until all are stored.
    nats.nc.publish(names.sys("run-config"), JSON.stringify(encode(config)))
    for (const r of journal) nats.nc.publish(names.sys("policy"), JSON.stringify(r))
    yield* Effect.promise(() => nats.nc.flush())
    const total = journal.length + 1
    while ((yield* Effect.promise(() => nats.jsm.streams.info(names.journalStream))).state.messages < total) yield* Effect.sleep("50 millis")
    const log = yield* openRun(nats, run)
    const decodes: Array<{ value: number; s: number }> = []
    for (let i = 0; i < 3; i++) decodes.push(yield* Effect.promise(() => timed(() => Effect.runPromise(Stream.runCount(readEntries(log))))))
    const decode = [...decodes].sort((a, b) => a.s - b.s)[1]!
    const verify = yield* Effect.promise(() => timed(() => Effect.runPromise(verifyRun(log, false))))
    if (!verified(verify.value)) throw new Error(`the generated journal did not verify: ${JSON.stringify(verify.value).slice(0, 400)}`)
    return { events: decode.value, decodeS: decode.s, firstS: decodes[0]!.s, verifyS: verify.s }
  })
  const r = await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(Layer.fresh(Nats.layer({})))))
  const decodePerS = Math.round(r.events / r.decodeS)
  const verifyPerS = Math.round(r.events / r.verifyS)
  const firstPerS = Math.round(r.events / r.firstS)
  console.log(`journal entries  ${r.events} (${steps} simulated steps of ${scenario.executions_per_step} executions, elastic, ${scenario.cells} cells)`)
  console.log(`decode           ${r.decodeS.toFixed(2)} s   ${decodePerS} entries/s   (median of 3 reads; target >= 50000)`)
  console.log(`decode, first   ${r.firstS.toFixed(2)} s   ${firstPerS} entries/s   (a cold process)`)
  console.log(`verify           ${r.verifyS.toFixed(2)} s   ${verifyPerS} entries/s   (target >= 20000)`)
  printResult(BENCH, { events: r.events, decode_per_s: decodePerS, decode_first_per_s: firstPerS, verify_per_s: verifyPerS })
}

await main()
