/**
 * Replay of a run holding long executions, on a real nats-server: three executions of 70k+
 * unique tokens each (prompts growing to their whole context over 60 calls, a retry every tenth
 * call), their call records written on the run's trajectory stream as the gateway writes them,
 * and a step journaled as the core trainer journals it (its `TrainExecution` tells, its metrics
 * with each tree and every micro-batch digest at a budget far below the paths). Each reader runs
 * as a child process whose heap is capped at `HEAP_MB` (the CLI alone needs ~40 MB), while the
 * export's `calls.jsonl` holds 25+ MB of token ids and its parsed arrays more: holding the file,
 * its calls or the run's trees at once does not fit. `gyre replay --export` writes every call;
 * the export read back as `--from-export` reads it rebuilds the very trees; `--trees` re-plans
 * the step and matches every tree and micro-batch; `--verify` (in process) passes. The export
 * and the read-back as they were before they streamed both die of the cap on this run.
 */
import { execFile } from "node:child_process"
import { mkdtempSync, readFileSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { packedBatchDigest } from "../../src/common/packed-batch.ts"
import { TrainingProtocol, type StepExecutionRef, type StepPlan } from "../../src/protocols/device.ts"
import { ensureTrajectoryStream, rlLayout } from "../../src/protocols/layout.ts"
import { RunConfig, executionName } from "../../src/protocols/run.ts"
import { Events } from "../../src/protocols/topology.ts"
import { openRun } from "../../src/replay/read.ts"
import { verified, verifyRun } from "../../src/replay/verify.ts"
import { address } from "../../src/runtime/names.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { MetricsSum, PhaseClock } from "../../src/training/step-metrics.ts"
import { StepPlanner } from "../../src/training/step-planner.ts"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import { DeltaEncoder } from "../../src/tree/encoder.ts"
import { CallRecordJson, plainCall, type ModelCall } from "../../src/tree/record.ts"
import { treeDigest } from "../../src/tree/stats.ts"
import type { TrajectoryTree } from "../../src/tree/tree.ts"
import { withSystem } from "../runtime/harness.ts"
import { runConfig, scored } from "../training/fixtures.ts"
import { gyre } from "./recorded.ts"

const RUN = "longreplay"
const CALLS = 60
const TOOL_TOKENS = 1000
const OUTPUT_TOKENS = 150

/** One long agent execution: a 2k system prompt, each call adding a tool result to the last call's context; every tenth call retried. */
function* longCalls(seed: number): Generator<ModelCall> {
  let s = seed
  const token = () => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) % 256
  const tokens = (n: number) => Array.from({ length: n }, token)
  let context = tokens(2000)
  for (let c = 0; c < CALLS; c++) {
    context = [...context, ...tokens(TOOL_TOKENS)]
    const call = (id: string) => {
      const output = tokens(OUTPUT_TOKENS)
      return plainCall(id, "main", context, output, { logprobs: Float32Array.from(output, (_, i) => -1 - (i % 7) / 4), versions: new Int32Array(OUTPUT_TOKENS) })
    }
    if (c % 10 === 9) yield call(`c${c}r`)
    const kept = call(`c${c}`)
    yield kept
    context = [...kept.prompt, ...kept.output]
  }
}

const encodeRecord = Schema.encodeSync(CallRecordJson)

/** Old-space heap of every reader child (`--max-old-space-size`), MB. */
const HEAP_MB = 80

/** Runs `node --max-old-space-size=HEAP_MB` on `args` against the test's server; exit code and stdout. */
const capped = (args: ReadonlyArray<string>, natsUrl: string) =>
  Effect.promise(
    () =>
      new Promise<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resolve) =>
        execFile("node", [`--max-old-space-size=${HEAP_MB}`, ...args], { encoding: "utf8", env: { ...process.env, NATS_URL: natsUrl }, timeout: 110_000, maxBuffer: 16 << 20 }, (e, stdout, stderr) =>
          resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : 1, stdout, stderr })
        )
      )
  )

