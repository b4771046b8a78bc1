/**
 * Flag values that name things outside the command, checked before it starts anything: a
 * checkpoint directory, a suite and its tasks, a run's store, the port a server listens on. A
 * missing one is a usage error (one line naming the command and the flag, exit 2); what is inside
 * is checked when it is loaded (a malformed file is the command's failure, exit 1).
 */
import * as fs from "node:fs"
import * as net from "node:net"
import * as path from "node:path"
import { Effect } from "effect"
import { CONFIG_FILE, INDEX_FILE, MODEL_FILE } from "../engine/checkpoint.ts"
import { listSuites, loadSuite } from "../harness/suites.ts"
import { UsageError } from "./args.ts"

/** Fails with a UsageError unless `suitesDir` holds the suite `name` (a suite.json there; its contents are checked when loaded). */
export const checkSuite = (command: string, suitesDir: string, name: string) => {
  if (!fs.existsSync(suitesDir)) throw new UsageError(`gyre ${command}: --suites ${suitesDir} is not there`)
  const known = listSuites(suitesDir)
  if (!known.includes(name)) throw new UsageError(`gyre ${command}: --suite ${name}: no ${path.join(suitesDir, name, "suite.json")} (suites there: ${known.join(", ") || "none"})`)
}

/** A `--store` that does not exist is a usage error naming it (`hint`: where else the log may be). */
export const checkStore = (command: string, store: string | undefined, hint: string) => {
  if (store !== undefined && !fs.existsSync(store)) throw new UsageError(`gyre ${command}: no store ${store} (${hint})`)
  return store
}

/** Fails with a UsageError unless `dir` holds a checkpoint. */
export const checkCheckpoint = (command: string, dir: string) => {
  if (!fs.existsSync(path.join(dir, CONFIG_FILE))) throw new UsageError(`gyre ${command}: --checkpoint ${dir} has no ${CONFIG_FILE}`)
  if (!fs.existsSync(path.join(dir, MODEL_FILE)) && !fs.existsSync(path.join(dir, INDEX_FILE))) {
    throw new UsageError(`gyre ${command}: --checkpoint ${dir} has neither ${MODEL_FILE} nor ${INDEX_FILE}`)
  }
}

/**
 * Fails with a UsageError unless `host:port` can be listened on now (a port out of range, in use,
 * or not allowed to this user): checked before the server's actors start, whose supervisor would
 * otherwise retry the bind and give up with the gateway unavailable. Port 0 is any free port.
 */
export const checkPort = async (command: string, host: string, port: number, flag = "--port", hostFlag = "--host"): Promise<void> => {
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new UsageError(`gyre ${command}: ${flag} must be 0 to 65535, got ${port}`)
  const reasons: Record<string, string> = {
    EADDRINUSE: `${flag} ${port} on ${host} is in use`,
    EACCES: `${flag} ${port} is not allowed to this user`,
    EADDRNOTAVAIL: `${hostFlag} ${host} is not an address of this machine`,
    ENOTFOUND: `${hostFlag} ${host} does not resolve`
  }
  const refused = await new Promise<string | undefined>((resolve) => {
    const probe = net.createServer()
    probe.once("error", (e: NodeJS.ErrnoException) => resolve(reasons[e.code ?? ""] ?? `cannot listen on ${host}:${port} (${e.code ?? e.message})`))
    probe.listen(port, host, () => probe.close(() => resolve(undefined)))
  })
  if (refused !== undefined) throw new UsageError(`gyre ${command}: ${refused}`)
}

/**
 * Fails with a UsageError unless every one of `tasks` is a task of the suite (after `checkSuite`);
 * the line counts the missing ones, names the first and says what the suite holds per split. A
 * suite file that does not parse fails the command here, with its error.
 */
export const checkTasks = (command: string, flag: string, suitesDir: string, name: string, tasks: ReadonlyArray<string>) => {
  const loaded = Effect.runSync(Effect.result(loadSuite(suitesDir, name)))
  if (loaded._tag === "Failure") throw new Error(loaded.failure.message)
  const suite = loaded.success
  const missing = tasks.filter((t) => suite.task(t) === undefined)
  if (missing.length === 0) return
  const splits = new Map<string, number>()
  for (const t of suite.tasks) splits.set(t.split, (splits.get(t.split) ?? 0) + 1)
  const held = [...splits].map(([split, n]) => `${n} ${split}`).join(", ")
  const named = `${missing.slice(0, 3).join(", ")}${missing.length > 3 ? ", ..." : ""}`
  throw new UsageError(`gyre ${command}: ${flag}: ${missing.length} of ${tasks.length} not in suite ${name} (${named}); it holds ${held}`)
}

/** NATS's own port, where `--listen HOST` without one listens. */
export const NATS_PORT = 4222

/** Where `--listen` puts the embedded nats-server. */
export interface ListenAddress {
  readonly host: string
  /** 0: any free port. */
  readonly port: number
}

/** Whether `host` is this machine's loopback only (127.0.0.0/8, ::1, localhost): no other machine reaches it. */
export const isLoopback = (host: string) => /^127\./.test(host) || host === "::1" || host === "localhost"

/**
 * `--listen HOST[:PORT]` (`[IPv6]:PORT`, or a bare IPv6 address), checked before anything starts:
 * malformed, a port out of range or in use, or an address that is not this machine's is one usage
 * line. On an address other machines reach, the embedded server must admit only the users of the
 * credentials directory: with `GYRE_NATS_AUTH=off` it would admit anyone, so that is refused too.
 */
export const checkListen = async (command: string, text: string, env: Readonly<Record<string, string | undefined>> = process.env): Promise<ListenAddress> => {
  const m = /^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$/.exec(text) ?? /^([^:[\]\s]+)(?::(\d+))?$/.exec(text) ?? /^([0-9A-Fa-f]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)()$/.exec(text)
  if (m === null) throw new UsageError(`gyre ${command}: --listen must be HOST, HOST:PORT or [IPv6]:PORT, got '${text}'`)
  const listen = { host: m[1]!, port: m[2] === undefined || m[2] === "" ? NATS_PORT : Number(m[2]) }
  if (env.NATS_URL !== undefined && env.NATS_URL !== "") throw new UsageError(`gyre ${command}: --listen is where the embedded nats-server listens; NATS_URL names another server (unset one of them)`)
  if (!isLoopback(listen.host) && env.GYRE_NATS_AUTH === "off") {
    throw new UsageError(`gyre ${command}: --listen ${text} would open a server without users to other machines (GYRE_NATS_AUTH=off); leave auth on`)
  }
  await checkPort(command, listen.host, listen.port, "--listen", "--listen")
  return listen
}
