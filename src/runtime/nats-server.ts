/**
 * The embedded nats-server: a supervised child process with JetStream on, listening on
 * loopback (or the interface `host` names, for other machines to reach), its store in a given
 * or temporary directory, stopped when its scope closes.
 *
 * Supervised: when the server dies while its scope is open it is started again on the same
 * store, port and configuration (backoff 200 ms doubling to 2 s), so clients reconnect to the
 * same URL and find every acknowledged message. It never outlives this process (the
 * parent-death watchdog, `child-watchdog.ts`), and a store directory is used by one server at
 * a time: `gyre.lock` in the store names the owning process and its server; a live owner is
 * refused, a dead owner's server (being killed by its watchdog) is waited for.
 *
 * The binary is found by `findNatsServer` ($GYRE_NATS_SERVER, then `.gyre/bin/nats-server`
 * that `scripts/nats-server.sh` fetches, then PATH). The server picks its own port (`-1`) and
 * writes it to a ports file, so two servers never race for a port. `sync_interval: always`
 * (acknowledged means fsynced) is set when the server is 2.10 or newer; 2.9 does not know it.
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Duration, Effect, Ref, Schema, Scope } from "effect"
import { cappedBackoff } from "../common/retry.ts"
import { guard } from "./child-watchdog.ts"

export class NatsServerError extends Schema.TaggedError<NatsServerError>()("NatsServerError", {
  message: Schema.String
}) {}

/** The repository root (two levels above this file). */
export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..")

const isExecutable = (file: string): boolean => {
  try {
    fs.accessSync(file, fs.constants.X_OK)
    return fs.statSync(file).isFile()
  } catch {
    return false
  }
}

/** Locates a nats-server binary, or fails with how to get one. */
export const findNatsServer = (): Effect.Effect<string, NatsServerError> =>
  Effect.suspend(() => {
    const candidates = [
      process.env.GYRE_NATS_SERVER,
      path.join(repoRoot, ".gyre", "bin", "nats-server"),
      ...(process.env.PATH ?? "").split(path.delimiter).filter((d) => d !== "").map((d) => path.join(d, "nats-server"))
    ]
    const found = candidates.find((c): c is string => c !== undefined && c !== "" && isExecutable(c))
    return found !== undefined
      ? Effect.succeed(found)
      : Effect.fail(
          new NatsServerError({
            message: "nats-server not found: run `npm run bootstrap` (or set GYRE_NATS_SERVER, or NATS_URL for an existing server)"
          })
        )
  })

/** Major/minor of a nats-server binary, from `--version` ("nats-server: v2.10.27"). */
export const natsServerVersion = (binary: string): { readonly major: number; readonly minor: number; readonly text: string } => {
  const text = execFileSync(binary, ["--version"], { encoding: "utf8" }).trim()
  const m = /v(\d+)\.(\d+)/.exec(text)
  if (m === null) throw new Error(`cannot read the version of ${binary}: '${text}'`)
  return { major: Number(m[1]), minor: Number(m[2]), text }
}

export interface EmbeddedServerOptions {
  /** Store directory; a fresh temporary directory (removed on close) when absent. */
  readonly storeDir?: string
  /** How long to wait for the server to accept connections. */
  readonly readyTimeoutMs?: number
  /** Port to listen on; a free one the server picks when absent. */
  readonly port?: number
  /** Address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface). */
  readonly host?: string
  /** More configuration text (authorization, tls blocks), appended as is. */
  readonly extraConfig?: string
}

export interface EmbeddedServer {
  /** The URL this process connects to (loopback when the server listens on every interface). */
  readonly url: string
  /** Every URL the server says it listens on (each interface's address when on all of them). */
  readonly urls: ReadonlyArray<string>
  readonly version: string
  readonly storeDir: string
  /** Pid of the server now running (it changes when the supervisor restarts it). */
  readonly pid: number
  /** Times the supervisor restarted the server. */
  readonly restarts: number
}

