/**
 * `gyre report`: one self-contained HTML page about a run, read from its log (no network, no
 * script: inline SVG charts and tables, the figures also embedded as JSON in
 * `<script type="application/json" id="gyre-report">` for tools).
 *
 * `buildReport` gathers a run's figures (`RunReport`) from its journal (`status.ts`'s `RunLog`
 * and `RunView`), its held-out evaluations and its initial checkpoint's `config.json` (bytes of
 * KV cache per token, to turn handed-off bytes into prefill tokens saved). `renderReport` draws
 * them: the per-device role timeline (a Gantt chart), train and held-out score curves, step
 * durations, the staleness histogram, the dedup ratio per step, KV hand-offs and prefill saved;
 * given several runs (`bench:elastic`'s policies) it adds them side by side.
 */
import { Effect } from "effect"
import { readConfig } from "../engine/checkpoint.ts"
import { kvBytesPerToken } from "../engine/config.ts"
import type { TransportError } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { formatPace } from "../protocols/pace.ts"
import { evaluationScore, readRunLog, trainingErrors, viewOf, type Activity, type HeldOutScore, type Segment, type TrainingError } from "./status.ts"

export interface ReportStep {
  readonly step: number
  readonly meanScore: number
  readonly dedupRatio: number
  readonly tokensTrained: number
  readonly microBatches: number
  readonly devices: number
  /** Policy clock from `StartStep` to `StepDone`, seconds. */
  readonly seconds: number | undefined
  readonly waitMs: number
  readonly computeMs: number
  readonly reduceMs: number
  readonly publishMs: number
}

export interface RunReport {
  readonly run: string
  readonly policy: string
  readonly startedAt: string | undefined
  /** The devices' pace (`--pace`, `decode=..,prefill=..,train=..`), undefined when unpaced. */
  readonly pace: string | undefined
  readonly ended: boolean
  /** Policy clock of the last record: the run's makespan once it ended. */
  readonly makespanS: number
  readonly timeline: ReadonlyArray<{ readonly cell: number; readonly device: string; readonly segments: ReadonlyArray<Segment> }>
  readonly steps: ReadonlyArray<ReportStep>
  /** Executions the steps could not train in full, with the reason. */
  readonly trainingErrors: ReadonlyArray<TrainingError>
  readonly heldOut: { readonly before: HeldOutScore | undefined; readonly after: HeldOutScore | undefined }
  /** Trained tokens by staleness (index = versions behind), summed over steps. */
  readonly staleness: ReadonlyArray<number>
  readonly handoffs: {
    readonly switches: number
    readonly contextsMoved: number
    readonly generationsMoved: number
    readonly bytesMoved: number
    readonly reprefillTokens: number
    /** Tokens the destinations did not prefill again (bytes moved / KV bytes per token), when the checkpoint is readable. */
    readonly prefillSavedTokens: number | undefined
  }
}

const sum = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0)

/** A run's figures, from its journal and evaluations. */
export const buildReport = (system: JournalSource): Effect.Effect<RunReport, TransportError> =>
  Effect.gen(function* () {
    const log = yield* readRunLog(system)
    const view = viewOf(log)
    const spans = new Map(view.stepSpans.map((s) => [s.step, s.to - s.from]))
    const staleness: Array<number> = []
    for (const s of log.steps) s.staleness.forEach((n, i) => (staleness[i] = (staleness[i] ?? 0) + n))
    const results = log.switches.map((s) => s.result)
    const bytesMoved = sum(results.map((r) => r.bytesMoved))
    const run = log.config
    const perToken = run === undefined ? undefined : yield* readConfig(run.checkpoint).pipe(Effect.map((c) => kvBytesPerToken(c.config, run.kvDtype)), Effect.orElseSucceed(() => undefined))
    return {
      run: system.run,
      policy: log.config?.policy ?? "unknown",
      startedAt: log.config === undefined ? undefined : new Date(log.config.startedAt).toISOString(),
      pace: formatPace(log.config?.pace) || undefined,
      ended: log.ended,
      makespanS: view.at,
      timeline: view.timeline(view.at),
      steps: log.steps.map((m) => ({
        step: m.step,
        meanScore: m.meanScore,
        dedupRatio: m.dedupRatio,
        tokensTrained: m.tokensTrained,
        microBatches: m.microBatches,
        devices: m.devices.length,
        seconds: spans.get(m.step),
        waitMs: m.waitMs,
        computeMs: m.computeMs,
        reduceMs: m.reduceMs,
        publishMs: m.publishMs
      })),
      trainingErrors: trainingErrors(log.steps),
      heldOut: {
        before: yield* evaluationScore(system.nats, `${system.run}-heldout-before`),
        after: yield* evaluationScore(system.nats, `${system.run}-heldout-after`)
      },
      staleness,
      handoffs: {
        switches: results.length,
        contextsMoved: sum(results.map((r) => r.contextsMoved)),
        generationsMoved: sum(results.map((r) => r.generationsMoved)),
        bytesMoved,
        reprefillTokens: sum(results.map((r) => r.reprefillTokens)),
        prefillSavedTokens: perToken === undefined || perToken === 0 ? undefined : Math.round(bytesMoved / perToken)
      }
    }
  })

