/**
 * Which engine device a rollout worker runs on: the number ending its id modulo the device
 * count (so `gyre serve --devices N` puts worker i on device i mod count), or GYRE_DEVICE.
 */
import { ConfigProvider, Effect } from "effect"
import { describe, expect, it } from "vitest"
import { DeviceSettings } from "../../src/actors/device.ts"
import { RolloutSettings, workerDevice } from "../../src/serving/rollout-role.ts"

/** The settings as read from `env` (the ConfigProvider of the environment, given). */
const read = (env: Record<string, string>) =>
  Effect.runSync(Effect.exit(RolloutSettings.parse(ConfigProvider.fromEnv({ env }))))

describe("rollout worker device", () => {
  it("is the index ending the worker's id, modulo the device count", () => {
    expect(["serve.cuda0", "serve.cuda1", "serve.cuda2", "serve.cuda3", "serve.cuda4"].map((id) => workerDevice(id, 4))).toEqual([0, 1, 2, 3, 0])
    expect(workerDevice("a.cpu1", 1)).toBe(0) // the CPU has one device: every worker shares it
    expect(workerDevice("node-7.cuda12", 8)).toBe(4)
    expect(workerDevice("main", 4)).toBe(0) // no index
  })

  it("comes from GYRE_DEVICE when set (read through Config)", () => {
    const three = read({ GYRE_DEVICE: "3", GYRE_CHECKPOINT: "ckpt" })
    expect(three._tag === "Success" && three.value).toEqual({ checkpoint: "ckpt", device: 3 })
    const unset = read({})
    expect(unset._tag === "Success" && unset.value).toEqual({ checkpoint: "" })
    const bad = read({ GYRE_DEVICE: "gpu1" })
    expect(bad._tag).toBe("Failure")
    expect(String(bad._tag === "Failure" ? bad.cause : "")).toMatch(/GYRE_DEVICE/)
  })

  it("a device's gateway and scheduler are typed references read through Config", () => {
    const ok = Effect.runSync(Effect.exit(DeviceSettings.parse(ConfigProvider.fromEnv({ env: { GYRE_GATEWAY: "gateway/g2", GYRE_DEVICE: "1" } }))))
    expect(ok._tag === "Success" && [ok.value.gateway?.address, ok.value.scheduler, ok.value.device]).toEqual([{ kind: "gateway", id: "g2" }, undefined, 1])
    const wrongKind = Effect.runSync(Effect.exit(DeviceSettings.parse(ConfigProvider.fromEnv({ env: { GYRE_SCHEDULER: "device/x" } }))))
    expect(wrongKind._tag).toBe("Failure")
    expect(String(wrongKind._tag === "Failure" ? wrongKind.cause : "")).toMatch(/GYRE_SCHEDULER/)
  })
})