describe("replay of long executions", () => {
  it("exports, reads back, checks trees and verifies a run of three 70k-token executions with bounded memory", async () => {
    const out = mkdtempSync(join(tmpdir(), "gyre-replay-long-"))
    const result = await withSystem(
      RUN,
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const config: RunConfig = { ...runConfig(RUN, join(out, "ckpt"), { executions: 3, microBatchTokens: 4096 }), groupSize: 3 }
        yield* system.publishEvent(Events.runConfig, config)
        yield* ensureTrajectoryStream(system)
        const names = rlLayout(RUN)
        const plan: StepPlan = { step: 0, attempt: 0, version: 0, executions: 3, groupSizes: [3], cells: ["device/core"] }
        const refs: Array<StepExecutionRef> = []
        const digests = new Map<string, string>()
        const trees = new Map<string, TrajectoryTree>()
        for (let n = 0; n < 3; n++) {
          const execution = executionName(0, n)
          const encoder = new DeltaEncoder({ run: RUN, task: "long", execution })
          const decoder = new DeltaDecoder(execution)
          for (const call of longCalls(17 + n)) {
            const record = encoder.encode(call)
            decoder.add(record)
            yield* Effect.promise(() => system.nats.js.publish(names.calls(execution), encodeRecord(record), { msgID: `${execution}.${call.callId}` }))
          }
          const outcome = scored(RUN, "long", execution, [0.1, 0.5, 0.9][n]!)
          yield* Effect.promise(() => system.nats.js.publish(names.outcomes(execution), JSON.stringify(outcome)))
          refs.push({ step: 0, execution, task: "long", group: 0, tokens: decoder.tree.uniqueTokens, outcome })
          digests.set(execution, treeDigest(decoder.tree))
          trees.set(execution, decoder.tree)
        }
        // The step as the core journals it: its tells, then its metrics (planned on trees rebuilt from the records).
        const planner = new StepPlanner(plan, config.training, config.seed)
        const batchDigests: Array<string> = []
        let largest = 0
        for (const ref of refs) {
          yield* system.tell(refOf(TrainingProtocol, address("device", "core")), "TrainExecution", ref, { msgId: `train-${ref.execution}` })
          const told = planner.tell(ref, trees.get(ref.execution)!)
          if (told._tag !== "Queued") throw new Error(told._tag)
          for (const mb of told.microBatches) {
            largest = Math.max(largest, mb.tokens)
            batchDigests.push(packedBatchDigest(mb.build()))
          }
        }
        const metrics = new MetricsSum().metrics({
          step: 0,
          figures: planner.figures,
          microBatches: planner.microBatches,
          batchDigests,
          devices: ["device/core"],
          gradNorm: 0,
          clock: new PhaseClock(0),
          reduceMs: 0,
          publishMs: 0
        })
        yield* system.publishEvent(Events.step, { ...metrics, plan })
        trees.clear()
        const url = system.nats.servers
        const exported = yield* capped([gyre, "replay", RUN, "--export", out, "--json"], url)
        const readBack = yield* capped(["--import", "tsx", new URL("./read-export.ts", import.meta.url).pathname, out], url)
        const checked = yield* capped([gyre, "replay", RUN, "--trees", "--json"], url)
        const verification = yield* verifyRun(yield* openRun(system.nats, RUN), false)
        return { refs, digests, largest, microBatches: planner.microBatches, exported, readBack, checked, verification }
      })
    )
    const { refs, digests, exported, readBack, checked, verification } = result
    for (const ref of refs) expect(ref.tokens).toBeGreaterThan(70_000)
    expect(exported.code).toBe(0)
    expect(JSON.parse(exported.stdout)).toMatchObject({ calls: 3 * (CALLS + CALLS / 10), outcomes: 3, steps: 1, plans: 1, malformed: 0 })
    expect(statSync(join(out, "calls.jsonl")).size).toBeGreaterThan(25 << 20)
    const plans = readFileSync(join(out, "plans.jsonl"), "utf8").trim()
    expect(JSON.parse(plans).told.map((r: StepExecutionRef) => r.execution)).toEqual(refs.map((r) => r.execution))
    expect(readBack.code).toBe(0)
    expect(JSON.parse(readBack.stdout)).toEqual(Object.fromEntries(digests))
    // The long paths made micro-batches past the 4,096-token budget; every tree and digest matches.
    expect(result.largest).toBeGreaterThan(4096)
    expect(checked.code).toBe(0)
    expect(JSON.parse(checked.stdout)).toMatchObject({ ok: true, steps: 1, executions: 3, microBatches: result.microBatches, mismatches: [], unrecorded: [] })
    expect(verified(verification)).toBe(true)
  }, 240_000)
})
