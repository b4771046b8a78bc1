/**
 * Metrics a Prometheus user expects: an idle `gyre node --metrics-port 0` (a child process, no
 * actors) serves the process families (CPU, resident memory, event-loop lag, GC, open handles and
 * descriptors, heap) with sane values, CPU time growing between two scrapes; the system counts
 * the messages and bytes of each channel it sends on (system events, tells, asks); and every
 * subject channel the run's topology declares is counted where it is published and heard
 * (messages, bytes, errors, publish time).
 */
import { Effect } from "effect"
import * as PrometheusMetrics from "effect/observability/PrometheusMetrics"
import { afterEach, describe, expect, it } from "vitest"
import { Events, MicroBatches, RunTopology } from "../../src/protocols/topology.ts"
import type { SubjectChannel } from "../../src/runtime/channel.ts"
import { ensureStream, publishBytes, subscribe } from "../../src/runtime/channel-io.ts"
import { Dead } from "../../src/runtime/events.ts"
import { nodeRef, startNode } from "../../src/runtime/node.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { startNodeProcess, withSystem, type NodeProcess } from "../runtime/harness.ts"

const started: Array<NodeProcess> = []
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

/** `name value` sample lines without labels, and each family's `# TYPE`. */
const parse = (text: string) => {
  const values = new Map<string, number>()
  const types = new Map<string, string>()
  for (const line of text.split("\n")) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line)
    if (type !== null) types.set(type[1]!, type[2]!)
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+)$/.exec(line)
    if (sample !== null) values.set(sample[1]!, Number(sample[2]))
  }
  return { values, types }
}

