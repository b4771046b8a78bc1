/**
 * How another machine joins a run whose embedded nats-server listens beyond loopback
 * (`gyre train --listen` / `gyre node --listen`): the lines those commands print, and the
 * `join` of `gyre node`'s ready line.
 *
 * - The URL: the address `--listen` named, or on every interface (0.0.0.0, ::) the server's
 *   first address that is neither loopback nor link-local (IPv4 first).
 * - The credential: the nkey seed of the credentials directory's user for device nodes (the
 *   roles of the `device` kind: rollout worker + trainer), to copy to `.gyre/join/<user>.nk` on
 *   the other machine (the file's name is the user's, which the client reads from it).
 * - TLS (a credentials directory written with `--tls-cert`): the CA the other machine trusts,
 *   `NATS_TLS_CA`: the server's certificate itself when it is self-signed, else the CA that
 *   signed it (its issuer named), copied to `.gyre/join/ca.pem`.
 * - The command: `NATS_URL=... NATS_NKEY=... [NATS_TLS_CA=...] node bin/gyre.js node --run RUN
 *   --devices 1`, run in that machine's Gyre checkout. The devices fetch the run's initial
 *   checkpoint from the run when it is not on their machine (`shared-checkpoint.ts`).
 */
import { X509Certificate } from "node:crypto"
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect } from "effect"
import { readAuthDir, seedFile, userWithRoles } from "../runtime/auth.ts"
import { rolesOfKinds } from "./auth.ts"
import { isLoopback } from "./checks.ts"

export interface JoinCopy {
  /** The file on this machine. */
  readonly from: string
  /** Where it goes on the other machine, relative to its Gyre checkout. */
  readonly to: string
  readonly what: string
}

export interface Join {
  readonly url: string
  readonly copy: ReadonlyArray<JoinCopy>
  readonly command: string
}

const JOIN_DIR = path.join(".gyre", "join")

const bare = (hostname: string) => hostname.replace(/^\[|\]$/g, "")

/** The server URL another machine dials (see the module doc). */
export const reachableUrl = (urls: ReadonlyArray<string>, host: string): string => {
  if (host !== "0.0.0.0" && host !== "::") return urls[0]!
  const outside = urls.filter((u) => {
    const h = bare(new URL(u).hostname)
    return !isLoopback(h) && !/^fe80:/i.test(h)
  })
  return outside.find((u) => !new URL(u).hostname.startsWith("[")) ?? outside[0] ?? urls[0]!
}

/** The CA file a client trusts for `cert` (see the module doc). */
const tlsCopy = (cert: string): JoinCopy => {
  const c = new X509Certificate(fs.readFileSync(cert))
  const selfSigned = c.checkIssued(c) && c.verify(c.publicKey)
  return selfSigned
    ? { from: cert, to: path.join(JOIN_DIR, "ca.pem"), what: "the server's self-signed TLS certificate" }
    : { from: `the CA certificate that signed ${cert} (${c.issuer.replace(/\n/g, ", ")})`, to: path.join(JOIN_DIR, "ca.pem"), what: "the CA of the server's TLS certificate" }
}

/** How another machine joins run `run` on a server listening at `urls` (`host` as `--listen` named it), credentials in `auth`. */
export const joinOf = (o: { readonly urls: ReadonlyArray<string>; readonly host: string; readonly run: string; readonly auth: { readonly dir: string } | undefined }) =>
  Effect.gen(function* () {
    const url = reachableUrl(o.urls, o.host)
    const copy: Array<JoinCopy> = []
    const env = [`NATS_URL=${url}`]
    if (o.auth !== undefined) {
      const file = yield* readAuthDir(o.auth.dir)
      const user = userWithRoles(file, rolesOfKinds(["device"]))
      if (user !== undefined) {
        copy.push({ from: seedFile(o.auth.dir, user.name), to: path.join(JOIN_DIR, `${user.name}.nk`), what: `user ${user.name}'s nkey seed: keep it private` })
        env.push(`NATS_NKEY=${path.join(JOIN_DIR, `${user.name}.nk`)}`)
      }
      if (file.tls !== undefined) {
        copy.push(tlsCopy(file.tls.cert))
        env.push(`NATS_TLS_CA=${path.join(JOIN_DIR, "ca.pem")}`)
      }
    }
    return { url, copy, command: `${env.join(" ")} node bin/gyre.js node --run ${o.run} --devices 1` } satisfies Join
  })

/** The lines `gyre train` and `gyre node` print. */
export const joinLines = (j: Join): Array<string> => [
  "join this run from another machine, in its Gyre checkout (npm run bootstrap there first):",
  ...j.copy.map((c) => `  copy ${c.from} there as ${c.to} (${c.what})`),
  `  ${j.command}`
]
