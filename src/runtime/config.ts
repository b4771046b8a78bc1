/**
 * The runtime's settings as effect `Config`s: read from the `ConfigProvider` in context
 * (environment variables by default; `gyre node` puts its flags in front) when a node or a
 * layer is built, never at import time.
 *
 * | variable | setting | default |
 * | --- | --- | --- |
 * | `GYRE_HEARTBEAT_MS` | registry heartbeat interval | 1000 |
 * | `GYRE_DEAD_AFTER_MS` | silence after which an entry is declared dead | 5000 |
 * | `GYRE_ACK_WAIT_MS` | JetStream ack wait of actor consumers | 10000 |
 * | `GYRE_METRICS_PORT` | Prometheus `/metrics` on 127.0.0.1 (0 = any free port) | off |
 * | `GYRE_LOG_FORMAT` | `json` (one object a line) or `pretty`, on stderr | `pretty` |
 * | `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_{TRACES,METRICS,LOGS}_EXPORTER=otlp` | OTLP/HTTP export (observability.ts) | off |
 * | `NATS_URL`, `NATS_CREDS`, `GYRE_NATS_STORE` | see `nats.ts` | embedded server |
 * | `GYRE_REPLICAS` | replicas (1 to 5) of every stream, KV bucket and object store a process creates; more than 1 needs a cluster of that many servers (`nats.ts`) | 1 |
 */
import { Config, Option, Schema } from "effect"

const positive = (name: string, fallback: number) =>
  Config.schema(Schema.Int.pipe(Schema.check(Schema.isGreaterThan(0))), name).pipe(Config.withDefault(fallback))

const optional = <A>(config: Config.Config<A>) => config.pipe(Config.option, Config.map(Option.getOrUndefined))

export const RuntimeSettings = Config.all({
  heartbeatMs: positive("GYRE_HEARTBEAT_MS", 1000),
  deadAfterMs: positive("GYRE_DEAD_AFTER_MS", 5000),
  ackWaitMs: positive("GYRE_ACK_WAIT_MS", 10_000),
  metricsPort: optional(Config.schema(Schema.Int.pipe(Schema.check(Schema.isBetween({ minimum: 0, maximum: 65535 }))), "GYRE_METRICS_PORT"))
})
export type RuntimeSettings = Config.Success<typeof RuntimeSettings>

export const LogFormat = Config.Literals(["json", "pretty"], "GYRE_LOG_FORMAT").pipe(Config.withDefault("pretty" as const))
export type LogFormat = Config.Success<typeof LogFormat>
