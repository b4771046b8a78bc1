/**
 * Test harness: a fresh embedded nats-server (temporary store, random port) and a run's
 * ActorSystem per test, and helpers to start `gyre node` child processes against it.
 */
import { spawn, type ChildProcess } from "node:child_process"
import * as path from "node:path"
import * as readline from "node:readline"
import { Effect, Layer, Scope } from "effect"
import { Nats } from "../../src/runtime/nats.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"

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
