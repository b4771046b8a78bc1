/**
 * `gyre auth init [--dir D] [--run R] [--tls-cert C --tls-key K]`: writes a credentials
 * directory (`src/runtime/auth.ts`) with one NATS user per role and the unions Gyre's commands
 * connect as (`src/protocols/roles.ts`): `auth.conf` to include in a nats-server configuration,
 * `<user>.nk` seed files (give each machine only the ones it needs: `NATS_NKEY=<file>`).
 *
 * `embeddedNats` is how `gyre serve` and `gyre node` connect when NATS_URL is unset: a
 * supervised embedded server whose store is kept across restarts (`--store`, else
 * `.gyre/nats/<run>.<node>` under the working directory) and which admits only the users of
 * `GYRE_AUTH_DIR` (default `.gyre/auth`, written on first use), this process connecting as
 * the user with exactly the roles it hosts. `GYRE_NATS_AUTH=off` starts it without users. It
 * listens on loopback, or where `--listen` says (`join.ts` prints how another machine joins).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect } from "effect"
import { defaultUsers, rolesOfKind, type NatsRole } from "../protocols/roles.ts"
import { readAuthDir, userWithRoles, writeAuthDir, type TlsFiles } from "../runtime/auth.ts"
import { natsOptionsFromEnv, type NatsOptions } from "../runtime/nats.ts"
import { UsageError, parseFlags, type Command } from "./args.ts"
import type { ListenAddress } from "./checks.ts"

const flags = {
  dir: { kind: "string", doc: "directory of the credentials", default: path.join(".gyre", "auth") },
  run: { kind: "string", doc: "run id the permissions are scoped to (* = every run)", default: "*" },
  "tls-cert": { kind: "string", doc: "server certificate (PEM): the server then requires TLS" },
  "tls-key": { kind: "string", doc: "server private key (PEM)" },
  force: { kind: "boolean", doc: "replace existing credentials", default: false }
} as const

const exists = (dir: string) => fs.existsSync(path.join(dir, "users.json"))

/**
 * Writes fresh credentials into `dir` atomically (a temporary sibling renamed into place);
 * `replace` removes what `dir` holds first, else credentials another process wrote meanwhile win.
 */
const initDir = (dir: string, run: string, replace: boolean, tls?: TlsFiles) =>
  Effect.gen(function* () {
    const parent = path.dirname(path.resolve(dir))
    fs.mkdirSync(parent, { recursive: true })
    const temp = fs.mkdtempSync(path.join(parent, ".auth-"))
    const file = yield* writeAuthDir(temp, defaultUsers(run), tls)
    if (replace) fs.rmSync(dir, { recursive: true, force: true })
    try {
      fs.renameSync(temp, dir)
      return file
    } catch {
      fs.rmSync(temp, { recursive: true, force: true }) // another process wrote it first: use that one
    }
    return yield* readAuthDir(dir)
  })

/** The roles hosting `kinds` need (their union). */
export const rolesOfKinds = (kinds: ReadonlyArray<string>): ReadonlyArray<NatsRole> => {
  const roles = [...new Set(kinds.filter((k) => k !== "node").flatMap(rolesOfKind))]
  return roles.length > 0 ? roles : ["actor-host"]
}

/** Connection options of a command hosting `kinds` (see the module doc). */
export const embeddedNats = (o: {
  readonly name: string
  readonly run: string
  readonly node: string
  readonly kinds: ReadonlyArray<string>
  readonly store?: string | undefined
  /** Where the embedded server listens (`--listen`, checked by `checkListen`); loopback when absent. */
  readonly listen?: ListenAddress | undefined
}) =>
  Effect.gen(function* () {
    const env = natsOptionsFromEnv(o.name)
    if (env.url !== undefined) return env
    const storeDir = o.store ?? env.storeDir ?? path.join(process.cwd(), ".gyre", "nats", `${o.run}.${o.node}`)
    const listen = o.listen === undefined ? {} : { listen: o.listen }
    if (process.env.GYRE_NATS_AUTH === "off") return { ...env, storeDir, ...listen } satisfies NatsOptions
    const dir = path.resolve(process.env.GYRE_AUTH_DIR ?? path.join(".gyre", "auth"))
    const file = exists(dir) ? yield* readAuthDir(dir) : yield* initDir(dir, "*", false)
    const roles = rolesOfKinds(o.kinds)
    const user = userWithRoles(file, roles)
    if (user === undefined) {
      return yield* Effect.fail(new UsageError(`no user with roles ${roles.join("+")} in ${dir} (users: ${file.users.map((u) => u.name).join(", ")})`))
    }
    return { ...env, storeDir, ...listen, auth: { dir, user: user.name } } satisfies NatsOptions
  })

export const command: Command<typeof flags> = {
  summary: "write NATS users with per-role permissions and their credentials (auth init)",
  flags,
  run: async (argv) => {
    const [verb, ...rest] = argv
    if (verb !== "init") throw new UsageError(`gyre auth: unknown action '${verb ?? ""}' (known: init)`)
    const f = parseFlags("auth", flags, rest)
    if ((f["tls-cert"] === undefined) !== (f["tls-key"] === undefined)) throw new UsageError("gyre auth init: --tls-cert and --tls-key go together")
    if (f.run !== "*" && !/^[A-Za-z0-9-]+$/.test(f.run)) throw new UsageError(`gyre auth init: --run must be * or a run id, got '${f.run}'`)
    if (exists(f.dir) && !f.force) throw new UsageError(`gyre auth init: ${f.dir} already holds credentials (--force replaces them)`)
    const tls = f["tls-cert"] !== undefined ? { cert: path.resolve(f["tls-cert"]), key: path.resolve(f["tls-key"]!) } : undefined
    const file = await Effect.runPromise(initDir(f.dir, f.run, true, tls))
    for (const u of file.users) console.log(`${u.name.padEnd(16)} ${u.roles.join("+").padEnd(60)} ${path.join(f.dir, `${u.name}.nk`)}`)
    console.log(`server configuration: ${path.resolve(f.dir, "auth.conf")} (paste it into, or include it next to, the nats-server configuration)`)
    return 0
  }
}
