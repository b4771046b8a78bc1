/**
 * What a node reports: Prometheus metrics scraped from `gyre node --metrics-port` (a child
 * process), its JSON log lines, and spans exported over OTLP/HTTP to a collector (a local HTTP
 * server that records what it is sent), the handler's span a child of the asker's across NATS.
 */
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { ConfigProvider, Duration, Effect, Exit, Layer } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { observabilityLayer } from "../../src/runtime/observability.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Ledger, LedgerProtocol } from "../fixtures/actors.ts"
import { startNodeProcess, withSystem, type NodeProcess } from "./harness.ts"

const ledger = (id: string) => refOf(LedgerProtocol, address("ledger", id))

const started: Array<NodeProcess> = []
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

interface Sample {
  readonly name: string
  readonly labels: Record<string, string>
  readonly value: number
}

/** Parses the Prometheus text format's sample lines. */
const parseSamples = (text: string): Array<Sample> =>
  text
    .split("\n")
    .filter((l) => l !== "" && !l.startsWith("#"))
    .map((line) => {
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
      if (m === null) throw new Error(`not a sample line: ${line}`)
      const labels: Record<string, string> = {}
      for (const [, k, v] of (m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[k!] = v!
      return { name: m[1]!, labels, value: Number(m[3]) }
    })

const sample = (samples: ReadonlyArray<Sample>, name: string, labels: Record<string, string>) =>
  samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value

describe("observability", () => {
  it("gyre node --metrics-port serves Prometheus metrics of its actors, and logs JSON lines on stderr", async () => {
    const result = await withSystem("prom", Effect.gen(function* () {
      const system = yield* ActorSystem
      const p = startNodeProcess(system.nats.servers, ["--name", "mnode", "--run", "prom", "--load", "test/fixtures/actors.ts", "--spawn", "ledger/m1", "--metrics-port", "0"], {
        GYRE_LOG_FORMAT: "json"
      })
      started.push(p)
      const ready = yield* Effect.promise(() => p.waitFor("ready"))
      for (const item of ["a", "b", "c"]) yield* system.tell(ledger("m1"), "Append", { item })
      const deadline = Date.now() + 20_000
      while ((yield* system.ask(ledger("m1"), "Items", undefined)).length < 3 && Date.now() < deadline) yield* Effect.sleep(Duration.millis(50))
      const boom = yield* Effect.exit(system.ask(ledger("m1"), "Boom", { why: "test" }))
      const url = ready.metrics as string
      const text = yield* Effect.promise(() => fetch(url).then((r) => r.text()))
      const missing = yield* Effect.promise(() => fetch(url.replace("/metrics", "/nope")).then((r) => r.status))
      p.child.kill("SIGTERM")
      yield* Effect.promise(() => p.exited)
      return { url, text, missing, boom, stderr: p.stderr() }
    }))
    expect(result.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/)
    expect(result.missing).toBe(404)
    expect(Exit.isFailure(result.boom)).toBe(true)
    const samples = parseSamples(result.text)
    const actor = { actor: "ledger/m1", node: "mnode" }
    expect(sample(samples, "gyre_messages_handled_total", { ...actor, via: "tell", outcome: "ok" })).toBe(3)
    expect(sample(samples, "gyre_messages_handled_total", { ...actor, via: "ask", outcome: "error" })).toBe(1)
    expect(sample(samples, "gyre_messages_handled_total", { ...actor, via: "ask", outcome: "ok" })).toBeGreaterThanOrEqual(1)
    expect(sample(samples, "gyre_handler_seconds_count", { ...actor, via: "tell" })).toBe(3)
    expect(sample(samples, "gyre_handler_seconds_bucket", { ...actor, via: "tell", le: "+Inf" })).toBe(3)
    expect(sample(samples, "gyre_mailbox_depth", actor)).toBe(0)
    expect(sample(samples, "gyre_handlers_running", actor)).toBe(0)
    expect(sample(samples, "gyre_dead_letters_total", actor) ?? 0).toBe(0)
    const logs = result.stderr
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { message: unknown; level: string })
    expect(logs.some((l) => String(l.message).includes("node mnode serving run prom"))).toBe(true)
    expect(logs.every((l) => typeof l.level === "string")).toBe(true)
  })

  it("exports spans and metrics over OTLP/HTTP; the handler's span is a child of the ask's across NATS", async () => {
    const received: Array<{ path: string; body: any }> = []
    const collector = http.createServer((req, res) => {
      let body = ""
      req.on("data", (c: Buffer) => (body += c.toString()))
      req.on("end", () => {
        received.push({ path: req.url ?? "", body: JSON.parse(body) })
        res.writeHead(200, { "content-type": "application/json" }).end("{}")
      })
    })
    await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve))
    const endpoint = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`
    const otel = ConfigProvider.layer(
      ConfigProvider.fromEnvRecord({
        OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
        OTEL_TRACES_EXPORTER: "otlp",
        OTEL_METRICS_EXPORTER: "otlp"
      })
    )
    try {
      await withSystem("otlp", Effect.gen(function* () {
        const system = yield* ActorSystem
        const node = yield* startNode({ name: "n1", types: [Ledger] })
        yield* node.spawn("ledger", "o1")
        yield* system.ask(ledger("o1"), "Append", { item: "traced" })
      }).pipe(Effect.provide(observabilityLayer("gyre-test").pipe(Layer.provide(otel)))))
    } finally {
      collector.close()
    }
    const spans = received
      .filter((r) => r.path === "/v1/traces")
      .flatMap((r) => r.body.resourceSpans)
      .flatMap((rs: any) => rs.scopeSpans)
      .flatMap((ss: any) => ss.spans) as Array<{ name: string; traceId: string; spanId: string; parentSpanId?: string; attributes: Array<{ key: string; value: any }> }>
    const ask = spans.find((s) => s.name === "Actor.ask")
    const handler = spans.find((s) => s.name === "Actor.handler" && s.attributes.some((a) => a.key === "gyre.actor" && a.value.stringValue === "ledger/o1"))
    expect(ask).toBeDefined()
    expect(handler).toBeDefined()
    expect(handler!.traceId).toBe(ask!.traceId)
    expect(handler!.parentSpanId).toBe(ask!.spanId)
    expect(handler!.attributes).toContainEqual({ key: "gyre.request", value: { stringValue: "Append" } })
    const metricNames = received
      .filter((r) => r.path === "/v1/metrics")
      .flatMap((r) => r.body.resourceMetrics)
      .flatMap((rm: any) => rm.scopeMetrics)
      .flatMap((sm: any) => sm.metrics)
      .map((m: any) => m.name)
    expect(metricNames).toContain("gyre_messages_handled_total")
  })
})
