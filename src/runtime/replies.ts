/**
 * Request/reply for asks over one wildcard inbox subscription per connection: what nats.js's
 * `nc.request` does, without what it spends per request on top (a promise, a timer of its own,
 * and an `Error`, with its stack, made and thrown away whenever a request ends, even answered).
 * That was ~8% of an ask's CPU (bench:runtime).
 *
 * A request publishes with a reply subject `<inbox>.<n>` and waits `waitMs` for the one reply;
 * its outcome is a reply, a timeout, no responders (the server's 503 status) or a failure (the
 * publish refused, or the subscription closed), told once. The inbox is made under the
 * connection's inbox prefix, so a user limited to its own inboxes (`auth.ts`) may subscribe to it.
 */
import { createInbox, type Msg, type MsgHdrs, type NatsConnection } from "@nats-io/transport-node"
import { Effect, type Scope } from "effect"

export type ReplyOutcome =
  | { readonly _tag: "Reply"; readonly msg: Msg }
  | { readonly _tag: "Timeout" }
  | { readonly _tag: "NoResponders" }
  | { readonly _tag: "Failed"; readonly message: string }

export interface Replies {
  /** Sends a request; `done` is called once with its outcome. Returns a cancel (no outcome after it). */
  readonly request: (subject: string, data: Uint8Array, headers: MsgHdrs | undefined, waitMs: number, done: (o: ReplyOutcome) => void) => () => void
}

interface Pending {
  readonly done: (o: ReplyOutcome) => void
  readonly timer: ReturnType<typeof setTimeout>
}

/** The replies of `nc` for the lifetime of the scope (its subscription ends with it; pending requests hear `Failed`). */
export const makeReplies = (nc: NatsConnection): Effect.Effect<Replies, never, Scope.Scope> =>
  Effect.gen(function* () {
    const prefix = (nc as { readonly options?: { readonly inboxPrefix?: string } }).options?.inboxPrefix
    const inbox = createInbox(prefix)
    const pending = new Map<string, Pending>()
    let next = 0
    /** The request of `token`, no longer pending (its timer stopped); undefined when it was not. */
    const take = (token: string): Pending | undefined => {
      const p = pending.get(token)
      if (p === undefined) return undefined
      pending.delete(token)
      clearTimeout(p.timer)
      return p
    }
    const settle = (token: string, outcome: ReplyOutcome) => take(token)?.done(outcome)
    const closeAll = (message: string) => {
      for (const token of [...pending.keys()]) settle(token, { _tag: "Failed", message })
    }
    const sub = nc.subscribe(`${inbox}.*`, {
      callback: (_e, msg) => {
        const token = msg.subject.slice(inbox.length + 1)
        const noResponders = msg.data.length === 0 && msg.headers?.code === 503
        settle(token, noResponders ? { _tag: "NoResponders" } : { _tag: "Reply", msg })
      }
    })
    void sub.closed.then(() => closeAll("the reply subscription closed"))
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        sub.unsubscribe()
        closeAll("the actor system stopped")
      })
    )
    const request: Replies["request"] = (subject, data, headers, waitMs, done) => {
      const token = String(next++)
      const timer = setTimeout(() => settle(token, { _tag: "Timeout" }), waitMs)
      pending.set(token, { done, timer })
      try {
        nc.publish(subject, data, { reply: `${inbox}.${token}`, ...(headers === undefined ? {} : { headers }) })
      } catch (e) {
        settle(token, { _tag: "Failed", message: e instanceof Error ? e.message : String(e) })
      }
      return () => void take(token)
    }
    return { request }
  })
