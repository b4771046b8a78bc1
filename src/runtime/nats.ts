/**
 * The `Nats` service: one connection to a NATS system, with its JetStream client, manager
 * and KV manager, for the lifetime of a scope.
 *
 * Where the connection goes: `NATS_URL` (comma-separated URLs of a server or cluster) and an
 * optional credential (`NATS_CREDS`, a JWT `.creds` file; or `NATS_NKEY`, an nkey seed file
 * that `gyre auth init` writes, its user named by the file) connect to an existing system;
 * `NATS_TLS_CA` trusts a TLS server's CA. With no URL the embedded default starts a private,
 * supervised nats-server (`nats-server.ts`) for the same scope, on loopback or on `listen`;
 * `auth` makes it require the users of a credentials directory (`auth.ts`) and connects as one
 * of them.
 *
 * `replicas` (`GYRE_REPLICAS`, 1 to 5, default 1) is how many servers hold each stream, KV bucket
 * and object store this process creates: 1 on a single server, 3 on a cluster of three or more
 * (JetStream refuses more replicas than it has servers). It is a setting, not a count of the
 * cluster's servers: a process sees only the servers it connects to, and a stream is created
 * once, by whichever process comes first, so every process of a run must agree.
 *
 * `lost` fails with `NatsUnavailable` once the connection has been down for `goneMs` on end
 * (`GYRE_NATS_GONE_MS`, default 30 s): a long-running command races it against its work and
 * exits non-zero with the reason instead of half-serving. Closing the scope drains the
 * connections, or closes them after 2 s when the server is gone.
 *
 * Object stores (weights, gradients, KV hand-offs): building the layer selects nats.js's
 * native SHA-256 (node:crypto) for every object put and get of the process (its default is a
 * pure-JS digest, ~40 MB/s), and `putObject` writes chunks of 767 KiB (the largest whose read-back
 * answer fits the default `max_payload`) instead of 128 KiB, one JetStream round trip each. A 10
 * MiB put: ~60 ms against ~380 ms.
 */
import { createHash } from "node:crypto"
import * as fs from "node:fs"
import * as path from "node:path"
import { connect, credsAuthenticator, type NatsConnection, type Status } from "@nats-io/transport-node"
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager, type MsgRequest } from "@nats-io/jetstream"
import { Kvm } from "@nats-io/kv"
import { setSha256Backend, type ObjectInfo, type ObjectStore } from "@nats-io/obj"
import { Config, Context, Deferred, Duration, Effect, Layer, Option, Schema } from "effect"
import { clientAuth, seedFile, serverConfigOf } from "./auth.ts"
import { startEmbeddedServer, type EmbeddedServer } from "./nats-server.ts"

export class NatsConnectError extends Schema.TaggedError<NatsConnectError>()("NatsConnectError", {
  servers: Schema.String,
  message: Schema.String
}) {}

export class NatsUnavailable extends Schema.TaggedError<NatsUnavailable>()("NatsUnavailable", {
  servers: Schema.String,
  downMs: Schema.Number,
  message: Schema.String
}) {}

export interface NatsOptions {
  /** Comma-separated server URLs; absent = start the embedded default. */
  readonly url?: string | undefined
  /** Credentials (.creds) file for an existing server. */
  readonly credsFile?: string | undefined
  /** Nkey seed file (`<user>.nk` of `gyre auth init`) for an existing server. */
  readonly nkeyFile?: string | undefined
  /** CA certificate file of a TLS server. */
  readonly tlsCaFile?: string | undefined
  /** The embedded server requires the users of credentials directory `dir`; this process connects as `user`. */
  readonly auth?: { readonly dir: string; readonly user: string } | undefined
  /** How long the connection may be down before `lost` fails (default 30 s). */
  readonly goneMs?: number | undefined
  /** Store directory of the embedded server (a temporary directory when absent). */
  readonly storeDir?: string | undefined
  /** Where the embedded server listens (default loopback, a free port; port 0: a free one). */
  readonly listen?: { readonly host: string; readonly port: number } | undefined
  /** Connection name shown by server monitoring. */
  readonly name?: string | undefined
  /** Replicas of every stream, KV bucket and object store created through this connection (1 to 5; absent = `GYRE_REPLICAS`, default 1). */
  readonly replicas?: number | undefined
}

/** An optional setting; empty counts as unset. */
const setting = (name: string) =>
  Config.String(name).pipe(
    Config.option,
    Config.map((o) => Option.getOrUndefined(Option.filter(o, (v) => v !== "")))
  )

const REPLICAS_EXPECTED = "expected an integer from 1 to 5 (the replicas of the run's streams and buckets: 1 on a single server, at most the cluster's servers)"

/** `GYRE_REPLICAS`: replicas of the streams, buckets and object stores a process creates (default 1). */
export const ReplicasSetting = Config.schema(
  Schema.String.pipe(Schema.check(Schema.isPattern(/^\s*[1-5]\s*$/, { message: REPLICAS_EXPECTED }))),
  "GYRE_REPLICAS"
).pipe(
  Config.map((s) => Number(s.trim())),
  Config.withDefault(1)
)

