/**
 * `--pace decode=T1,prefill=T2,train=T3` (`gyre train`, `gyre demo`, `gyre node`,
 * `bench:elastic`): every device of the run computes for real, then completes each engine step
 * and micro-batch no earlier than a device of those fixed rates would (`src/serving/pace.ts`).
 * `train` and `demo` write the pace into the run's configuration, so devices of other machines
 * read it from the journal; a `gyre node` flag overrides it for that node's devices (and sets
 * `GYRE_PACE` for devices of `--load`ed modules).
 *
 * At the run's end `devicePaceCounts` asks each device for its counts (`Status`: work items
 * paced and overruns), and `paceSummary` makes the summary's figures of them.
 */
import { Effect } from "effect"
import { formatPace, parsePace, type Pace } from "../protocols/pace.ts"
import { Device } from "../protocols/topology.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { UsageError } from "./args.ts"

const paceDoc =
  "paced devices: decode=STEPS/s,prefill=TOKENS/s,train=TOKENS/s (any subset): each device computes for real, then completes every decode step, prompt chunk and training micro-batch no earlier than a device of these rates (an accelerator's, each owning its compute); empty: unpaced"

export const paceFlag = { pace: { kind: "string", doc: paceDoc, default: "" } } as const

/** `gyre node`'s: the run's configuration unless given. */
export const nodePaceFlag = { pace: { kind: "string", doc: `${paceDoc}; default: the run's configuration` } } as const

/** The flag's Pace (undefined: not paced); a malformed value is a `UsageError` of one line. */
export const checkPaceFlag = (command: string, text: string | undefined): Pace | undefined => {
  const parsed = parsePace(text ?? "")
  if (parsed !== undefined && "error" in parsed) throw new UsageError(`gyre ${command}: --pace ${text}: ${parsed.error}`)
  return parsed
}

export interface DevicePace {
  readonly device: string
  readonly pacedWork: number
  readonly paceOverruns: number
}

/** Each running device's counts (its `Status`), the run's devices on any node, from the registry. */
export const devicePaceCounts = (system: ActorSystemShape) =>
  Effect.gen(function* () {
    const keys = yield* Effect.tryPromise({
      try: async () => {
        const out: Array<string> = []
        for await (const key of await system.registry.keys()) if (key.startsWith(`${Device.kind}/`)) out.push(key)
        return out.sort()
      },
      catch: (e) => new TransportError({ operation: "registry keys", message: messageOf(e) })
    })
    const counts: Array<DevicePace> = []
    for (const key of keys) {
      const status = yield* system.ask(Device.refOfKey(key), "Status", undefined, { timeoutMs: 5000 }).pipe(Effect.option)
      if (status._tag === "Some") counts.push({ device: key, pacedWork: status.value.pacedWork ?? 0, paceOverruns: status.value.paceOverruns ?? 0 })
    }
    return counts
  })

/** Overruns above this share of a device's paced work: its pace is not what it delivered. */
export const OVERRUN_LIMIT = 0.01

/** The summary's pace figures: the rates, overruns and paced work in all and per device, and the devices over the limit. */
export const paceSummary = (pace: Pace | undefined, devices: ReadonlyArray<DevicePace>) => ({
  pace: formatPace(pace) || null,
  paced_work: devices.reduce((a, d) => a + d.pacedWork, 0),
  pace_overruns: devices.reduce((a, d) => a + d.paceOverruns, 0),
  pace_by_device: Object.fromEntries(devices.map((d) => [d.device, { paced: d.pacedWork, overruns: d.paceOverruns }])),
  pace_overrun_devices: devices.filter((d) => d.paceOverruns > OVERRUN_LIMIT * d.pacedWork).map((d) => d.device)
})

/** The summary's line about the pace ("" when unpaced); it says so when a device overran on more than 1% of its work. */
export const paceLine = (s: ReturnType<typeof paceSummary>): string => {
  if (s.pace === null) return ""
  const over = s.pace_overrun_devices
  const head = `paced devices (${s.pace}): ${s.pace_overruns} overruns in ${s.paced_work} paced work items`
  return over.length === 0 ? `${head} (under 1% on every device)` : `${head}; OVER 1% of their work on ${over.join(", ")}: those devices were slower than the pace, so the run's timings are not the paced devices'`
}
