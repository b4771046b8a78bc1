/**
 * `gyre replay --trees` and `gyre train --from-export` on a real `gyre train` run (the toy suite,
 * one CPU device, a short cached warm start so groups score differently and micro-batches get
 * planned, a checkpoint after every step): every execution's tree rebuilt from its call records
 * matches what the core trainer journaled, and the re-planned micro-batches match its packed-batch
 * digests; an export trained offline gives the live step's weights byte for byte, and an export
 * with altered log-probs does not; with the StartStep asks' journal copies deleted the check
 * still passes (each step's metrics carry its plan); with one call record deleted from the
 * trajectory stream the tree check fails naming the execution and the first node that differs.
 */
import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Stream } from "effect"
import { beforeAll, describe, expect, it } from "vitest"
import { Nats } from "../../src/runtime/nats.ts"
import { readStored, type StreamMessage } from "../../src/runtime/stream-reader.ts"
import { gyre, gyreCli } from "./recorded.ts"

const run = "trees"
let store: string

beforeAll(() => {
  store = join(mkdtempSync(join(tmpdir(), "gyre-replay-trees-")), "store")
  const args = ["train", "--run", run, "--steps", "2", "--devices", "1", "--executions-per-step", "4", "--group-size", "4", "--slots", "4", "--horizon", "6"]
  const warm = ["--demo-tasks", "8", "--sft-steps", "30", "--env", "TOY_TOOL_MS=20,TOY_MAX_TOKENS=24", "--heldout", "heldout-0", "--store", store, "--checkpoint-every", "1", "--json"]
  execFileSync("node", [gyre, ...args, ...warm], { stdio: "ignore", timeout: 280_000 })
}, 300_000)

/** Deletes the messages `choose` picks from `stream` of the stopped store; returns them. */
const deleteStored = (stream: string, choose: (msgs: ReadonlyArray<StreamMessage>) => ReadonlyArray<StreamMessage>) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const nats = yield* Nats
        const chosen = choose([...(yield* Stream.runCollect(readStored(nats, stream)))])
        for (const m of chosen) yield* Effect.promise(() => nats.jsm.streams.deleteMessage(stream, m.seq))
        return chosen
      }).pipe(Effect.provide(Nats.layer({ storeDir: store })))
    )
  )

describe("gyre replay --trees", { timeout: 240_000 }, () => {
  it("passes on the real run: every tree and every planned micro-batch as the trainer recorded it", async () => {
    const r = await gyreCli(["replay", run, "--store", store, "--trees", "--json"])
    expect(r.code).toBe(0)
    const c = JSON.parse(r.stdout)
    expect(c).toMatchObject({ ok: true, steps: 2, executions: 8, mismatches: [], unrecorded: [] })
    const steps = (await gyreCli(["replay", run, "--store", store, "--type", "step", "--json"])).stdout.trim().split("\n").map((l) => JSON.parse(l).payload)
    expect(c.microBatches).toBe(steps.reduce((a: number, s: { microBatches: number }) => a + s.microBatches, 0))
  })

  it("train --from-export gives the live step's update bit for bit; altered log-probs do not", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-replay-fromexport-"))
    expect((await gyreCli(["replay", run, "--store", store, "--export", dir])).code).toBe(0)
    const live = JSON.parse((await gyreCli(["replay", run, "--store", store, "--type", "step", "--json"])).stdout.trim().split("\n")[0]!).payload
    expect(live.microBatches).toBeGreaterThan(0)
    const r = await gyreCli(["train", "--from-export", dir])
    expect(r.code).toBe(0)
    const trained = JSON.parse(r.stdout.trim().split("\n").at(-1)!)
    expect(trained).toMatchObject({ step: 0, microBatches: live.microBatches, batchDigests: live.batchDigests, live: { identical: true } })
    expect(trained.gradNorm).toBe(live.gradNorm)
    // The same export with every behaviour log-prob moved: another update, refused as different.
    const calls = readFileSync(join(dir, "calls.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l))
    writeFileSync(join(dir, "calls.jsonl"), calls.map((c) => JSON.stringify({ ...c, logprobs: c.logprobs.map((x: number) => x - 0.5) })).join("\n") + "\n")
    const altered = await gyreCli(["train", "--from-export", dir])
    expect(altered.code).toBe(1)
    expect(altered.stdout).toMatch(/DIFFERENT from the live/)
  })

  it("passes with the StartStep asks' journal copies gone (at most once: a server lost then loses one): the plan comes from the step's metrics", async () => {
    const deleted = await deleteStored(`GYRE_${run}_JOURNAL`, (msgs) =>
      msgs.filter((m) => m.subject.startsWith(`gyre.${run}.asked.device.`) && m.headers?.get("Gyre-Request") === "StartStep")
    )
    expect(deleted.length).toBeGreaterThanOrEqual(2)
    const r = await gyreCli(["replay", run, "--store", store, "--trees", "--json"])
    expect(r.code).toBe(0)
    expect(JSON.parse(r.stdout)).toMatchObject({ ok: true, steps: 2, executions: 8, mismatches: [], unrecorded: [] })
  })

  it("fails naming the execution when one of its call records is gone", async () => {
    // The last call record of one execution.
    const [gone] = await deleteStored(`GYRE_${run}_TRAJECTORIES`, (msgs) => msgs.filter((m) => m.subject === `gyre.${run}.calls.b0-x1`).slice(-1))
    const victim = gone!.subject.split(".").at(-1)!
    const r = await gyreCli(["replay", run, "--store", store, "--trees"])
    expect(r.code).toBe(1)
    expect(r.stdout).toMatch(new RegExp(`mismatch in step 0, execution ${victim}: (calls|uniqueTokens|paths|digest): rebuilt`))
    expect(r.stdout).toMatch(/\n  first differing node: #\d+ in preorder, /)
    expect(r.stdout).toMatch(/FAILED: 8 executions/)
    // The trainer journaled the tree's node digests: the rebuilt tree, one call short, differs at a node of it.
    const j = JSON.parse((await gyreCli(["replay", run, "--store", store, "--trees", "--json"])).stdout)
    const [m] = j.mismatches
    expect(m).toMatchObject({ step: 0, execution: victim })
    expect(m.node.recordedNodes).toBeGreaterThan(0)
    expect(m.node.index).toBeLessThan(Math.max(m.node.recordedNodes, m.node.rebuiltNodes))
  })
})
