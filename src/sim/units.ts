/**
 * The unit a span of simulated time reads best in: seconds under 2 minutes, minutes under 2
 * hours, hours beyond (a scenario from a live run of a few minutes, or one of many hours), and
 * a tick step of 1, 2 or 5 x 10^k of it giving about 10 ticks. Shared by the text report and
 * the SVG timeline of `gyre sim`.
 */
export interface TimeUnit {
  readonly name: "s" | "min" | "h"
  readonly seconds: number
  readonly step: number
}

export const timeUnit = (span: number): TimeUnit => {
  const [name, seconds] = span < 120 ? (["s", 1] as const) : span < 7200 ? (["min", 60] as const) : (["h", 3600] as const)
  const rough = span / seconds / 10
  const power = 10 ** Math.floor(Math.log10(Math.max(rough, 1e-9)))
  const step = [1, 2, 5, 10].map((m) => m * power).find((m) => m >= rough) ?? 10 * power
  return { name, seconds, step }
}

/** `t` seconds in `unit`, to 3 significant digits. */
export const inUnit = (t: number, unit: TimeUnit): number => Number((t / unit.seconds).toPrecision(3))
