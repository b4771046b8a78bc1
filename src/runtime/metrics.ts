/**
 * The runtime's metrics (effect `Metric`s) and their Prometheus endpoint.
 *
 * Per actor (attributes `actor` = `kind/id`, its `kind`, `node`):
 * - `gyre_messages_handled_total{via, outcome}`: messages through the dispatch; outcome `ok`,
 *   `error` (the handler's typed failure), `crash` (a defect), `rejected` (dead-lettered before a
 *   handler ran), `duplicate` (an id already handled), `overloaded` (an ask refused: its queue
 *   was full);
 * - `gyre_handler_seconds{via}`: handler latency, a histogram;
 * - `gyre_redeliveries_total`: tells delivered more than once;
 * - `gyre_dead_letters_total`;
 * - `gyre_mailbox_depth` (messages waiting) and `gyre_handlers_running`, gauges read from the
 *   mailbox when the metrics are read (nothing to update per message).
 *
 * Per channel (`channelMetrics`, attributes `channel`, `direction` in|out):
 * `gyre_channel_messages_total`, `gyre_channel_bytes_total` (payload), `gyre_channel_errors_total`
 * (failed publishes, messages received that did not decode) and `gyre_channel_publish_seconds`
 * (a histogram: until stored, or sent on core NATS). Every channel of the topology is counted
 * where it is published and subscribed (`channel-io.ts`: channel `<name>`, e.g. `calls`,
 * `micro-batches`, `tokens`); the system's tells, asks and system events are counted in the
 * system (messages and bytes; channel `tell.<kind>`, `ask.<kind>`, `sys.<event>`).
 *
 * Per process, read when scraped (`processMetrics`, the names a Prometheus user expects):
 * `process_cpu_seconds_total` (and `_user_`/`_system_`), `process_resident_memory_bytes`,
 * `process_start_time_seconds`, `process_open_fds`, `nodejs_heap_size_used_bytes`,
 * `nodejs_heap_size_total_bytes`, `nodejs_external_memory_bytes`, `nodejs_eventloop_lag_seconds`
 * (mean) / `_p99_seconds` / `_max_seconds` (since the endpoint started), `nodejs_gc_runs_total`,
 * `nodejs_gc_duration_seconds_total`, `nodejs_active_handles`.
 *
 * `serveMetrics` answers `GET /metrics` on 127.0.0.1 with every metric of the process's
 * registry in the Prometheus text format (plain `node:http`).
 */
import * as fs from "node:fs"
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { PerformanceObserver, monitorEventLoopDelay } from "node:perf_hooks"
import { Context, Effect, Metric, Schema, Scope } from "effect"
import * as PrometheusMetrics from "effect/observability/PrometheusMetrics"

export type Via = "tell" | "ask"
export type HandledOutcome = "ok" | "error" | "crash" | "rejected" | "duplicate" | "overloaded"

const latencyBoundaries = Metric.exponentialBoundaries({ start: 0.00005, factor: 2, count: 19 })

/** Updates of one actor's metrics; every call is synchronous and cheap (hot path). */
export interface ActorMetrics {
  readonly handled: (via: Via, outcome: HandledOutcome, seconds: number | undefined) => void
  readonly redelivered: () => void
  readonly deadLettered: () => void
  /** Reports the mailbox's depth and running handlers when read, until the returned function is called. */
  readonly watch: (waiting: () => number, running: () => number) => () => void
}

/**
 * The metrics of `actor` on `node`, updated in the registry of `context`. One metric value per
 * attribute set is built up front, so an update is a map lookup and an add.
 */
