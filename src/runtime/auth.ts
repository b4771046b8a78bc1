/**
 * NATS users with least-privilege permissions: the credentials directory that `gyre auth
 * init` writes and the embedded server and the clients read.
 *
 * A user is an nkey (ed25519) with publish/subscribe allow and deny lists. The directory holds
 * `auth.conf` (the server's `authorization` block: public keys and permissions only, no
 * secret), one seed file `<user>.nk` per user (mode 0600: the credential a client presents,
 * `NATS_NKEY`), and `users.json` (each user's roles and public key). Every user gets its own
 * reply-inbox prefix `_I.<user>` and may subscribe only there, so no user reads another's
 * replies; a user may answer a request it received (`allow_responses`, once, within
 * `RESPONSE_EXPIRY_S`) but publish to no other inbox. There is no `no_auth_user`: an anonymous connection is refused. TLS is optional
 * (`tls { cert_file, key_file }` in the same block when a certificate is given).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { nkeys } from "@nats-io/nats-core"
import { nkeyAuthenticator } from "@nats-io/transport-node"
import { Effect, Schema } from "effect"

export class AuthError extends Schema.TaggedError<AuthError>()("AuthError", { dir: Schema.String, message: Schema.String }) {}

export interface Permissions {
  readonly publish: { readonly allow: ReadonlyArray<string>; readonly deny: ReadonlyArray<string> }
  readonly subscribe: { readonly allow: ReadonlyArray<string>; readonly deny: ReadonlyArray<string> }
}

export interface UserSpec {
  /** Letters, digits and dashes. */
  readonly name: string
  readonly roles: ReadonlyArray<string>
  readonly permissions: Permissions
}

export const UserEntry = Schema.Struct({ name: Schema.String, roles: Schema.Array(Schema.String), publicKey: Schema.String })
export const UsersFile = Schema.Struct({ users: Schema.Array(UserEntry), tls: Schema.optional(Schema.Struct({ cert: Schema.String, key: Schema.String })) })
export type UsersFile = typeof UsersFile.Type

export interface TlsFiles {
  readonly cert: string
  readonly key: string
}

/** The reply-inbox prefix of `user` (the only `_I` subjects it may subscribe to). */
export const inboxPrefix = (user: string) => `_I.${user}`

export const AUTH_CONF = "auth.conf"
export const USERS_JSON = "users.json"
export const seedFile = (dir: string, user: string) => path.join(dir, `${user}.nk`)

/**
 * How long after a request its receiver may still answer it (`allow_responses.expires`):
 * nats-server's default is 2 minutes, and a later answer is refused ("Permissions Violation for
 * Publish to _I.<user>...") while its asker still waits. Longer than any ask Gyre makes (`gyre
 * eval`'s RunExecution waits up to 60 min, the gateway's Generate 10 min).
 */
export const RESPONSE_EXPIRY_S = 2 * 60 * 60
const ALLOW_RESPONSES = `allow_responses: { max: 1, expires: "${RESPONSE_EXPIRY_S}s" }`

const list = (subjects: ReadonlyArray<string>) => `[${subjects.map((s) => JSON.stringify(s)).join(", ")}]`

const renderUser = (publicKey: string, u: UserSpec) =>
  [
    `    { nkey: ${publicKey}, permissions: {`,
    `        publish: { allow: ${list(u.permissions.publish.allow)}, deny: ${list(u.permissions.publish.deny)} }`,
    `        subscribe: { allow: ${list([...u.permissions.subscribe.allow, `${inboxPrefix(u.name)}.>`])}, deny: ${list(u.permissions.subscribe.deny)} }`,
    `        ${ALLOW_RESPONSES}`,
    `    } }`
  ].join("\n")

/** The server configuration text: the `authorization` block (and `tls` when given). */
export const renderServerConfig = (users: ReadonlyArray<readonly [string, UserSpec]>, tls?: TlsFiles) =>
  [
    ...(tls !== undefined ? [`tls { cert_file: ${JSON.stringify(tls.cert)}, key_file: ${JSON.stringify(tls.key)} }`] : []),
    `authorization {`,
    `  users: [`,
    users.map(([key, u]) => renderUser(key, u)).join("\n"),
    `  ]`,
    `}`
  ].join("\n")

/** Writes a credentials directory for `users` (fresh keys; an existing directory is replaced). */
export const writeAuthDir = (dir: string, users: ReadonlyArray<UserSpec>, tls?: TlsFiles) =>
  Effect.try({
    try: () => {
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 })
      const keyed = users.map((u) => {
        const kp = nkeys.createUser()
        fs.writeFileSync(seedFile(dir, u.name), new TextDecoder().decode(kp.getSeed()), { mode: 0o600 })
        return [kp.getPublicKey(), u] as const
      })
      fs.writeFileSync(path.join(dir, AUTH_CONF), renderServerConfig(keyed, tls), { mode: 0o600 })
      const file: UsersFile = { users: keyed.map(([publicKey, u]) => ({ name: u.name, roles: [...u.roles], publicKey })), ...(tls ? { tls } : {}) }
      fs.writeFileSync(path.join(dir, USERS_JSON), JSON.stringify(file, null, 2))
      return file
    },
    catch: (e) => new AuthError({ dir, message: `cannot write credentials: ${String(e)}` })
  })

/** Reads `users.json` of a credentials directory. */
export const readAuthDir = (dir: string) =>
  Effect.try({
    try: () => Schema.decodeUnknownSync(Schema.fromJsonString(UsersFile))(fs.readFileSync(path.join(dir, USERS_JSON), "utf8")),
    catch: (e) => new AuthError({ dir, message: `no credentials here (run \`gyre auth init --dir ${dir}\`): ${String(e)}` })
  })

/** The server's configuration text for a credentials directory (its `auth.conf`; nats-server resolves `include` relative to the including file). */
export const serverConfigOf = (dir: string) =>
  // A directory written before the expiry was set says `allow_responses: true` (2 minutes).
  fs.readFileSync(path.resolve(dir, AUTH_CONF), "utf8").replaceAll("allow_responses: true", ALLOW_RESPONSES)

/** The connection options of user `name` whose seed is `file`. */
export const clientAuth = (file: string, user: string) => ({
  authenticator: nkeyAuthenticator(new TextEncoder().encode(fs.readFileSync(file, "utf8").trim())),
  inboxPrefix: inboxPrefix(user)
})

/** The user of a credentials directory with exactly `roles` (any order), if there is one. */
export const userWithRoles = (file: UsersFile, roles: ReadonlyArray<string>) => {
  const want = [...new Set(roles)].sort().join(",")
  return file.users.find((u) => [...u.roles].sort().join(",") === want)
}