/** Where to connect, as `Config`: NATS_URL, NATS_CREDS, NATS_NKEY, NATS_TLS_CA, GYRE_NATS_STORE, GYRE_NATS_GONE_MS, GYRE_REPLICAS. */
export const NatsSettings = Config.all({
  url: setting("NATS_URL"),
  credsFile: setting("NATS_CREDS"),
  nkeyFile: setting("NATS_NKEY"),
  tlsCaFile: setting("NATS_TLS_CA"),
  storeDir: setting("GYRE_NATS_STORE"),
  goneMs: Config.schema(Schema.Int.pipe(Schema.check(Schema.isGreaterThan(0))), "GYRE_NATS_GONE_MS").pipe(Config.withDefault(30_000)),
  replicas: ReplicasSetting
})

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
  /** Replicas of every stream, KV bucket and object store created through this connection (`GYRE_REPLICAS`). */
  readonly replicas: number
  /** True when this scope started its own nats-server. */
  readonly embedded: boolean
  /** The server's version string, as it reports it (e.g. "2.10.27"). */
  readonly serverVersion: string
  /** The embedded server, when this scope started one. */
  readonly server: EmbeddedServer | undefined
  /** Fails once the connection has been down for `goneMs` on end; never succeeds. */
  readonly lost: Effect.Effect<never, NatsUnavailable>
}

/** How this process authenticates: a creds file, an nkey seed file (its user named by the file), or none. */
const authOf = (options: NatsOptions) => {
  const nkey = options.auth !== undefined ? seedFile(options.auth.dir, options.auth.user) : options.nkeyFile
  if (nkey !== undefined) return clientAuth(nkey, options.auth?.user ?? path.basename(nkey).replace(/\.nk$/, ""))
  return options.credsFile ? { authenticator: credsAuthenticator(fs.readFileSync(options.credsFile)) } : {}
}

/** Why a connection failed, in one line: the server's words, with what to set when its certificate is not trusted. */
const connectFailure = (e: unknown, options: NatsOptions): string => {
  const message = e instanceof Error ? e.message : String(e)
  if (!/certificate/i.test(message)) return message
  const trusted = options.tlsCaFile === undefined ? "NATS_TLS_CA is not set" : `NATS_TLS_CA is ${options.tlsCaFile}`
  return `${message} (the server requires TLS and ${trusted}: set it to the CA certificate that signed the server's)`
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
          // No Error (with its stack) made up front for every request and timer, for a stack
          // Gyre never shows: every failure is wrapped in a tagged error naming its operation.
          noAsyncTraces: true,
          ...(options.tlsCaFile !== undefined ? { tls: { caFile: options.tlsCaFile } } : {}),
          ...authOf(options)
        }),
      catch: (e) => new NatsConnectError({ servers, message: connectFailure(e, options) })
    }),
    (nc) =>
      Effect.promise(() => nc.drain()).pipe(
        Effect.timeout(Duration.seconds(2)),
        Effect.catchCause(() => Effect.promise(() => nc.close().catch(() => undefined)))
      )
  )

/** What a connection status says worth a warning (a lost connection and why), or nothing. */
const statusDetail = (s: Status): string | undefined => {
  switch (s.type) {
    case "disconnect":
    case "reconnect":
      return s.server
    case "error":
      return s.error.message
    case "staleConnection":
      return "the server stopped answering pings"
    case "slowConsumer":
      return `subscription ${s.sub.getSubject()} has ${s.pending} messages pending`
    default:
      return undefined
  }
}

/** `lost` of `NatsShape`: a timer runs while the connection is down and fails it at `goneMs`. */
const watchLoss = (nc: NatsConnection, servers: string, goneMs: number) =>
  Effect.gen(function* () {
    const lost = Deferred.makeUnsafe<never, NatsUnavailable>()
    let timer: ReturnType<typeof setTimeout> | undefined
    const down = (since: number) => {
      timer ??= setTimeout(() => {
        const downMs = Date.now() - since
        Deferred.doneUnsafe(lost, Effect.fail(new NatsUnavailable({ servers, downMs, message: `NATS at ${servers} unreachable for ${downMs} ms (limit GYRE_NATS_GONE_MS=${goneMs})` })))
      }, goneMs)
    }
    const up = () => {
      clearTimeout(timer)
      timer = undefined
    }
    // Said at warning level: core NATS requests and replies in flight across a reconnect are
    // lost, so a stall after one is explained by the log (the asker waits out its timeout).
    const log = Effect.runForkWith(yield* Effect.context<never>())
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === "disconnect") down(Date.now())
        else if (s.type === "reconnect") up()
        const detail = statusDetail(s)
        if (detail !== undefined) log(Effect.logWarning(`NATS ${s.type}: ${detail}`))
      }
    })().catch(() => undefined)
    void nc.closed().then(() => up())
    yield* Effect.addFinalizer(() => Effect.sync(up))
    return Deferred.await(lost)
  })

/**
 * Chunks of an object put: 767 KiB, so that a chunk read back (`getObject`: a STREAM.MSG.GET
 * answer, the chunk in base64 inside JSON, 4/3 of it) is still a message under the default 1 MiB
 * `max_payload`; nats.js cuts it further to a smaller `max_payload`.
 */
