/**
 * What a benchmark reports of the machine it ran on: the CPU model and its largest cache.
 */
import { execFileSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { cpus } from "node:os"

const units = { "": 1, K: 2 ** 10, M: 2 ** 20, G: 2 ** 30 } as const

/** The CPU model name (`lscpu`'s "Model name"), or "unknown". */
export const cpuModel = (): string => cpus()[0]?.model.trim() || "unknown"

/**
 * The largest CPU cache in bytes: Linux sysfs ("307200K"), else `getconf` (glibc's reading of
 * cpuid), or undefined where neither says.
 */
export const lastLevelCacheBytes = (): number | undefined => {
  const dir = "/sys/devices/system/cpu/cpu0/cache"
  try {
    const sizes = readdirSync(dir)
      .filter((d) => d.startsWith("index"))
      .map((d) => /^(\d+)([KMG]?)/.exec(readFileSync(`${dir}/${d}/size`, "utf8").trim()))
      .map((m) => (m === null ? 0 : Number(m[1]) * units[m[2] as keyof typeof units]))
    if (sizes.length > 0) return Math.max(...sizes)
  } catch {
    /* no sysfs cache directory (some VMs): ask getconf */
  }
  try {
    const sizes = ["LEVEL3_CACHE_SIZE", "LEVEL2_CACHE_SIZE"].map((key) => Number(execFileSync("getconf", [key], { encoding: "utf8" }).trim()) || 0)
    return Math.max(...sizes) || undefined
  } catch {
    return undefined
  }
}