// ---- drawing ------------------------------------------------------------------------------

const escape = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")
const fmt = (x: number, digits = 3) => (Number.isInteger(x) ? String(x) : x.toFixed(digits))

const activityColour: Record<Activity, string> = {
  rollout: "#4e9a6b",
  training: "#3d6fb4",
  switching: "#e0a030",
  idle: "#c8c8c8",
  lost: "#000000"
}

const W = 760
const LEFT = 150

/** The role timeline of one run: a row per device, a segment per activity; `span` is the shared time axis. */
const gantt = (r: RunReport, span: number, id?: string): string => {
  const row = 18
  const plot = W - LEFT - 20
  const x = (t: number) => LEFT + (t / Math.max(span, 1e-9)) * plot
  const height = r.timeline.length * row + 30
  const rows = r.timeline.map((c, i) => {
    const y = i * row
    const rects = c.segments.map(
      (s) =>
        `<rect class="segment" data-device="${escape(c.device)}" data-activity="${s.activity}" data-from="${fmt(s.from)}" data-to="${fmt(s.to)}" x="${x(s.from).toFixed(2)}" y="${y + 2}" width="${Math.max(0.5, x(s.to) - x(s.from)).toFixed(2)}" height="${row - 4}" fill="${activityColour[s.activity]}"><title>${escape(c.device)}: ${s.activity} ${fmt(s.from, 1)}-${fmt(s.to, 1)} s</title></rect>`
    )
    return `<text x="0" y="${y + row - 5}">${escape(c.device)}</text>${rects.join("")}`
  })
  const digits = span < 10 ? 1 : 0
  const ticks = Array.from({ length: 6 }, (_, i) => (span * i) / 5).map((t) => `<text x="${x(t).toFixed(1)}" y="${height - 5}" text-anchor="middle" fill="#555">${t.toFixed(digits)} s</text>`)
  return `<svg${id === undefined ? "" : ` id="${id}"`} class="gantt" data-run="${escape(r.run)}" width="${W}" height="${height}" font-size="11">${rows.join("")}${ticks.join("")}</svg>`
}

interface Series {
  readonly name: string
  readonly colour: string
  readonly points: ReadonlyArray<{ readonly x: number; readonly y: number }>
}

/** A line chart with dots; each dot carries its values as `data-x` / `data-y`. */
const lineChart = (id: string, series: ReadonlyArray<Series>, yMax: number, xLabel: string): string => {
  const h = 200
  const plotW = W - 60
  const xs = series.flatMap((s) => s.points.map((p) => p.x))
  const xMax = Math.max(1, ...xs)
  const px = (v: number) => 40 + (v / xMax) * plotW
  const py = (v: number) => 10 + (1 - v / Math.max(yMax, 1e-9)) * (h - 40)
  const body = series.map((s) => {
    const path = s.points.map((p, i) => `${i === 0 ? "M" : "L"}${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`).join(" ")
    const dots = s.points.map(
      (p) => `<circle class="point" data-series="${escape(s.name)}" data-x="${fmt(p.x)}" data-y="${fmt(p.y, 4)}" cx="${px(p.x).toFixed(1)}" cy="${py(p.y).toFixed(1)}" r="3" fill="${s.colour}"><title>${escape(s.name)} ${xLabel} ${fmt(p.x)}: ${fmt(p.y, 4)}</title></circle>`
    )
    return `<path d="${path}" fill="none" stroke="${s.colour}"/>${dots.join("")}`
  })
  const legend = series.map((s, i) => `<rect x="${50 + i * 300}" y="${h - 12}" width="10" height="10" fill="${s.colour}"/><text x="${64 + i * 300}" y="${h - 3}">${escape(s.name)}</text>`)
  const axis = `<line x1="40" x2="40" y1="10" y2="${h - 30}" stroke="#999"/><text x="0" y="16">${fmt(yMax, 2)}</text><text x="0" y="${h - 30}">0</text><text x="${W - 20}" y="${h - 18}" text-anchor="end" fill="#555">${xLabel}</text>`
  return `<svg id="${id}" width="${W}" height="${h}" font-size="11">${axis}${body.join("")}${legend.join("")}</svg>`
}

