/**
 * The NATS service-discovery protocol (ADR-32, what `nats micro ls|ping|info|stats` and
 * `@nats-io/services` speak), answered by every node so standard tooling can list it.
 *
 * A node answers `$SRV.{PING,INFO,STATS}`, `$SRV.<verb>.gyre-node` and
 * `$SRV.<verb>.gyre-node.<id>` with the `io.nats.micro.v1.*_response` documents. Its endpoints
 * are the ask subjects of the actors it hosts, with their request counts and timings.
 * Written here rather than taken from `@nats-io/services` because that package is still a
 * 3.0 pre-release and the protocol is a dozen lines of JSON.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node"
import { Effect } from "effect"

export const SERVICE_NAME = "gyre-node"

export interface EndpointStats {
  readonly name: string
  readonly subject: string
  numRequests: number
  numErrors: number
  lastError: string
  processingTimeNs: number
}

export interface ServiceDescription {
  readonly id: string
  readonly version: string
  readonly description: string
  readonly metadata: Readonly<Record<string, string>>
  readonly started: Date
  /** The endpoints at the time of the request. */
  readonly endpoints: () => ReadonlyArray<EndpointStats>
}

const documents = (d: ServiceDescription) => {
  const base = { name: SERVICE_NAME, id: d.id, version: d.version, metadata: d.metadata }
  return {
    PING: () => ({ type: "io.nats.micro.v1.ping_response", ...base }),
    INFO: () => ({
      type: "io.nats.micro.v1.info_response",
      ...base,
      description: d.description,
      endpoints: d.endpoints().map((e) => ({ name: e.name, subject: e.subject, queue_group: "gyre", metadata: null }))
    }),
    STATS: () => ({
      type: "io.nats.micro.v1.stats_response",
      ...base,
      started: d.started.toISOString(),
      endpoints: d.endpoints().map((e) => ({
        name: e.name,
        subject: e.subject,
        queue_group: "gyre",
        num_requests: e.numRequests,
        num_errors: e.numErrors,
        last_error: e.lastError,
        processing_time: e.processingTimeNs,
        average_processing_time: e.numRequests === 0 ? 0 : Math.round(e.processingTimeNs / e.numRequests)
      }))
    })
  }
}

/** Answers the discovery subjects for the lifetime of the scope. */
export const serveDiscovery = (nc: NatsConnection, description: ServiceDescription) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const docs = documents(description)
      const subs: Array<Subscription> = []
      for (const verb of ["PING", "INFO", "STATS"] as const) {
        for (const subject of [`$SRV.${verb}`, `$SRV.${verb}.${SERVICE_NAME}`, `$SRV.${verb}.${SERVICE_NAME}.${description.id}`]) {
          subs.push(
            nc.subscribe(subject, {
              callback: (err, msg) => {
                if (err === null) msg.respond(JSON.stringify(docs[verb]()))
              }
            })
          )
        }
      }
      return subs
    }),
    (subs) => Effect.sync(() => subs.forEach((s) => s.unsubscribe()))
  )
