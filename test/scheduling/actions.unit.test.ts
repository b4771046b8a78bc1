/**
 * The scheduler's shell (`makeShell`) over fakes: a `Book` folded from hand-written records, an
 * `ask` and `tell` that record what they are sent (and fail when told to), a scripted
 * `runExecution`. What each record makes the shell send, to whom, in which order, with which
 * message ids, and that retries and a lost cell behave. The live scheduler on NATS is tested
 * end to end (scheduler.test.ts, takeover.test.ts).
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { PolicyAction, PolicyEvent } from "../../src/policy/vocabulary.ts"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import { formatAddress, parseAddress } from "../../src/runtime/names.ts"
import { refOf, type ActorSystemShape } from "../../src/runtime/system.ts"
import { SchedulerProtocol } from "../../src/protocols/scheduler.ts"
import { Shell } from "../../src/scheduling/actions.ts"
import { switchMessageId } from "../../src/scheduling/audit.ts"
import { Book } from "../../src/scheduling/book.ts"
import type { ExecutionOutcome } from "../../src/tree/outcome.ts"
import { runConfig } from "./run.ts"

interface Sent {
  readonly via: "ask" | "tell"
  readonly to: string
  readonly tag: string
  readonly payload: any
  readonly msgId?: string | undefined
}

const outcomeOf = (execution: string): ExecutionOutcome => ({ run: "r", task: "fake/t", execution, ended: "finished", evaluation: "scored", score: 1, attempts: 1, detail: "" })

/**
 * A shell over a book of three cells (0, 1, 2 on devices d0, d1, d2). `failFirst` tags fail
 * once before they succeed; `hang` tags never answer.
 */
const setup = (o: { readonly failFirst?: ReadonlyArray<string>; readonly hang?: ReadonlyArray<string> } = {}) => {
  const sent: Array<Sent> = []
  const failures = new Set(o.failFirst ?? [])
  const answer = (tag: string) => {
    if (failures.delete(tag)) return Effect.fail(new Error(`${tag} failed once`))
    if (o.hang?.includes(tag)) return Effect.never
    return Effect.succeed(tag === "SwitchRole" ? { role: "training", generationsMoved: 0, contextsMoved: 0, bytesMoved: 0, reprefillTokens: 0, controlMs: 0, ms: 1 } : {})
  }
  const system = {
    run: "r",
    ask: (ref: any, tag: string, payload: any) =>
      Effect.suspend(() => {
        sent.push({ via: "ask", to: formatAddress(ref.address), tag, payload })
        return answer(tag)
      }),
    tell: (ref: any, tag: string, payload: any, options: any) =>
      Effect.suspend(() => {
        sent.push({ via: "tell", to: formatAddress(ref.address), tag, payload, msgId: options?.msgId })
        return answer(tag).pipe(Effect.as({ seq: 1, duplicate: false }))
      })
  } as unknown as ActorSystemShape
  const book = new Book(runConfig("r"), ["t1", "t2", "t3"])
  let index = 0
  const record = (event: PolicyEvent, actions: ReadonlyArray<PolicyAction> = [], device?: string): PolicyRecord => ({
    index: index++,
    term: 1,
    event,
    actions,
    digest: "",
    ...(device === undefined ? {} : { device })
  })
  for (const cell of [0, 1, 2]) book.apply(record({ _tag: "CellJoined", cell, at: 0 }, [], `device/d${cell}`))
  const ran: Array<string> = []
  const shell = Shell.make({
    system,
    book,
    self: refOf(SchedulerProtocol, parseAddress("scheduler/main")),
    sender: "scheduler/main",
    runExecution: (plan) => Effect.sync(() => void ran.push(plan.execution)).pipe(Effect.as({ outcome: outcomeOf(plan.execution), tokens: 10 + plan.n })),
    deviceTimeoutMs: 1000,
    now: () => 5,
    facts: () => ({ run: "r", policy: "elastic", wallS: 1 })
  })
  return { sent, book, record, shell, ran }
}