/** Bars, one per item (stacked parts when several), each part with `data-key` / `data-value`. */
const barChart = (id: string, items: ReadonlyArray<{ readonly key: string; readonly parts: ReadonlyArray<{ readonly name: string; readonly value: number }> }>, unit: string): string => {
  const h = 200
  const colours = ["#3d6fb4", "#e0a030", "#4e9a6b", "#a05cb4"]
  const max = Math.max(1e-9, ...items.map((it) => sum(it.parts.map((p) => p.value))))
  const bw = Math.max(4, Math.min(40, (W - 60) / Math.max(1, items.length) - 4))
  const bars = items.map((it, i) => {
    let top = h - 30
    const x = 40 + i * (bw + 4)
    const parts = it.parts.map((p, j) => {
      const ph = (p.value / max) * (h - 50)
      top -= ph
      return `<rect class="bar" data-key="${escape(it.key)}" data-part="${escape(p.name)}" data-value="${fmt(p.value, 4)}" x="${x}" y="${top.toFixed(1)}" width="${bw}" height="${ph.toFixed(1)}" fill="${colours[j % colours.length]}"><title>${escape(it.key)} ${escape(p.name)}: ${fmt(p.value, 4)} ${unit}</title></rect>`
    })
    return `${parts.join("")}<text x="${x + bw / 2}" y="${h - 16}" text-anchor="middle">${escape(it.key)}</text>`
  })
  const names = [...new Set(items.flatMap((it) => it.parts.map((p) => p.name)))]
  const legend = names.length < 2 ? "" : names.map((n, i) => `<rect x="${50 + i * 110}" y="${h - 10}" width="10" height="10" fill="${colours[i % colours.length]}"/><text x="${64 + i * 110}" y="${h - 1}">${escape(n)}</text>`).join("")
  return `<svg id="${id}" width="${W}" height="${h}" font-size="11"><text x="0" y="16">${fmt(max, 2)} ${unit}</text>${bars.join("")}${legend}</svg>`
}

const table = (head: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string | number>>, id?: string) =>
  `<table${id ? ` id="${id}"` : ""}><tr>${head.map((h) => `<th>${escape(h)}</th>`).join("")}</tr>${rows.map((r) => `<tr>${r.map((c) => `<td>${escape(String(c))}</td>`).join("")}</tr>`).join("")}</table>`

const scoreChart = (r: RunReport) => {
  const last = r.steps.length
  const heldOut = [
    ...(r.heldOut.before ? [{ x: 0, y: r.heldOut.before.meanScore }] : []),
    ...(r.heldOut.after ? [{ x: last, y: r.heldOut.after.meanScore }] : [])
  ]
  return lineChart(
    "chart-scores",
    [
      { name: "train (mean score of the step's batch)", colour: "#3d6fb4", points: r.steps.map((s) => ({ x: s.step, y: s.meanScore })) },
      { name: "held-out (before / after)", colour: "#d04040", points: heldOut }
    ],
    1,
    "step"
  )
}

const handoffTable = (r: RunReport) =>
  table(
    ["switches", "contexts moved", "generations moved", "KV bytes handed off", "tokens prefilled again", "prefill saved (tokens)"],
    [[r.handoffs.switches, r.handoffs.contextsMoved, r.handoffs.generationsMoved, r.handoffs.bytesMoved, r.handoffs.reprefillTokens, r.handoffs.prefillSavedTokens ?? "n/a"]],
    "handoffs"
  )

