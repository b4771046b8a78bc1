/**
 * Children never outlive their parent: a process holding an embedded nats-server and a
 * harness process group is killed with SIGKILL; the watchdog kills the server and the whole
 * group (a grandchild included) within seconds.
 */
import { spawn } from "node:child_process"
import * as path from "node:path"
import * as readline from "node:readline"
import { describe, expect, it } from "vitest"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { alive, goneWithin } from "./helpers.ts"

describe("parent-death watchdog", () => {
  it("kills the embedded server and the harness group of a parent killed with SIGKILL", { timeout: 90_000 }, async () => {
    const parent = spawn(process.execPath, ["--import", "tsx", path.join(repoRoot, "test", "chaos", "fixtures", "parent.ts")], { cwd: repoRoot, stdio: ["ignore", "pipe", "inherit"] })
    const pids = await new Promise<{ nats: number; grandchild: number }>((resolve) =>
      readline.createInterface({ input: parent.stdout! }).on("line", (line) => line.startsWith("{") && resolve(JSON.parse(line)))
    )
    expect(alive(pids.nats)).toBe(true)
    expect(alive(pids.grandchild)).toBe(true)
    parent.kill("SIGKILL")
    const natsGoneMs = await goneWithin(pids.nats, 10_000)
    const grandchildGoneMs = await goneWithin(pids.grandchild, 10_000)
    expect(natsGoneMs).toBeDefined()
    expect(grandchildGoneMs).toBeDefined()
  })
})