describe("process and channel metrics", () => {
  it("an idle node's endpoint has the process families with sane values", { timeout: 60_000 }, async () => {
    const { first, second } = await withSystem("procm", Effect.gen(function* () {
      const system = yield* ActorSystem
      const p = startNodeProcess(system.nats.servers, ["--name", "idle", "--run", "procm", "--metrics-port", "0"])
      started.push(p)
      const url = (yield* Effect.promise(() => p.waitFor("ready"))).metrics as string
      const scrape = Effect.promise(() => fetch(url).then((r) => r.text()))
      const first = parse(yield* scrape)
      // Some work in the node between the scrapes: its CPU time grows.
      for (let i = 0; i < 20; i++) yield* system.ask(nodeRef("idle"), "List", undefined)
      const second = parse(yield* scrape)
      p.child.kill("SIGTERM")
      yield* Effect.promise(() => p.exited)
      return { first, second }
    }))
    const v = (name: string) => {
      const value = second.values.get(name)
      if (value === undefined) throw new Error(`no ${name} in the scrape`)
      return value
    }
    expect(second.types.get("process_cpu_seconds_total")).toBe("counter")
    expect(second.types.get("process_resident_memory_bytes")).toBe("gauge")
    expect(v("process_cpu_seconds_total")).toBeGreaterThan(first.values.get("process_cpu_seconds_total")!)
    expect(v("process_cpu_seconds_total")).toBeCloseTo(v("process_cpu_user_seconds_total") + v("process_cpu_system_seconds_total"), 1)
    expect(v("process_resident_memory_bytes")).toBeGreaterThan(20 * 2 ** 20)
    expect(v("process_resident_memory_bytes")).toBeLessThan(16 * 2 ** 30)
    expect(Math.abs(v("process_start_time_seconds") - Date.now() / 1000)).toBeLessThan(600)
    expect(v("process_open_fds")).toBeGreaterThan(2)
    expect(v("nodejs_heap_size_used_bytes")).toBeGreaterThan(0)
    expect(v("nodejs_heap_size_used_bytes")).toBeLessThanOrEqual(v("nodejs_heap_size_total_bytes"))
    expect(v("nodejs_eventloop_lag_seconds")).toBeGreaterThan(0)
    expect(v("nodejs_eventloop_lag_seconds")).toBeLessThanOrEqual(v("nodejs_eventloop_lag_max_seconds"))
    expect(v("nodejs_eventloop_lag_max_seconds")).toBeLessThan(10)
    expect(v("nodejs_gc_runs_total")).toBeGreaterThanOrEqual(0)
    expect(v("nodejs_gc_duration_seconds_total")).toBeLessThan(v("process_cpu_seconds_total") + 1)
    expect(v("nodejs_active_handles")).toBeGreaterThan(0)
  })

  it("counts each channel's messages and bytes where the system sends them", { timeout: 30_000 }, async () => {
    const text = await withSystem("chanm", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* startNode<never>({ name: "c1", types: [] })
      yield* system.publishEvent(Dead, { kind: "k", id: "i", node: "n", incarnation: 1, silentForMs: 5 })
      yield* system.publishEvent(Dead, { kind: "k", id: "j", node: "n", incarnation: 1, silentForMs: 5 })
      yield* system.ask(nodeRef("c1"), "List", undefined)
      return PrometheusMetrics.formatUnsafe(yield* Effect.context<never>())
    }))
    const sample = (name: string, channel: string) =>
      Number(new RegExp(`^${name}\\{(?=[^}]*channel="${channel.replace(".", "\\.")}")(?=[^}]*direction="out")[^}]*\\} (\\S+)$`, "m").exec(text)?.[1])
    const deadBytes = Dead.encode({ kind: "k", id: "i", node: "n", incarnation: 1, silentForMs: 5 }).length * 2
    expect(sample("gyre_channel_messages_total", "sys.dead")).toBe(2)
    expect(sample("gyre_channel_bytes_total", "sys.dead")).toBe(deadBytes)
    expect(sample("gyre_channel_messages_total", "ask.node")).toBeGreaterThanOrEqual(1)
    expect(sample("gyre_channel_messages_total", `sys.${Events.step.name}`)).toBeNaN()
  })

  it("counts every subject channel of the topology: messages, bytes, errors and publish time out, messages and errors in", { timeout: 30_000 }, async () => {
    const channels = RunTopology.channels.filter((c): c is SubjectChannel<any> => c._tag === "Subjects")
    const data = new TextEncoder().encode(`{"not":"a value of any channel"}`)
    const text = await withSystem("chanall", Effect.gen(function* () {
      const system = yield* ActorSystem
      // A publish on a stream that does not exist yet fails: an error of its channel.
      const failed = yield* Effect.exit(publishBytes(system, MicroBatches, 1, { data }))
      expect(failed._tag).toBe("Failure")
      const heard: Array<unknown> = []
      // Each stream with every channel it stores (the trajectory stream holds calls and outcomes).
      for (const stream of new Set(channels.flatMap((c) => c.stream ?? []))) {
        const stored = channels.filter((c) => c.stream === stream)
        yield* ensureStream(system, [stored[0]!, ...stored.slice(1)])
      }
      for (const c of channels) {
        if (c.stream === undefined) yield* subscribe(system, c, "k1", (v) => heard.push(v))
        yield* publishBytes(system, c, "k1", { data })
      }
      // Core NATS delivers asynchronously: wait for the subscriptions to have heard theirs.
      yield* Effect.promise(() => system.nats.nc.flush())
      yield* Effect.sleep("200 millis")
      expect(heard).toEqual([])
      return PrometheusMetrics.formatUnsafe(yield* Effect.context<never>())
    }))
    const sample = (name: string, channel: string, direction: "in" | "out") =>
      Number(new RegExp(`^${name}\\{(?=[^}]*channel="${channel}")(?=[^}]*direction="${direction}")[^}]*\\} (\\S+)$`, "m").exec(text)?.[1])
    expect(channels.map((c) => c.name).sort()).toEqual(["calls", "micro-batches", "outcomes", "tokens"])
    for (const c of channels) {
      expect([c.name, sample("gyre_channel_messages_total", c.name, "out")]).toEqual([c.name, 1])
      expect([c.name, sample("gyre_channel_bytes_total", c.name, "out")]).toEqual([c.name, data.length])
      expect([c.name, sample("gyre_channel_publish_seconds_count", c.name, "out")]).toEqual([c.name, 1])
    }
    expect(sample("gyre_channel_errors_total", MicroBatches.name, "out")).toBe(1)
    expect(sample("gyre_channel_errors_total", "calls", "out")).toBeNaN()
    // The core channel's message was heard, and did not decode as a token chunk: an error in.
    expect(sample("gyre_channel_messages_total", "tokens", "in")).toBe(1)
    expect(sample("gyre_channel_errors_total", "tokens", "in")).toBe(1)
  })
})
