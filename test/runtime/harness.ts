/**
 * Test harness: a fresh embedded nats-server (temporary store, random port) and a run's
 * ActorSystem per test, and helpers to start `gyre node` child processes against it.
 */
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import * as readline from "node:readline"
import { Duration, Effect, Layer, Schema, Scope } from "effect"
import { RegistryEntry } from "../../src/runtime/registry.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"

/**
 * Stops process `pid` with SIGSTOP and waits until the kernel says it is stopped (state `T` in
 * /proc): on a loaded machine the signal can land after the next request was already served.
 */
export const stopProcess = (pid: number) =>
  Effect.gen(function* () {
    process.kill(pid, "SIGSTOP")
    const state = () => fs.readFileSync(`/proc/${pid}/stat`, "utf8").replace(/^.*\) /s, "")[0]
    for (let i = 0; i < 400 && state() !== "T"; i++) yield* Effect.sleep("5 millis")
    if (state() !== "T") return yield* Effect.die(new Error(`process ${pid} did not stop on SIGSTOP`))
  })

export const systemLayer = (run: string) => ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({})))

/** Runs `effect` with a fresh server and the system of `run`; everything stops afterwards. */
export const withSystem = <A, E>(run: string, effect: Effect.Effect<A, E, ActorSystem | Nats | Scope.Scope>): Promise<A> =>
  Effect.runPromise(Effect.scoped(effect).pipe(Effect.provide(systemLayer(run))) as Effect.Effect<A, E>)

export interface NodeProcess {
  readonly child: ChildProcess
  /** JSON lines the node printed on stdout. */
  readonly events: Array<Record<string, unknown>>
  readonly stderr: () => string
  readonly waitFor: (event: string, timeoutMs?: number) => Promise<Record<string, unknown>>
  readonly exited: Promise<number | null>
}

/** Starts `gyre node` as a child process connected to `natsUrl`. */
export const startNodeProcess = (natsUrl: string, args: ReadonlyArray<string>, env: Record<string, string> = {}): NodeProcess => {
  const child = spawn(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "node", ...args], {
    cwd: repoRoot,
    env: { ...process.env, NATS_URL: natsUrl, ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  const events: Array<Record<string, unknown>> = []
  const waiters: Array<() => void> = []
  let err = ""
  child.stderr!.on("data", (d: Buffer) => {
    err += d.toString()
  })
  readline.createInterface({ input: child.stdout! }).on("line", (line) => {
    try {
      events.push(JSON.parse(line) as Record<string, unknown>)
      waiters.splice(0).forEach((w) => w())
    } catch {
      // not an event line
    }
  })
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  const waitFor = (event: string, timeoutMs = 30_000) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const check = () => {
        const found = events.find((e) => e.event === event)
        if (found) {
          clearTimeout(timer)
          resolve(found)
        } else waiters.push(check)
      }
      const timer = setTimeout(() => reject(new Error(`node did not print ${event} within ${timeoutMs} ms; stderr:\n${err}`)), timeoutMs)
      check()
    })
  return { child, events, stderr: () => err, waitFor, exited }
}

/** Polls `check` every `pollMs` until it gives a value (a failure counts as not yet); dies after `timeoutMs`. */
export const eventually = <A>(check: Effect.Effect<A | undefined, any, any>, timeoutMs = 10_000, pollMs = 50) =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    while (true) {
      const v = yield* check.pipe(Effect.catchCause(() => Effect.succeed(undefined)))
      if (v !== undefined) return v
      if (Date.now() > deadline) return yield* Effect.die(new Error("condition not met in time"))
      yield* Effect.sleep(Duration.millis(pollMs))
    }
  })

/** The run's registry entry of `key` (`kind/id`), or undefined. */
export const registryEntry = (key: string) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const e = yield* Effect.promise(() => system.registry.get(key))
    return e === null ? undefined : Schema.decodeUnknownSync(RegistryEntry)(e.json())
  })
