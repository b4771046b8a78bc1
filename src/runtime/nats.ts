/**
 * The `Nats` service: one connection to a NATS system, with its JetStream client, manager
 * and KV manager, for the lifetime of a scope.
 *
 * Where the connection goes: `NATS_URL` (comma-separated URLs of a server or cluster) and an
 * optional `NATS_CREDS` credentials file connect to an existing system; with no URL the
 * embedded default starts a private nats-server (`nats-server.ts`) for the same scope.
 */
import * as fs from "node:fs"
import { connect, credsAuthenticator, type NatsConnection } from "@nats-io/transport-node"
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream"
import { Kvm } from "@nats-io/kv"
import { Config, Context, Effect, Layer, Option, Schema } from "effect"
import { startEmbeddedServer } from "./nats-server.ts"

export class NatsConnectError extends Schema.TaggedError<NatsConnectError>()("NatsConnectError", {
  servers: Schema.String,
  message: Schema.String
}) {}

export interface NatsOptions {
  /** Comma-separated server URLs; absent = start the embedded default. */
  readonly url?: string | undefined
  /** Credentials (.creds) file for an existing server. */
  readonly credsFile?: string | undefined
  /** Store directory of the embedded server (a temporary directory when absent). */
  readonly storeDir?: string | undefined
  /** Connection name shown by server monitoring. */
  readonly name?: string | undefined
}

/** An optional setting; empty counts as unset. */
const setting = (name: string) =>
  Config.String(name).pipe(
    Config.option,
    Config.map((o) => Option.getOrUndefined(Option.filter(o, (v) => v !== "")))
  )

/** Where to connect, as `Config`: NATS_URL, NATS_CREDS, GYRE_NATS_STORE. */
export const NatsSettings = Config.all({ url: setting("NATS_URL"), credsFile: setting("NATS_CREDS"), storeDir: setting("GYRE_NATS_STORE") })

/** `NatsSettings` read now from the environment, for callers outside an Effect. */
export const natsOptionsFromEnv = (name?: string): NatsOptions => ({ ...Effect.runSync(NatsSettings), name })

export interface NatsShape {
  readonly nc: NatsConnection
  readonly js: JetStreamClient
  readonly jsm: JetStreamManager
  readonly kvm: Kvm
  /**
   * A second connection, for journal copies published off the request path: the server
   * stores (and, with sync_interval always, fsyncs) a message in the publishing connection's
   * read loop, so a copy sent on `nc` would hold up the replies queued behind it.
   */
  readonly journalNc: NatsConnection
  /** The URLs connected to (the embedded server's when embedded). */
  readonly servers: string
  /** True when this scope started its own nats-server. */
  readonly embedded: boolean
  /** The server's version string, as it reports it (e.g. "2.10.27"). */
  readonly serverVersion: string
}

/** Connects to `servers` for the lifetime of the scope; the connection is drained on close. */
export const connectTo = (servers: string, options: NatsOptions) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () =>
        connect({
          servers: servers.split(",").map((s) => s.trim()).filter((s) => s !== ""),
          name: options.name,
          maxReconnectAttempts: -1,
          ...(options.credsFile ? { authenticator: credsAuthenticator(fs.readFileSync(options.credsFile)) } : {})
        }),
      catch: (e) => new NatsConnectError({ servers, message: e instanceof Error ? e.message : String(e) })
    }),
    (nc) => Effect.promise(() => nc.drain().catch(() => nc.close()))
  )

const make = (options: NatsOptions) =>
  Effect.gen(function* () {
    const embedded = options.url === undefined
    const servers = embedded
      ? (yield* startEmbeddedServer(options.storeDir !== undefined ? { storeDir: options.storeDir } : {})).url
      : options.url!
    const nc = yield* connectTo(servers, options)
    const journalNc = yield* connectTo(servers, { ...options, name: options.name === undefined ? undefined : `${options.name}-journal` })
    const jsm = yield* Effect.tryPromise({
      try: () => jetstreamManager(nc),
      catch: (e) => new NatsConnectError({ servers, message: `JetStream is not enabled: ${String(e)}` })
    })
    return {
      nc,
      js: jetstream(nc),
      journalNc,
      jsm,
      kvm: new Kvm(nc),
      servers,
      embedded,
      serverVersion: nc.info?.version ?? "unknown"
    } satisfies NatsShape
  })

export class Nats extends Context.Service<Nats, NatsShape>()("gyre/runtime/Nats") {
  /** Connects as `options` say (embedded default when no URL). */
  static readonly layer = (options: NatsOptions) => Layer.effect(Nats, make(options))
  /** Connects as `NatsSettings` say, read from the `ConfigProvider` when the layer is built. */
  static readonly layerFromConfig = (name?: string) => Layer.unwrap(Effect.map(NatsSettings, (s) => Nats.layer({ ...s, name })))
}