export const actorMetrics = (actor: string, node: string, context: Context.Context<never>): ActorMetrics => {
  const attributes = { actor, kind: actor.slice(0, actor.indexOf("/")), node }
  const counters: Record<string, Metric.Counter<number>> = {}
  const histograms: Record<string, Metric.Histogram<number>> = {}
  const handledCounter = (via: Via, outcome: HandledOutcome) =>
    (counters[via + outcome] ??= Metric.counter("gyre_messages_handled_total", {
      description: "messages through an actor's dispatch, by outcome",
      attributes: { ...attributes, via, outcome },
      incremental: true
    }))
  const latency = (via: Via) =>
    (histograms[via] ??= Metric.histogram("gyre_handler_seconds", {
      description: "handler latency",
      attributes: { ...attributes, via },
      boundaries: latencyBoundaries
    }))
  const redeliveries = Metric.counter("gyre_redeliveries_total", { description: "tells delivered more than once", attributes, incremental: true })
  const deadLetters = Metric.counter("gyre_dead_letters_total", { description: "messages sent to the dead-letter stream", attributes, incremental: true })
  const waitingGauge = Metric.gauge("gyre_mailbox_depth", { description: "messages waiting in an actor's mailbox", attributes })
  const runningGauge = Metric.gauge("gyre_handlers_running", { description: "handlers running", attributes })
  const gauge = (metric: Metric.Gauge<number>, read: () => number) =>
    Metric.registerUnsafe(metric, context, { get: () => ({ value: read() }), update: () => {}, modify: () => {} })
  return {
    handled: (via, outcome, seconds) => {
      handledCounter(via, outcome).updateUnsafe(1, context)
      if (seconds !== undefined) latency(via).updateUnsafe(seconds, context)
    },
    redelivered: () => redeliveries.updateUnsafe(1, context),
    deadLettered: () => deadLetters.updateUnsafe(1, context),
    watch: (waiting, running) => {
      const registrations = [gauge(waitingGauge, waiting), gauge(runningGauge, running)]
      return () => registrations.forEach((r) => r.remove())
    }
  }
}

export type Direction = "in" | "out"

/** Updates of one channel's metrics in one direction; every call is synchronous and cheap (hot path). */
export interface ChannelMetrics {
  /** One message of `bytes` payload bytes through the channel. */
  readonly message: (bytes: number) => void
  /** A publish that failed, or a message received that did not decode. */
  readonly error: () => void
  /** How long a publish took until stored (a stream) or sent (core NATS). */
  readonly seconds: (s: number) => void
}

interface ChannelDefinitions {
  readonly messages: Metric.Counter<number>
  readonly bytes: Metric.Counter<number>
  readonly errors: Metric.Counter<number>
  readonly seconds: Metric.Histogram<number>
}

/** The metric definitions of each channel and direction, made once (an update resolves its registry from the context given). */
const channelDefinitions = new Map<string, ChannelDefinitions>()

const definitionsOf = (channel: string, direction: Direction): ChannelDefinitions => {
  const key = `${direction} ${channel}`
  let d = channelDefinitions.get(key)
  if (d === undefined) {
    const attributes = { channel, direction }
    d = {
      messages: Metric.counter("gyre_channel_messages_total", { description: "messages through a channel", attributes, incremental: true }),
      bytes: Metric.counter("gyre_channel_bytes_total", { description: "payload bytes through a channel", attributes, incremental: true }),
      errors: Metric.counter("gyre_channel_errors_total", { description: "failed publishes, and messages received that did not decode", attributes, incremental: true }),
      seconds: Metric.histogram("gyre_channel_publish_seconds", { description: "time of a publish until stored or sent", attributes, boundaries: latencyBoundaries })
    }
    channelDefinitions.set(key, d)
  }
  return d
}

/** The metrics of `channel` in `direction`, updated in the registry of `context`. */
export const channelMetrics = (context: Context.Context<never>, channel: string, direction: Direction): ChannelMetrics => {
  const d = definitionsOf(channel, direction)
  return {
    message: (bytes) => {
      d.messages.updateUnsafe(1, context)
      d.bytes.updateUnsafe(bytes, context)
    },
    error: () => d.errors.updateUnsafe(1, context),
    seconds: (s) => d.seconds.updateUnsafe(s, context)
  }
}

/** Messages and bytes through one channel in one direction (cached per pair: an update is a lookup and two adds). */
export const channelCounter = (context: Context.Context<never>) => {
  const cache = new Map<string, (bytes: number) => void>()
  return (channel: string, direction: Direction): ((bytes: number) => void) => {
    const key = `${direction} ${channel}`
    let count = cache.get(key)
    if (count === undefined) {
      count = channelMetrics(context, channel, direction).message
      cache.set(key, count)
    }
    return count
  }
}

const startedS = Math.round(Date.now() / 1000 - process.uptime())

/** The open file descriptors (Linux `/proc/self/fd`; 0 where it is not). */
const openFds = () => {
  try {
    return fs.readdirSync("/proc/self/fd").length
  } catch {
    return 0
  }
}

/**
 * Registers the process metrics (module doc) in `context`'s registry, read when scraped, for the
 * lifetime of the scope: an event-loop delay histogram and a GC observer
 * run while it lasts.
 */