const waitForPortsFile = (dir: string, child: ChildProcess, timeoutMs: number, log: () => string) =>
  Effect.callback<ReadonlyArray<string>, NatsServerError>((resume) => {
    const started = Date.now()
    const timer = setInterval(() => {
      if (child.exitCode !== null || child.signalCode !== null) {
        clearInterval(timer)
        resume(Effect.fail(new NatsServerError({ message: `nats-server exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${log()}` })))
        return
      }
      const file = fs.readdirSync(dir).find((f) => f.endsWith(`_${child.pid}.ports`))
      if (file !== undefined) {
        try {
          const ports = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8")) as { nats?: ReadonlyArray<string> }
          if (ports.nats !== undefined && ports.nats.length > 0) {
            clearInterval(timer)
            resume(Effect.succeed(ports.nats))
            return
          }
        } catch {
          // partially written; try again on the next tick
        }
      }
      if (Date.now() - started > timeoutMs) {
        clearInterval(timer)
        resume(Effect.fail(new NatsServerError({ message: `nats-server not ready after ${timeoutMs} ms:\n${log()}` })))
      }
    }, 20)
    return Effect.sync(() => clearInterval(timer))
  })

const stopChild = (child: ChildProcess) =>
  Effect.callback<void>((resume) => {
    if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
    const kill = setTimeout(() => child.kill("SIGKILL"), 5000)
    child.once("exit", () => {
      clearTimeout(kill)
      resume(Effect.void)
    })
    child.kill("SIGTERM")
  })


const alive = (pid: number | undefined): boolean => {
  if (pid === undefined || pid <= 0) return false
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}

const isNatsServer = (pid: number | undefined) => {
  try {
    return alive(pid) && fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("nats-server")
  } catch {
    return alive(pid)
  }
}

interface StoreLock {
  readonly owner: number
  readonly server?: number
}

/** Takes `<store>/gyre.lock` for this process (see the module doc); released with the scope. */
const lockStore = (storeDir: string) =>
  Effect.acquireRelease(
    Effect.gen(function* () {
      const file = path.join(storeDir, "gyre.lock")
      const read = (): StoreLock | undefined => {
        try {
          return JSON.parse(fs.readFileSync(file, "utf8")) as StoreLock
        } catch {
          return undefined
        }
      }
      const held = read()
      if (held !== undefined && held.owner !== process.pid && alive(held.owner)) {
        return yield* new NatsServerError({ message: `store ${storeDir} is in use by process ${held.owner} (its lock: ${file})` })
      }
      const deadline = Date.now() + 10_000
      while (held !== undefined && isNatsServer(held.server)) {
        if (Date.now() > deadline) return yield* new NatsServerError({ message: `store ${storeDir}: the nats-server ${held.server} of a dead process still runs` })
        yield* Effect.sleep(Duration.millis(50))
      }
      const write = (lock: StoreLock) => fs.writeFileSync(file, JSON.stringify(lock))
      write({ owner: process.pid })
      return { write, file }
    }),
    (lock) => Effect.sync(() => fs.rmSync(lock.file, { force: true }))
  )

/** One supervised server: where it runs from, its configuration, the child now running and what it printed last. */
interface Supervised {
  readonly options: EmbeddedServerOptions
  readonly binary: string
  readonly tempDir: string
  readonly storeDir: string
  readonly configFile: string
  readonly syncAlways: boolean
  readonly lock: { readonly write: (lock: StoreLock) => void }
  /** Set when the scope closes: an exit then is not restarted. */
  readonly closing: Ref.Ref<boolean>
  /** The last 8 KiB of the server's stdout and stderr. */
  output: string
  child: ChildProcess | undefined
  restarts: number
}

