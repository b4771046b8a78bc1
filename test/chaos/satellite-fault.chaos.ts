/**
 * A run-level fault aimed at a role, run by `npm run test:chaos` only (vitest.config.ts includes
 * `*.chaos.ts` files when GYRE_CHAOS_FAULTS is set): kill -9 of the second node at the first
 * moment the live journal shows its device training as a satellite of the running step; the
 * step finishes on the core. Whether the second cell joins a step at all depends on the run's
 * timing (in 1 of 3 loaded CI runs it never did), so it is not part of the plain suite.
 */
import { Effect } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { OTHER_DEVICE, expectCellLost, faultedRun, initCheckpoint, killChildren, killWhen, roleAt } from "./train-run.ts"

beforeAll(initCheckpoint)
afterEach(killChildren)

describe("run-level faults during gyre train (chaos only)", () => {
  it("kill -9 of the second node while its device trains as a satellite of the step: the step and the run finish, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun(
      "train: second node kill -9 as a training satellite",
      "chaos-satellite",
      3,
      {},
      (server, { other }) => killWhen("satellite", "chaos-satellite", server.url, { other: other! }).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at)))),
      { afterStep0: false, steps: 5 }
    )
    expect(roleAt(j, OTHER_DEVICE, killedAt)).toBe("training satellite")
    expectCellLost(j, killedAt)
  })
})