const objectChunkBytes = 767 * 1024

/** Puts `data` (or its parts, one after another, streamed without a copy of the whole) as object `name` in chunks of the server's largest message. */
export const putObject = (store: ObjectStore, name: string, data: Uint8Array | ReadonlyArray<Uint8Array>): Promise<ObjectInfo> => {
  const parts = data instanceof Uint8Array ? [data] : data
  let next = 0
  const stream = new ReadableStream<Uint8Array>({
    pull: (controller) => {
      if (next < parts.length) controller.enqueue(parts[next++]!)
      else controller.close()
    }
  })
  return store.put({ name, options: { max_chunk_size: objectChunkBytes } }, stream)
}

/**
 * The first message of `stream` on `subject` at or after sequence `seq`, from the stream's leader
 * (null past the end). `next_by_subj` is the leader's API since nats-server 2.9; nats.js types
 * it for direct gets only.
 */
export const nextBySubject = (jsm: JetStreamManager, stream: string, subject: string, seq: number) =>
  jsm.streams.getMessage(stream, { next_by_subj: subject, seq } as unknown as MsgRequest)

/**
 * Object `name` of `bucket` (null: none, or deleted), read from its stream's leader: one
 * STREAM.MSG.GET (`next_by_subj`) a chunk, each bounded by the connection's request timeout,
 * then the size and SHA-256 digest checked. Not nats.js's `get`: that reads through an ordered
 * push consumer with no deadline, which the server places on one replica of an R3 stream, and a
 * replica that restarted and is still catching up delivers nothing while its heartbeats keep
 * coming, so a read waited for good (a device's switch back to rollout stalled on one in the
 * cluster chaos test). A chunk missing or a digest that differs fails with a message.
 */
export const getObject = async (jsm: JetStreamManager, store: ObjectStore, bucket: string, name: string): Promise<Uint8Array | null> => {
  const info = await store.info(name)
  if (info === null || info.deleted) return null
  const where = `object ${name} of ${bucket}`
  const subject = `$O.${bucket}.C.${info.nuid}`
  const bytes = new Uint8Array(info.size)
  let at = 0
  for (let chunk = 0, seq = 0; chunk < info.chunks; chunk++) {
    const m = await nextBySubject(jsm, `OBJ_${bucket}`, subject, seq + 1)
    if (m === null || at + m.data.length > info.size) throw new Error(`${where}: chunk ${chunk + 1} of ${info.chunks} ${m === null ? "is missing" : "runs past its size"}`)
    bytes.set(m.data, at)
    at += m.data.length
    seq = m.seq
  }
  if (at !== info.size) throw new Error(`${where}: ${at} bytes in its chunks, ${info.size} in its info`)
  const digest = info.digest.startsWith("SHA-256=") ? Buffer.from(info.digest.slice("SHA-256=".length), "base64") : undefined
  if (digest === undefined || !createHash("sha256").update(bytes).digest().equals(digest)) throw new Error(`${where}: its digest differs (${info.digest})`)
  return bytes
}

const make = (options: NatsOptions) =>
  Effect.gen(function* () {
    // Process-wide in nats.js, before any object store operation (the module doc).
    setSha256Backend("native")
    const embedded = options.url === undefined
    // Read when the layer is built unless the options say it (natsOptionsFromEnv does).
    const replicas = options.replicas ?? (yield* ReplicasSetting)
    if (!Number.isInteger(replicas) || replicas < 1 || replicas > 5) {
      return yield* new NatsConnectError({ servers: options.url ?? "embedded", message: `replicas ${replicas}: ${REPLICAS_EXPECTED}` })
    }
    if (embedded && replicas > 1) {
      return yield* new NatsConnectError({
        servers: "embedded",
        message: `GYRE_REPLICAS=${replicas} needs a JetStream cluster of at least ${replicas} servers (NATS_URL); the embedded server is one`
      })
    }
    const server = embedded
      ? yield* startEmbeddedServer({
          ...(options.storeDir !== undefined ? { storeDir: options.storeDir } : {}),
          ...(options.listen !== undefined ? { host: options.listen.host, ...(options.listen.port > 0 ? { port: options.listen.port } : {}) } : {}),
          ...(options.auth !== undefined ? { extraConfig: serverConfigOf(options.auth.dir) } : {})
        })
      : undefined
    const servers = server?.url ?? options.url!
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
      replicas,
      embedded,
      serverVersion: nc.info?.version ?? "unknown",
      server,
      lost: yield* watchLoss(nc, servers, options.goneMs ?? 30_000)
    } satisfies NatsShape
  })

export class Nats extends Context.Service<Nats, NatsShape>()("gyre/runtime/Nats") {
  /** Connects as `options` say (embedded default when no URL). */
  static readonly layer = (options: NatsOptions) => Layer.effect(Nats, make(options))
  /** Connects as `NatsSettings` say, read from the `ConfigProvider` when the layer is built. */
  static readonly layerFromConfig = (name?: string) => Layer.unwrap(Effect.map(NatsSettings, (s) => Nats.layer({ ...s, name })))
}
