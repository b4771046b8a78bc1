/**
 * `/ready` tells the truth about NATS: a `gyre serve` child answers 200; its embedded
 * nats-server is stopped (SIGSTOP: alive, so its supervisor does not restart it, and silent)
 * and `/ready` turns 503 (`nats: false`) while `/health` still answers, saying the same; once
 * the server is continued, `/ready` answers 200 again.
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
  it("is ready with NATS and a worker, not ready while its nats-server is silent, ready again after", async () => {
    const served = await startServe(tempDir("gyre-ready-"))
    const nats = childrenNamed(served.pid, "nats-server")
    try {
      const probe = (path: string) => rawRequest(served.port, httpRequest("GET", path, {}), { timeoutMs: 5000 })
      /** `/ready` until it answers `status` (10 s at most). */
      const readyAs = async (status: number) => {
        let r = await probe("/ready")
        for (let i = 0; i < 50 && r.status !== status; i++) {
          await new Promise((done) => setTimeout(done, 200))
          r = await probe("/ready")
        }
        return r
      }
      const before = await probe("/ready")
      expect(nats).toHaveLength(1)
      process.kill(nats[0]!, "SIGSTOP")
      const after = await readyAs(503)
      const health = await probe("/health")
      process.kill(nats[0]!, "SIGCONT")
      const again = await readyAs(200)
      expect(before.status).toBe(200)
      expect(after.status).toBe(503)
      expect(jsonOf(after)).toMatchObject({ status: "not_ready", nats: false })
      expect(jsonOf(after).reasons[0]).toMatch(/NATS did not answer/)
      expect(health.status).toBe(200)
      expect(jsonOf(health)).toMatchObject({ ready: false, nats: false })
      expect(again.status).toBe(200)
    } finally {
      for (const pid of nats) process.kill(pid, "SIGKILL")
      process.kill(served.pid, "SIGKILL")
      await served.stop()
    }
  }, 120_000)
})
