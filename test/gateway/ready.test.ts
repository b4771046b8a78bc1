/**
 * `/ready` tells the truth about NATS: a `gyre serve` child answers 200, then its embedded
 * nats-server is killed and `/ready` turns 503 (`nats: false`) while `/health` still answers.
 */
import { readFileSync, readdirSync } from "node:fs"
import { describe, expect, it } from "vitest"
import { startServe } from "../chaos/http-fuzz.ts"
import { tempDir } from "../rollout/fixtures.ts"
import { httpRequest, jsonOf, rawRequest } from "./raw-http.ts"

/** Pids of the processes whose parent is `pid` and whose command is `name`. */
const childrenNamed = (pid: number, name: string) =>
  readdirSync("/proc")
    .filter((d) => /^\d+$/.test(d))
    .filter((d) => {
      try {
        const stat = readFileSync(`/proc/${d}/stat`, "utf8")
        const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"))
        const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1])
        return ppid === pid && comm === name
      } catch {
        return false
      }
    })
    .map(Number)

describe("gyre serve readiness", () => {
  it("is ready with NATS and a worker, and not ready once its nats-server is gone", async () => {
    const served = await startServe(tempDir("gyre-ready-"))
    try {
      const probe = (path: string) => rawRequest(served.port, httpRequest("GET", path, {}), { timeoutMs: 5000 })
      const before = await probe("/ready")
      const nats = childrenNamed(served.pid, "nats-server")
      expect(nats).toHaveLength(1)
      process.kill(nats[0]!, "SIGKILL")
      let after = await probe("/ready")
      for (let i = 0; i < 50 && after.status !== 503; i++) {
        await new Promise((r) => setTimeout(r, 200))
        after = await probe("/ready")
      }
      const health = await probe("/health")
      expect(before.status).toBe(200)
      expect(after.status).toBe(503)
      expect(jsonOf(after)).toMatchObject({ status: "not_ready", nats: false })
      expect(jsonOf(after).reasons[0]).toMatch(/NATS did not answer/)
      expect(health.status).toBe(200)
      expect(jsonOf(health)).toMatchObject({ ready: false, nats: false })
    } finally {
      process.kill(served.pid, "SIGKILL")
      await served.stop()
    }
  }, 120_000)
})
