/**
 * `gyre sim --svg FILE`: each cell's role over time, one row per cell (the core on top), one
 * chart per policy, with a tick where each step's training ended; time in the unit the longest
 * run reads best in (units.ts).
 */
import { CellState, type RunResult } from "./simulate.ts"
import { inUnit, timeUnit } from "./units.ts"

const colour: Record<number, string> = {
  [CellState.rollout]: "#4e9a6b",
  [CellState.training]: "#3d6fb4",
  [CellState.toTraining]: "#e0a030",
  [CellState.toRollout]: "#e0a030"
}

const escape = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;")

/** One SVG document with a chart per run; every chart shares the time axis of the longest run. */
export const timelineSvg = (title: string, runs: ReadonlyArray<RunResult>): string => {
  const width = 1000
  const left = 150
  const plot = width - left - 20
  const cells = runs[0]?.timeline?.cells.length ?? 0
  const row = Math.max(1, Math.min(14, Math.floor(360 / Math.max(1, cells))))
  const chart = cells * row + 40
  const span = Math.max(...runs.map((r) => r.makespan_s), 1)
  const x = (t: number) => left + (t / span) * plot
  const unit = timeUnit(span)
  const out: Array<string> = []
  const height = 60 + runs.length * chart + 30
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="10" y="20" font-size="14">${escape(title)}</text>`,
    `<g transform="translate(10,32)">`,
    `<rect width="12" height="10" fill="${colour[CellState.rollout]}"/><text x="16" y="10">rollout</text>`,
    `<rect x="80" width="12" height="10" fill="${colour[CellState.training]}"/><text x="96" y="10">training</text>`,
    `<rect x="165" width="12" height="10" fill="${colour[CellState.toTraining]}"/><text x="181" y="10">switching</text>`,
    `<text x="260" y="10">| step trained</text></g>`
  )
  runs.forEach((run, i) => {
    const top = 60 + i * chart
    out.push(`<text x="10" y="${top + 12}">${escape(run.policy)}</text><text x="10" y="${top + 26}" fill="#555">${inUnit(run.makespan_s, unit)} ${unit.name}</text>`)
    const timeline = run.timeline
    if (!timeline) return
    timeline.cells.forEach((segments, c) => {
      const y = top + c * row
      for (let j = 0; j < segments.length; j += 2) {
        const from = segments[j]!
        const to = j + 2 < segments.length ? segments[j + 2]! : run.makespan_s
        const fill = colour[segments[j + 1]!]
        if (fill === undefined || to <= from) continue
        out.push(`<rect x="${x(from).toFixed(2)}" y="${y}" width="${Math.max(0.3, x(to) - x(from)).toFixed(2)}" height="${row}" fill="${fill}"/>`)
      }
    })
    const bottom = top + cells * row
    for (const t of timeline.stepsDoneAt) out.push(`<line x1="${x(t).toFixed(2)}" x2="${x(t).toFixed(2)}" y1="${bottom}" y2="${bottom + 6}" stroke="black"/>`)
  })
  const axis = 60 + runs.length * chart
  for (let i = 0; i * unit.step * unit.seconds <= span; i++) {
    const t = i * unit.step * unit.seconds
    out.push(`<text x="${x(t).toFixed(1)}" y="${axis}" text-anchor="middle" fill="#555">${inUnit(t, unit)} ${unit.name}</text>`)
  }
  out.push("</svg>")
  return out.join("\n")
}
