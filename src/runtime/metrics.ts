/**
 * The runtime's metrics (effect `Metric`s) and their Prometheus endpoint.
 *
 * Per actor (attributes `actor` = `kind/id`, `node`):
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
 * `serveMetrics` answers `GET /metrics` on 127.0.0.1 with every metric of the process's
 * registry in the Prometheus text format (plain `node:http`).
 */
import * as http from "node:http"
import type { AddressInfo } from "node:net"
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
  const attributes = { actor, node }
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
