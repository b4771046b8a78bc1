/**
 * How a process reports: one logger, and OTLP export when a collector is configured, both
 * chosen once from `Config` when the layer is built.
 *
 * - `GYRE_LOG_FORMAT=json`: every log line is one JSON object (effect's `Logger.formatJson`);
 *   `pretty` (the default): effect's pretty console logger. Both write to stderr, so stdout
 *   stays for a command's own output (such as `gyre node`'s ready line).
 * - OTLP: spans, metrics and logs go to an OTLP/HTTP collector as JSON (`/v1/traces`,
 *   `/v1/metrics`, `/v1/logs`) when the OpenTelemetry variables ask for it, through effect's
 *   `Otlp` over its fetch `HttpClient`: plain Node 20, no platform package. Logs go there
 *   besides the console.
 */
import { Effect, Layer, Logger } from "effect"
import * as FetchHttpClient from "effect/http/FetchHttpClient"
import * as Otlp from "effect/observability/Otlp"
import * as OtlpSerialization from "effect/observability/OtlpSerialization"
import { LogFormat } from "./config.ts"

/** The console logger `GYRE_LOG_FORMAT` names, on stderr. */
export const loggerLayer = Layer.unwrap(
  Effect.map(LogFormat, (format) =>
    Layer.merge(
      Logger.layer([format === "json" ? Logger.withConsoleError(Logger.formatJson) : Logger.consolePretty()]),
      Layer.succeed(Logger.LogToStderr, true)
    )
  )
)

/**
 * OTLP export as the standard OpenTelemetry variables say (`OTEL_EXPORTER_OTLP_ENDPOINT`, and
 * per signal `OTEL_TRACES_EXPORTER=otlp`, `OTEL_METRICS_EXPORTER=otlp`, `OTEL_LOGS_EXPORTER=otlp`;
 * effect exports a signal only when its exporter variable names `otlp`); a no-op otherwise.
 */
export const otlpLayer = (serviceName: string) =>
  Otlp.layerFromConfig({ resource: { serviceName }, loggerMergeWithExisting: true }).pipe(
    Layer.provide(OtlpSerialization.layerJson),
    Layer.provide(FetchHttpClient.layer)
  )

/** The logger, and OTLP export when configured, for a process named `serviceName`. */
export const observabilityLayer = (serviceName: string) => otlpLayer(serviceName).pipe(Layer.provideMerge(loggerLayer))