const runSection = (r: RunReport, span: number) => `
<h2>Role timeline</h2>
<p class="legend">${(Object.keys(activityColour) as Array<Activity>).map((a) => `<span style="background:${activityColour[a]}"></span>${a}`).join(" ")}</p>
${gantt(r, span, "chart-timeline")}
<h2>Scores</h2>
${scoreChart(r)}
<h2>Step durations</h2>
<p>From the step's start (StartStep) to its end (StepDone), on the policy clock; the table splits the core trainer's time.</p>
${barChart("chart-step-durations", r.steps.map((s) => ({ key: String(s.step), parts: [{ name: "step", value: s.seconds ?? 0 }] })), "s")}
${table(["step", "seconds", "wait ms", "compute ms", "reduce ms", "publish ms", "devices", "micro-batches", "tokens trained", "mean score", "dedup ratio"], r.steps.map((s) => [s.step, s.seconds === undefined ? "n/a" : fmt(s.seconds, 2), fmt(s.waitMs, 1), fmt(s.computeMs, 1), fmt(s.reduceMs, 1), fmt(s.publishMs, 1), s.devices, s.microBatches, s.tokensTrained, fmt(s.meanScore, 4), fmt(s.dedupRatio, 4)]), "steps")}
<h2>Staleness of trained tokens</h2>
${barChart("chart-staleness", r.staleness.map((n, i) => ({ key: `${i} behind`, parts: [{ name: "tokens", value: n }] })), "tokens")}
<h2>Dedup ratio per step</h2>
${barChart("chart-dedup", r.steps.map((s) => ({ key: String(s.step), parts: [{ name: "dedup ratio", value: s.dedupRatio }] })), "")}
<h2>KV hand-offs and prefill saved</h2>
${handoffTable(r)}
<h2>Training errors</h2>
${r.trainingErrors.length === 0 ? "<p>None: every told execution was trained in full.</p>" : table(["step", "execution", "reason"], r.trainingErrors.map((e) => [e.step, e.execution, e.reason]), "training-errors")}`

const comparison = (runs: ReadonlyArray<RunReport>) => {
  const span = Math.max(...runs.map((r) => r.makespanS))
  const rows = runs.map((r) => [r.policy, r.run, r.pace ?? "unpaced", fmt(r.makespanS, 1), r.steps.length, r.handoffs.switches, r.handoffs.reprefillTokens, fmt(r.steps.at(-1)?.meanScore ?? 0, 4), r.heldOut.after ? fmt(r.heldOut.after.meanScore, 4) : "n/a"])
  return `<h2>Policies side by side</h2>
${table(["policy", "run", "devices' pace", "makespan s", "steps", "switches", "re-prefill tokens", "last train score", "held-out after"], rows, "policies")}
${barChart("chart-makespans", runs.map((r) => ({ key: r.policy, parts: [{ name: "makespan", value: r.makespanS }] })), "s")}
${runs.map((r) => `<h3>${escape(r.policy)} (${escape(r.run)})</h3>${gantt(r, span)}`).join("\n")}`
}

/** The page: the first run in full, then (with more than one run) all of them side by side. */
export const renderReport = (runs: ReadonlyArray<RunReport>): string => {
  const main = runs[0]!
  const data = JSON.stringify(runs).replace(/</g, "\\u003c")
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Gyre run ${escape(main.run)}</title>
<style>
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 820px }
table { border-collapse: collapse; margin: 8px 0 } td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; font-size: 12px }
.legend span { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px }
svg { display: block; margin: 8px 0 }
</style></head><body>
<h1>Run ${escape(main.run)}</h1>
<p>policy <b>${escape(main.policy)}</b>, started ${escape(main.startedAt ?? "?")}, ${main.ended ? "ended" : "not ended"}, ${fmt(main.makespanS, 1)} s on the policy clock, ${main.steps.length} steps, ${main.timeline.length} devices${main.pace === undefined ? "" : `, paced ${escape(main.pace)}`}</p>
${runSection(main, main.makespanS)}
${runs.length > 1 ? comparison(runs) : ""}
<script type="application/json" id="gyre-report">${data}</script>
</body></html>
`
}
