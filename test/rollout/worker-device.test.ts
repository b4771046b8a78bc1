/**
 * Which engine device a rollout worker runs on: the number ending its id modulo the device
 * count (so `gyre serve --devices N` puts worker i on device i mod count), or GYRE_DEVICE.
 */
import { afterEach, describe, expect, it } from "vitest"
import { rolloutConfigFromEnv, workerDevice } from "../../src/serving/rollout-role.ts"

const saved = process.env.GYRE_DEVICE
afterEach(() => {
  if (saved === undefined) delete process.env.GYRE_DEVICE
  else process.env.GYRE_DEVICE = saved
})

describe("rollout worker device", () => {
  it("is the index ending the worker's id, modulo the device count", () => {
    expect(["serve.cuda0", "serve.cuda1", "serve.cuda2", "serve.cuda3", "serve.cuda4"].map((id) => workerDevice(id, 4))).toEqual([0, 1, 2, 3, 0])
    expect(workerDevice("a.cpu1", 1)).toBe(0) // the CPU has one device: every worker shares it
    expect(workerDevice("node-7.cuda12", 8)).toBe(4)
    expect(workerDevice("main", 4)).toBe(0) // no index
  })

  it("comes from GYRE_DEVICE when set", () => {
    process.env.GYRE_DEVICE = "3"
    expect(rolloutConfigFromEnv().device).toBe(3)
    delete process.env.GYRE_DEVICE
    expect(rolloutConfigFromEnv().device).toBeUndefined()
    process.env.GYRE_DEVICE = "gpu1"
    expect(() => rolloutConfigFromEnv()).toThrow(/GYRE_DEVICE must be a non-negative integer/)
  })
})
