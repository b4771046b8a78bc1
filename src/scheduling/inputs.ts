/**
 * The scheduler's inputs (`SchedulerProtocol`) as policy events. Each input is checked against
 * the book first: a completion that is repeated (a redelivered tell, a re-asked request after a
 * takeover, a progress report that says nothing new) answers `accepted: false` and is no event.
 *
 * | input | event | new when |
 * | --- | --- | --- |
 * | `DeviceJoined {device}` | `CellJoined {cell: next number}` (the record names the device and its incarnation) | the device has no live cell |
 * | `DeviceJoined` from a newer incarnation of a device with a cell | `CellLost {cell}`, then `CellJoined` | the device restarted |
 * | `DeviceLost {device}` | `CellLost {cell}` | the device has a live cell |
 * | `ExecutionEnded` | `ExecutionFinished` | the execution is running |
 * | `SwitchCompleted` (message id `switch-<index>-<cell>`) | `SwitchDone` | it completes the cell's last switch |
 * | `WeightsLoaded {version}` | `WeightsPublished` | newer than published, not newer than asked |
 * | `StepProgress` | `MicroStepDone` | the running step, from its core, more tokens than last said |
 * | `StepDone` | `StepDone` | the running step, from its core (a core counted lost reports nothing) |
 */
import { Effect } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { Handlers, MessageMeta } from "../runtime/actor.ts"
import type { PolicyEvent } from "../policy/vocabulary.ts"
import { parseExecutionName } from "../protocols/run.ts"
import type { SchedulerProtocol } from "../protocols/scheduler.ts"
import { switchMessageId } from "./audit.ts"
import type { Book } from "./book.ts"
import type { Driver, FeedContext } from "./driver.ts"

export interface InputOptions {
  readonly book: Book
  readonly driver: Driver<unknown>
  readonly now: () => number
  /** `<node>#<term>`, for `Status`. */
  readonly leader: string
}

/** The scheduler actor's handlers. A failure to journal crashes the incarnation (the input comes back). */
export const inputHandlers = (options: InputOptions): Handlers<RpcGroup.Rpcs<typeof SchedulerProtocol>> => {
  const { book, driver, now } = options
  const feed = (event: PolicyEvent, context?: FeedContext) => driver.feed(event, context).pipe(Effect.orDie)
  const accepted = (ok: boolean, event: () => PolicyEvent) =>
    ok ? feed(event()).pipe(Effect.as({ accepted: true })) : Effect.succeed({ accepted: false })
  return {
    DeviceJoined: ({ device }, meta: MessageMeta) =>
      Effect.gen(function* () {
        const incarnation = meta.senderIncarnation
        const known = book.cells.cellOf(device)
        if (known !== undefined) {
          const was = book.cells.get(known)!.incarnation
          if (incarnation === undefined || was === undefined || incarnation <= was) return { cell: known }
          // The device restarted: its role and step state are gone with the old incarnation.
          yield* feed({ _tag: "CellLost", cell: known, at: now() }, { device })
        }
        const cell = book.cells.next
        yield* feed({ _tag: "CellJoined", cell, at: now() }, incarnation === undefined ? { device } : { device, incarnation })
        return { cell }
      }),
    DeviceLost: ({ device }) => {
      const cell = book.cells.cellOf(device)
      return cell === undefined ? Effect.succeed({ cell: -1 }) : feed({ _tag: "CellLost", cell, at: now() }, { device }).pipe(Effect.as({ cell }))
    },
    ExecutionEnded: ({ execution, outcome, tokens, durationS }) => {
      const id = parseExecutionName(execution)
      const running = id === undefined ? undefined : book.dispatcher.runningOf(id.n)
      if (running === undefined) return Effect.succeed({ accepted: false })
      const { n, batch } = running.plan
      return feed({ _tag: "ExecutionFinished", execution: n, batch, tokens, duration_s: durationS, at: now() }, { outcome }).pipe(Effect.as({ accepted: true }))
    },
    SwitchCompleted: ({ cell, role }, meta: MessageMeta) => {
      const index = book.cells.get(cell)?.switchIndex ?? -1
      const current = meta.msgId === switchMessageId(index, cell) && book.acceptsSwitch(cell, role, index)
      return accepted(current, () => ({ _tag: "SwitchDone", cell, role, at: now() }))
    },
    WeightsLoaded: ({ version }) => accepted(book.acceptsWeights(version), () => ({ _tag: "WeightsPublished", version, at: now() })),
    StepProgress: ({ step, trainedTokens }, meta: MessageMeta) =>
      accepted(book.acceptsProgress(step, trainedTokens, meta.sender), () => ({ _tag: "MicroStepDone", step, trained_tokens: trainedTokens, at: now() })),
    StepDone: ({ step }, meta: MessageMeta) => accepted(book.acceptsStepDone(step, meta.sender), () => ({ _tag: "StepDone", step, at: now() })),
    Status: () =>
      Effect.succeed({
        leader: options.leader,
        stepsDone: book.stepsDone,
        dispatched: book.dispatcher.dispatched,
        started: book.dispatcher.started,
        finished: book.dispatcher.finished,
        cells: book.cells.list().map((c) => ({ cell: c.cell, device: c.device, role: c.role, switching: c.switching })),
        done: book.done
      })
  }
}