/** Writes the server's configuration file for `port` (-1: the server picks one). */
const writeConfig = (sv: Supervised, port: number) => {
  const host = sv.options.host ?? "127.0.0.1"
  fs.writeFileSync(
    sv.configFile,
    [
      `listen: ${JSON.stringify(host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`)}`,
      `ports_file_dir: ${JSON.stringify(sv.tempDir)}`,
      `jetstream { store_dir: ${JSON.stringify(sv.storeDir)}${sv.syncAlways ? ", sync_interval: always" : ""} }`,
      sv.options.extraConfig ?? ""
    ].join("\n"),
    { mode: 0o600 }
  )
}

/** Spawns the server (guarded by the watchdog, named in the store's lock); stopped when the scope closes. */
const launch = (sv: Supervised) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const c = spawn(sv.binary, ["-c", sv.configFile], { stdio: ["ignore", "pipe", "pipe"] })
      const release = c.pid !== undefined ? guard(c.pid) : () => undefined
      c.once("exit", release)
      const keep = (chunk: Buffer) => {
        sv.output = (sv.output + chunk.toString()).slice(-8192)
      }
      c.stdout?.on("data", keep)
      c.stderr?.on("data", keep)
      if (c.pid !== undefined) sv.lock.write({ owner: process.pid, server: c.pid })
      return c
    }),
    (c) => Ref.set(sv.closing, true).pipe(Effect.andThen(stopChild(c)))
  )

const ready = (sv: Supervised, c: ChildProcess) =>
  waitForPortsFile(sv.tempDir, c, sv.options.readyTimeoutMs ?? 10_000, () => sv.output).pipe(Effect.tapError(() => stopChild(c)))

const exited = (c: ChildProcess) =>
  Effect.callback<string>((resume) => {
    if (c.exitCode !== null || c.signalCode !== null) return resume(Effect.succeed(String(c.exitCode ?? c.signalCode)))
    c.once("exit", (code, signal) => resume(Effect.succeed(String(code ?? signal))))
  })

/** Restarts the server until it is ready again, on the same store and port. */
const restart = (sv: Supervised, url: string) =>
  Effect.gen(function* () {
    const c = yield* launch(sv)
    yield* ready(sv, c)
    sv.child = c
    sv.restarts += 1
    yield* Effect.logInfo(`nats-server restarted on ${url} (store ${sv.storeDir}), pid ${c.pid}`)
  }).pipe(Effect.retry(cappedBackoff("200 millis", "2 seconds")))

const supervise = (sv: Supervised, url: string) =>
  Effect.gen(function* () {
    while (true) {
      const how = yield* exited(sv.child!)
      if (yield* Ref.get(sv.closing)) return
      yield* Effect.logWarning(`nats-server ${sv.child!.pid} exited (${how}); restarting it on the same store:\n${sv.output.slice(-1000)}`)
      yield* restart(sv, url)
    }
  })

/** The server's binary, its temporary directory (removed with the scope), its locked store and its configuration file. */
const prepare = Effect.fnUntraced(function* (options: EmbeddedServerOptions) {
  const binary = yield* findNatsServer()
  const version = yield* Effect.try({
    try: () => natsServerVersion(binary),
    catch: (e) => new NatsServerError({ message: String(e) })
  })
  const tempDir = yield* Effect.acquireRelease(
    Effect.sync(() => fs.mkdtempSync(path.join(os.tmpdir(), "gyre-nats-"))),
    (dir) => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true }))
  )
  const storeDir = path.resolve(options.storeDir ?? path.join(tempDir, "store"))
  fs.mkdirSync(storeDir, { recursive: true })
  const lock = yield* lockStore(storeDir)
  const syncAlways = version.major > 2 || (version.major === 2 && version.minor >= 10)
  if (!syncAlways) {
    yield* Effect.logWarning(`${version.text} is older than 2.10: running without sync_interval: always`)
  }
  const closing = yield* Ref.make(false)
  const sv: Supervised = { options, binary, tempDir, storeDir, configFile: path.join(tempDir, "nats.conf"), syncAlways, lock, closing, output: "", child: undefined, restarts: 0 }
  return { sv, version }
})

/** Starts a supervised nats-server child process for the lifetime of the current scope. */
export const startEmbeddedServer = (
  options: EmbeddedServerOptions = {}
): Effect.Effect<EmbeddedServer, NatsServerError, Scope.Scope> =>
  Effect.gen(function* () {
    const { sv, version } = yield* prepare(options)
    writeConfig(sv, options.port ?? -1)
    const child = yield* launch(sv)
    sv.child = child
    // The server lists loopback first when it listens on every interface.
    const urls = yield* ready(sv, child)
    const url = urls[0]!
    writeConfig(sv, Number(new URL(url).port))
    yield* Effect.forkScoped(supervise(sv, url))
    return {
      url,
      urls,
      version: version.text,
      storeDir: sv.storeDir,
      get pid() {
        return sv.child?.pid ?? -1
      },
      get restarts() {
        return sv.restarts
      }
    }
  })
