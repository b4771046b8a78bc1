/**
 * `gyre status RUN`: one run now, from its log and the server (`--store DIR`, NATS_URL, or the
 * run's own embedded store): devices with their activity and weights version, executions
 * dispatched / running / finished, steps done and the running step's micro-batches pending /
 * claimed / done, the actors' tell queues, the last train and held-out scores, the training
 * errors (executions a step could not train in full: the count and the last few). `--json`: one
 * JSON object (`RunStatus`, src/replay/status.ts). `--watch`: refreshes every `--interval`
 * seconds (in place on a terminal) until the run ends or Ctrl-C.
 */
import { Duration, Effect } from "effect"
import { runStatus, type RunStatus } from "../replay/status.ts"
import { parseRunFlags, type Command } from "./args.ts"
import { withRun } from "./runs.ts"

const flags = {
  run: { kind: "string", doc: "the run (or give it as the first word: gyre status RUN)" },
  store: { kind: "string", doc: "a stopped embedded store directory (default: NATS_URL, else .gyre/runs/RUN)" },
  json: { kind: "boolean", doc: "one JSON object (with --watch: one per refresh)", default: false },
  watch: { kind: "boolean", doc: "refresh until the run ends or Ctrl-C", default: false },
  interval: { kind: "number", doc: "seconds between refreshes with --watch", default: 2 }
} as const

const score = (x: number | undefined) => (x === undefined ? "-" : x.toFixed(3))

/** The status as a screen of text. */
export const statusLines = (s: RunStatus): Array<string> => {
  const mb = s.steps.microBatches
  return [
    `run ${s.run}  policy ${s.policy ?? "-"}  ${s.state}  started ${s.startedAt ?? "-"}  ${s.elapsedS.toFixed(1)} s  ${s.records} records`,
    `executions  dispatched ${s.executions.dispatched}/${s.executions.planned}  running ${s.executions.running}  finished ${s.executions.finished}`,
    `steps       done ${s.steps.done}/${s.steps.planned}  ${s.steps.running === undefined ? "none running" : `step ${s.steps.running} training`}${mb === undefined ? "" : `  micro-batches pending ${mb.pending} claimed ${mb.claimed} done ${mb.done}`}`,
    `weights     version ${s.weightsPublished} published`,
    `scores      train ${score(s.lastTrainScore)}  held-out ${s.heldOut === undefined ? "-" : `${score(s.heldOut.meanScore)} (${s.heldOut.run}, ${s.heldOut.tasks} tasks)`}`,
    `errors      ${s.trainingErrors.count} execution(s) not trained in full`,
    ...s.trainingErrors.last.map((e) => `  step ${e.step} ${e.execution}: ${e.reason}`),
    "devices",
    ...s.devices.map((d) => `  cell ${String(d.cell).padEnd(3)} ${d.device.padEnd(26)} ${d.activity.padEnd(10)} v${d.version}  since ${d.sinceS.toFixed(1)} s`),
    "queues (tells waiting / being handled)",
    ...s.queues.map((q) => `  ${q.actor.padEnd(34)} ${String(q.pending).padStart(5)} ${String(q.handling).padStart(5)}`)
  ]
}

const show = (s: RunStatus, json: boolean, inPlace: boolean) =>
  Effect.sync(() => {
    if (json) return console.log(JSON.stringify(s))
    const text = statusLines(s).join("\n")
    console.log(inPlace ? `\x1b[H\x1b[2J${text}` : `${text}\n`)
  })

export const command: Command<typeof flags> = {
  summary: "one run now: devices and roles, executions, steps and micro-batches, weights, queues, scores (--json, --watch)",
  flags,
  run: async (argv) => {
    const { run, f } = parseRunFlags("status", flags, argv)
    const inPlace = f.watch && !f.json && process.stdout.isTTY === true
    return Effect.runPromise(
      withRun("status", run, f.store, (system) =>
        Effect.gen(function* () {
          for (;;) {
            const s = yield* runStatus(system)
            yield* show(s, f.json, inPlace)
            if (!f.watch || s.state !== "live") return 0
            yield* Effect.sleep(Duration.millis(f.interval * 1000))
          }
        })
      )
    )
  }
}