/** Polls until `check` holds (at most 3 s). */
const until = (check: () => boolean) =>
  Effect.gen(function* () {
    for (let i = 0; i < 300 && !check(); i++) yield* Effect.sleep("10 millis")
    expect(check()).toBe(true)
  })

describe("scheduler shell", () => {
  it("runs a started execution and tells its end, once per execution id", async () => {
    const s = setup()
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const shell = yield* s.shell
          const dispatched = s.record({ _tag: "WeightsPublished", version: 0, at: 0 }, [{ _tag: "Dispatch", batch: 0 }])
          s.book.apply(dispatched)
          const started = s.record({ _tag: "ExecutionStarted", execution: 1, batch: 0, at: 1 })
          s.book.apply(started)
          yield* shell.execute(started)
          yield* until(() => s.sent.some((m) => m.tag === "ExecutionEnded"))
        })
      )
    )
    const plan = s.book.plan(0)[1]!
    expect(s.ran).toEqual([plan.execution])
    const ended = s.sent.filter((m) => m.tag === "ExecutionEnded")
    expect(ended).toEqual([
      { via: "tell", to: "scheduler/main", tag: "ExecutionEnded", msgId: `ended-${plan.execution}`, payload: { execution: plan.execution, outcome: outcomeOf(plan.execution), tokens: 11, durationS: 4 } }
    ])
  })

  it("switches a cell out of rollout towards the serving cells (highest first), retrying, then tells SwitchCompleted", async () => {
    const s = setup({ failFirst: ["SwitchRole"] })
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const shell = yield* s.shell
          const r = s.record({ _tag: "WeightsPublished", version: 0, at: 0 }, [{ _tag: "SwitchRole", cell: 0, role: "training" }])
          s.book.apply(r)
          yield* shell.execute(r)
          yield* until(() => s.sent.some((m) => m.tag === "SwitchCompleted"))
        })
      )
    )
    const asks = s.sent.filter((m) => m.tag === "SwitchRole")
    expect(asks).toHaveLength(2)
    expect(asks[1]).toMatchObject({ to: "device/d0", payload: { role: "training", destinations: ["device/d2", "device/d1"] } })
    const done = s.sent.filter((m) => m.tag === "SwitchCompleted")
    expect(done).toHaveLength(1)
    expect(done[0]).toMatchObject({ msgId: switchMessageId(3, 0), payload: { cell: 0, role: "training" } })
  })

  it("starts a step on its core before the joiners join and the finished executions are told, each under its message id", async () => {
    const s = setup()
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const shell = yield* s.shell
          s.book.apply(s.record({ _tag: "WeightsPublished", version: 0, at: 0 }, [{ _tag: "Dispatch", batch: 0 }]))
          for (const n of [0, 1]) {
            s.book.apply(s.record({ _tag: "ExecutionStarted", execution: n, batch: 0, at: 1 }))
            s.book.apply(s.record({ _tag: "ExecutionFinished", execution: n, batch: 0, tokens: 20 + n, duration_s: 1, at: 2 }), { outcome: outcomeOf(`e${n}`) })
          }
          const start = s.record({ _tag: "WeightsPublished", version: 0, at: 3 }, [{ _tag: "StartStep", step: 0, core: 1, cells: [1, 2] }])
          s.book.apply(start)
          yield* shell.execute(start)
          // A finished execution arriving while the step runs is told too; a repeated record tells it again under the same message id (the core deduplicates).
          s.book.apply(s.record({ _tag: "ExecutionStarted", execution: 2, batch: 0, at: 3 }))
          const late = s.record({ _tag: "ExecutionFinished", execution: 2, batch: 0, tokens: 30, duration_s: 1, at: 4 })
          s.book.apply(late, { outcome: outcomeOf("e2") })
          yield* shell.execute(late)
          yield* shell.execute(late)
          yield* until(() => s.sent.filter((m) => m.tag === "TrainExecution").length === 4 && s.sent.some((m) => m.tag === "JoinStep"))
        })
      )
    )
    const plan = s.book.plan(0)
    const startAt = s.sent.findIndex((m) => m.tag === "StartStep")
    expect(s.sent[startAt]).toMatchObject({
      via: "ask",
      to: "device/d1",
      payload: { step: 0, attempt: 8, version: 0, executions: 4, groupSizes: [2, 2], cells: ["device/d2"] }
    })
    const joins = s.sent.filter((m) => m.tag === "JoinStep")
    expect(joins).toEqual([{ via: "ask", to: "device/d2", tag: "JoinStep", payload: { step: 0, attempt: 8, version: 0, core: "device/d1" } }])
    const trains = s.sent.filter((m) => m.tag === "TrainExecution")
    // The step's attempt is the index of the record that started it.
    expect(trains.map((m) => m.msgId)).toEqual([0, 1, 2, 2].map((n) => `train-${plan[n]!.execution}-a8`))
    expect(trains.every((m) => m.to === "device/d1")).toBe(true)
    expect(trains.map((m) => m.payload.tokens)).toEqual([20, 21, 30, 30])
    expect(trains[0]!.payload.outcome).toEqual(outcomeOf("e0"))
    // Nothing reaches the step before its core answered StartStep.
    expect(s.sent.findIndex((m) => m.tag === "JoinStep" || m.tag === "TrainExecution")).toBeGreaterThan(startAt)
  })

  it("publishes weights to every rollout cell, then tells WeightsLoaded", async () => {
    const s = setup({ failFirst: ["LoadWeights"] })
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const shell = yield* s.shell
          const switched = s.record({ _tag: "WeightsPublished", version: 0, at: 0 }, [{ _tag: "SwitchRole", cell: 2, role: "training" }])
          s.book.apply(switched)
          const r = s.record({ _tag: "StepDone", step: 0, at: 1 }, [{ _tag: "PublishWeights", version: 1 }])
          s.book.apply(r)
          yield* shell.execute(r)
          yield* until(() => s.sent.some((m) => m.tag === "WeightsLoaded"))
        })
      )
    )
    const loads = s.sent.filter((m) => m.tag === "LoadWeights")
    // Cell 2 is training: not asked. One of the two failed once and was asked again.
    expect(new Set(loads.map((m) => m.to))).toEqual(new Set(["device/d0", "device/d1"]))
    expect(loads).toHaveLength(3)
    expect(loads.every((m) => m.payload.version === 1)).toBe(true)
    expect(s.sent.filter((m) => m.tag === "WeightsLoaded")).toEqual([{ via: "tell", to: "scheduler/main", tag: "WeightsLoaded", payload: { version: 1 }, msgId: "weights-1" }])
  })

  it("a lost cell stops its pending requests and re-asks the running executions", async () => {
    const s = setup({ hang: ["SwitchRole"] })
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const shell = yield* s.shell
          s.book.apply(s.record({ _tag: "WeightsPublished", version: 0, at: 0 }, [{ _tag: "Dispatch", batch: 0 }]))
          s.book.apply(s.record({ _tag: "ExecutionStarted", execution: 0, batch: 0, at: 1 }))
          const r = s.record({ _tag: "WeightsPublished", version: 0, at: 1 }, [{ _tag: "SwitchRole", cell: 0, role: "training" }])
          s.book.apply(r)
          yield* shell.execute(r)
          yield* until(() => s.sent.some((m) => m.tag === "SwitchRole"))
          const lost = s.record({ _tag: "CellLost", cell: 0, at: 2 })
          s.book.apply(lost)
          yield* shell.execute(lost)
          yield* until(() => s.ran.length === 1)
          yield* Effect.sleep("30 millis")
        })
      )
    )
    expect(s.sent.filter((m) => m.tag === "SwitchRole")).toHaveLength(1)
    expect(s.sent.filter((m) => m.tag === "SwitchCompleted")).toEqual([])
    expect(s.ran).toEqual([s.book.plan(0)[0]!.execution])
  })
})
