/**
 * The gateway's open executions, by bearer key and by execution id.
 *
 * A session holds what the gateway keeps per execution: its task and default role, the delta
 * encoder of its call records, its assistant turns (to render earlier answers token-exact),
 * its sticky route to a worker and the number of calls recorded. Opening an execution that is
 * already open keeps its session and replaces its key. Sessions live in memory only: a
 * restarted gateway has no keys until the runner opens its executions again.
 */
import type * as http from "node:http"
import { Effect } from "effect"
import { DeltaEncoder } from "../tree/encoder.ts"
import { AssistantTurns } from "../openai/chat.ts"
import { apiError } from "../openai/openai.ts"
import { newRoute, type Route } from "./call-router.ts"

export interface Session {
  key: string
  readonly task: string
  readonly execution: string
  readonly defaultRole: string
  readonly encoder: DeltaEncoder
  readonly turns: AssistantTurns
  readonly route: Route
  calls: number
}

export interface OpenRequest {
  readonly key: string
  readonly task: string
  readonly execution: string
  readonly defaultRole: string
}

export const makeSessions = (run: string) => {
  const byKey = new Map<string, Session>()
  const byExecution = new Map<string, Session>()
  return {
    get size() {
      return byExecution.size
    },
    open: ({ key, task, execution, defaultRole }: OpenRequest): Session => {
      const session: Session = byExecution.get(execution) ?? {
        key,
        task,
        execution,
        defaultRole,
        encoder: new DeltaEncoder({ run, task, execution }),
        turns: new AssistantTurns(),
        route: newRoute(),
        calls: 0
      }
      byKey.delete(session.key)
      session.key = key
      byKey.set(key, session)
      byExecution.set(execution, session)
      return session
    },
    /** The open session of an execution. */
    get: (execution: string): Session | undefined => byExecution.get(execution),
    /** Forgets the execution and its key; undefined when it was not open. */
    close: (execution: string): Session | undefined => {
      const session = byExecution.get(execution)
      if (session === undefined) return undefined
      byExecution.delete(execution)
      byKey.delete(session.key)
      return session
    },
    /** The session named by the request's `Authorization: Bearer <key>` (401 otherwise). */
    authenticate: (req: http.IncomingMessage) => {
      const auth = req.headers.authorization
      const match = auth === undefined ? null : /^Bearer\s+(.+)$/i.exec(auth.trim())
      if (match === null) {
        return Effect.fail(apiError(401, "You didn't provide an API key. Send it in the Authorization header as 'Bearer <key>'.", { code: "missing_api_key" }))
      }
      const session = byKey.get(match[1]!.trim())
      return session === undefined ? Effect.fail(apiError(401, "Incorrect API key provided: it names no open execution.", { code: "invalid_api_key" })) : Effect.succeed(session)
    }
  }
}

export type Sessions = ReturnType<typeof makeSessions>

/** The call's role: the `X-Gyre-Role` header, else the execution's default role. */
export const roleOf = (session: Session, req: http.IncomingMessage) => {
  const header = req.headers["x-gyre-role"]
  const value = (Array.isArray(header) ? header[0] : header)?.trim()
  if (value === undefined) return Effect.succeed(session.defaultRole)
  return value === "" ? Effect.fail(apiError(400, "The X-Gyre-Role header must be a non-empty role name.", { param: "X-Gyre-Role" })) : Effect.succeed(value)
}