export const processMetrics = Effect.fn("Metrics.process")(function* () {
  const context = yield* Effect.context<never>()
  const lag = monitorEventLoopDelay({ resolution: 10 })
  const gc = { runs: 0, seconds: 0 }
  const observer = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      gc.runs++
      gc.seconds += e.duration / 1000
    }
  })
  const gauge = (name: string, description: string, read: () => number) =>
    Metric.registerUnsafe(Metric.gauge(name, { description }), context, { get: () => ({ value: read() }), update: () => {}, modify: () => {} })
  const counter = (name: string, description: string, read: () => number) =>
    Metric.registerUnsafe(Metric.counter(name, { description, incremental: true }), context, { get: () => ({ count: read(), incremental: true }), update: () => {}, modify: () => {} })
  const seconds = (ns: number) => (Number.isFinite(ns) ? ns / 1e9 : 0)
  yield* Effect.acquireRelease(
    Effect.sync(() => {
      lag.enable()
      observer.observe({ entryTypes: ["gc"] })
      return [
        counter("process_cpu_seconds_total", "user and system CPU time of the process", () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6 }),
        counter("process_cpu_user_seconds_total", "user CPU time of the process", () => process.cpuUsage().user / 1e6),
        counter("process_cpu_system_seconds_total", "system CPU time of the process", () => process.cpuUsage().system / 1e6),
        gauge("process_resident_memory_bytes", "resident set size", () => process.memoryUsage.rss()),
        gauge("process_start_time_seconds", "start of the process, Unix seconds", () => startedS),
        gauge("process_open_fds", "open file descriptors", openFds),
        gauge("nodejs_heap_size_used_bytes", "V8 heap in use", () => process.memoryUsage().heapUsed),
        gauge("nodejs_heap_size_total_bytes", "V8 heap allocated", () => process.memoryUsage().heapTotal),
        gauge("nodejs_external_memory_bytes", "memory of C++ objects bound to JavaScript (buffers)", () => process.memoryUsage().external),
        gauge("nodejs_eventloop_lag_seconds", "mean event-loop delay", () => seconds(lag.mean)),
        gauge("nodejs_eventloop_lag_p99_seconds", "99th percentile event-loop delay", () => seconds(lag.percentile(99))),
        gauge("nodejs_eventloop_lag_max_seconds", "largest event-loop delay", () => seconds(lag.max)),
        counter("nodejs_gc_runs_total", "garbage collections", () => gc.runs),
        counter("nodejs_gc_duration_seconds_total", "time spent in garbage collection", () => gc.seconds),
        gauge("nodejs_active_handles", "active handles and requests keeping the event loop alive", () => process.getActiveResourcesInfo().length)
      ]
    }),
    (registrations) =>
      Effect.sync(() => {
        registrations.forEach((r) => r.remove())
        observer.disconnect()
        lag.disable()
      })
  )
})

export class MetricsServerError extends Schema.TaggedError<MetricsServerError>()("MetricsServerError", {
  port: Schema.Number,
  message: Schema.String
}) {}

/**
 * Serves `GET /metrics` on 127.0.0.1:`port` (0 = any free port) for the lifetime of the scope;
 * returns the URL it listens on.
 */
export const serveMetrics = (port: number): Effect.Effect<string, MetricsServerError, Scope.Scope> =>
  Effect.gen(function* () {
    const context = yield* Effect.context<never>()
    yield* processMetrics()
    const server = yield* Effect.acquireRelease(
      Effect.callback<http.Server, MetricsServerError>((resume) => {
        const s = http.createServer((req, res) => {
          if (req.method !== "GET" || (req.url ?? "").split("?")[0] !== "/metrics") {
            res.writeHead(404, { "content-type": "text/plain" }).end("not found: try GET /metrics\n")
            return
          }
          res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" })
          res.end(PrometheusMetrics.formatUnsafe(context))
        })
        const failed = (e: unknown) => resume(Effect.fail(new MetricsServerError({ port, message: e instanceof Error ? e.message : String(e) })))
        s.once("error", failed)
        try {
          s.listen(port, "127.0.0.1", () => resume(Effect.succeed(s)))
        } catch (e) {
          failed(e)
        }
      }),
      (s) =>
        Effect.callback<void>((resume) => {
          s.close(() => resume(Effect.void))
          s.closeAllConnections()
        })
    )
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/metrics`
  })
