/**
 * The embedded nats-server: a child process with JetStream on, listening on loopback at a
 * random free port, its store in a given or temporary directory, stopped when its scope closes.
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
import { Effect, Schema, Scope } from "effect"

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
  /** Port to listen on; a free one the server picks when absent (a restart on the same store and port is a server restart). */
  readonly port?: number
}

export interface EmbeddedServer {
  readonly url: string
  readonly version: string
  readonly storeDir: string
  readonly pid: number
}

const waitForPortsFile = (dir: string, child: ChildProcess, timeoutMs: number, log: () => string) =>
  Effect.callback<string, NatsServerError>((resume) => {
    const started = Date.now()
    const timer = setInterval(() => {
      if (child.exitCode !== null || child.signalCode !== null) {
        clearInterval(timer)
        resume(Effect.fail(new NatsServerError({ message: `nats-server exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${log()}` })))
        return
      }
      const file = fs.readdirSync(dir).find((f) => f.endsWith(".ports"))
      if (file !== undefined) {
        try {
          const ports = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8")) as { nats?: ReadonlyArray<string> }
          const url = ports.nats?.[0]
          if (url !== undefined) {
            clearInterval(timer)
            resume(Effect.succeed(url))
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

/** Starts a nats-server child process for the lifetime of the current scope. */
export const startEmbeddedServer = (
  options: EmbeddedServerOptions = {}
): Effect.Effect<EmbeddedServer, NatsServerError, Scope.Scope> =>
  Effect.gen(function* () {
    const binary = yield* findNatsServer()
    const version = yield* Effect.try({
      try: () => natsServerVersion(binary),
      catch: (e) => new NatsServerError({ message: String(e) })
    })
    const tempDir = yield* Effect.acquireRelease(
      Effect.sync(() => fs.mkdtempSync(path.join(os.tmpdir(), "gyre-nats-"))),
      (dir) => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true }))
    )
    const storeDir = options.storeDir ?? path.join(tempDir, "store")
    fs.mkdirSync(storeDir, { recursive: true })
    const syncAlways = version.major > 2 || (version.major === 2 && version.minor >= 10)
    if (!syncAlways) {
      yield* Effect.logWarning(`${version.text} is older than 2.10: running without sync_interval: always`)
    }
    const config = [
      `listen: 127.0.0.1:${options.port ?? -1}`,
      `ports_file_dir: ${JSON.stringify(tempDir)}`,
      `jetstream { store_dir: ${JSON.stringify(storeDir)}${syncAlways ? ", sync_interval: always" : ""} }`
    ].join("\n")
    const configFile = path.join(tempDir, "nats.conf")
    fs.writeFileSync(configFile, config)
    let output = ""
    const child = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const c = spawn(binary, ["-c", configFile], { stdio: ["ignore", "pipe", "pipe"] })
        const keep = (chunk: Buffer) => {
          output = (output + chunk.toString()).slice(-8192)
        }
        c.stdout?.on("data", keep)
        c.stderr?.on("data", keep)
        return c
      }),
      stopChild
    )
    const url = yield* waitForPortsFile(tempDir, child, options.readyTimeoutMs ?? 10_000, () => output)
    return { url, version: version.text, storeDir, pid: child.pid ?? -1 }
  })
