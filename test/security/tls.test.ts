/**
 * TLS on a real nats-server: `gyre auth init --tls-cert --tls-key` writes a server
 * configuration that requires TLS (certificates made here with openssl: a CA, and a server
 * certificate for 127.0.0.1 it signs). A `gyre node` child process trusting the CA
 * (`NATS_TLS_CA`) connects with its nkey and answers asks over TLS; a client that does not
 * trust the CA is refused with a certificate error, and a `gyre node` without the CA exits
 * non-zero saying so; the server announces `tls_required` to a plain TCP client.
 */
import { execFileSync, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { connect } from "@nats-io/transport-node"
import { Effect, Exit, Layer, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { clientAuth, readAuthDir, seedFile, serverConfigOf } from "../../src/runtime/auth.ts"
import { address } from "../../src/runtime/names.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { repoRoot, startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { LedgerProtocol } from "../fixtures/actors.ts"
import { startNodeProcess, type NodeProcess } from "../runtime/harness.ts"

const RUN = "tls"
let dir = ""
let url = ""
let ca = ""
let closeServer: () => Promise<void> = async () => undefined
const nodes: Array<NodeProcess> = []

/** A CA and a server certificate for 127.0.0.1 / localhost signed by it, under `dir`. */
const makeCertificates = (dir: string) => {
  const file = (name: string) => path.join(dir, name)
  const openssl = (...args: Array<string>) => execFileSync("openssl", args, { stdio: "pipe" })
  openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gyre-test-ca", "-keyout", file("ca.key"), "-out", file("ca.pem"))
  openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", file("server.key"), "-out", file("server.csr"))
  fs.writeFileSync(file("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
  openssl("x509", "-req", "-in", file("server.csr"), "-CA", file("ca.pem"), "-CAkey", file("ca.key"), "-CAcreateserial", "-days", "2", "-extfile", file("san.ext"), "-out", file("server.pem"))
  return { ca: file("ca.pem"), cert: file("server.pem"), key: file("server.key") }
}

beforeAll(async () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-tls-"))
  const certs = makeCertificates(root)
  ca = certs.ca
  dir = path.join(root, "auth")
  const init = spawnSync(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "auth", "init", "--dir", dir, "--run", RUN, "--tls-cert", certs.cert, "--tls-key", certs.key], { cwd: repoRoot, encoding: "utf8" })
  expect(init.status, init.stderr).toBe(0)
  const scope = Effect.runSync(Scope.make())
  const server = await Effect.runPromise(startEmbeddedServer({ extraConfig: serverConfigOf(dir) }).pipe(Scope.provide(scope)))
  url = server.url
  closeServer = () => Effect.runPromise(Scope.close(scope, Exit.void))
}, 60_000)

afterAll(async () => {
  for (const n of nodes) if (n.child.exitCode === null) n.child.kill("SIGKILL")
  await closeServer()
})

/** The first line of what the server says to a plain TCP connection (its INFO). */
const infoLine = (port: number) =>
  new Promise<string>((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1")
    let text = ""
    socket.on("data", (d) => {
      text += d.toString()
      if (text.includes("\r\n")) {
        socket.destroy()
        resolve(text.slice(0, text.indexOf("\r\n")))
      }
    })
    socket.on("error", reject)
  })

describe("TLS", () => {
  it("gyre auth init records the certificate; the server requires TLS", async () => {
    const file = await Effect.runPromise(readAuthDir(dir))
    expect(file.tls?.cert).toMatch(/server\.pem$/)
    expect(serverConfigOf(dir)).toContain("tls {")
    const info = JSON.parse((await infoLine(Number(new URL(url).port))).replace(/^INFO /, "")) as { tls_required?: boolean }
    expect(info.tls_required).toBe(true)
  })

  it("a gyre node trusting the CA answers asks over TLS", async () => {
    const node = startNodeProcess(url, ["--name", "t1", "--run", RUN, "--load", "test/fixtures/actors.ts", "--spawn", "ledger/l1"], {
      NATS_TLS_CA: ca,
      NATS_NKEY: seedFile(dir, "actor-host")
    })
    nodes.push(node)
    await node.waitFor("ready", 60_000)
    const layer = ActorSystem.layer({ run: RUN }).pipe(Layer.provideMerge(Nats.layer({ url, tlsCaFile: ca, nkeyFile: seedFile(dir, "actor-host") })))
    const items = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const ledger = refOf(LedgerProtocol, address("ledger", "l1"))
          yield* system.ask(ledger, "Append", { item: "over tls" })
          return yield* system.ask(ledger, "Items", undefined)
        })
      ).pipe(Effect.provide(layer))
    )
    expect(items).toEqual(["over tls"])
  }, 90_000)

  it("refuses a client that does not trust the CA, and a gyre node without it exits saying why", async () => {
    const refused = await connect({ servers: url, ...clientAuth(seedFile(dir, "observer"), "observer"), maxReconnectAttempts: 0 }).then(
      async (nc) => {
        await nc.close()
        return "connected"
      },
      (e: Error) => e.message
    )
    expect(refused).toMatch(/certificate/i)
    const node = startNodeProcess(url, ["--name", "t2", "--run", RUN, "--load", "test/fixtures/actors.ts"], { NATS_NKEY: seedFile(dir, "actor-host") })
    nodes.push(node)
    expect(await node.exited).not.toBe(0)
    expect(node.stderr()).toMatch(/certificate.*NATS_TLS_CA is not set/)
  }, 90_000)
})
