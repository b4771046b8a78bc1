/**
 * The gateway's open executions, by key digest and by execution id.
 *
 * A session holds what the gateway keeps per execution: its task and default role, the delta
 * encoder of its call records, its assistant turns (to render earlier answers token-exact),
 * its sticky route to a worker and the number of calls recorded. Keys are known only by their
 * digest (`apiKeyDigest`, `../protocols/gateway.ts`): a request's bearer key is digested and
 * looked up. Opening is never a takeover: an open execution keeps its key (the same digest
 * again is a no-op, another is refused), and a digest names one execution. Closing revokes
 * the key. Sessions live in memory only: a restarted gateway has no keys until the runner
 * opens its executions again.
 */
import type * as http from "node:http"
import { Effect } from "effect"
import { DeltaEncoder } from "../tree/encoder.ts"
import { AssistantTurns } from "../openai/turns.ts"
import { apiError } from "../openai/openai.ts"
import { ExecutionConflict, apiKeyDigest } from "../protocols/gateway.ts"
import { newRoute, type Route } from "./call-router.ts"

export interface Session {
  readonly keyDigest: string
  readonly task: string
  readonly execution: string
  readonly defaultRole: string
  readonly encoder: DeltaEncoder
  readonly turns: AssistantTurns
  readonly route: Route
  calls: number
}

export interface OpenRequest {
  readonly keyDigest: string
  readonly task: string
  readonly execution: string
  readonly defaultRole: string
}

/** Longest bearer key looked at (longer ones are refused unread). */
const MAX_KEY_LENGTH = 256
/** Longest role name a call may give (it is recorded with the call). */
const MAX_ROLE_LENGTH = 128

export const makeSessions = (run: string) => {
  const byDigest = new Map<string, Session>()
  const byExecution = new Map<string, Session>()
  return {
    get size() {
      return byExecution.size
    },
    open: ({ keyDigest, task, execution, defaultRole }: OpenRequest): Effect.Effect<Session, ExecutionConflict> => {
      const open = byExecution.get(execution)
      if (open !== undefined) {
        return open.keyDigest === keyDigest ? Effect.succeed(open) : Effect.fail(new ExecutionConflict({ execution, reason: "the execution is already open under another key" }))
      }
      if (byDigest.has(keyDigest)) return Effect.fail(new ExecutionConflict({ execution, reason: "the key already names another open execution" }))
      const session: Session = {
        keyDigest,
        task,
        execution,
        defaultRole,
        encoder: new DeltaEncoder({ run, task, execution }),
        turns: new AssistantTurns(),
        route: newRoute(),
        calls: 0
      }
      byDigest.set(keyDigest, session)
      byExecution.set(execution, session)
      return Effect.succeed(session)
    },
    /** The open session of an execution. */
    get: (execution: string): Session | undefined => byExecution.get(execution),
    /** Forgets the execution and revokes its key; undefined when it was not open. */
    close: (execution: string): Session | undefined => {
      const session = byExecution.get(execution)
      if (session === undefined) return undefined
      byExecution.delete(execution)
      byDigest.delete(session.keyDigest)
      return session
    },
    /**
     * The session named by the request's key: `Authorization: Bearer <key>` (OpenAI's clients,
     * Anthropic's with an auth token), else `x-api-key: <key>` (Anthropic's with an API key); 401 otherwise.
     */
    authenticate: (req: http.IncomingMessage) => {
      const key = requestKey(req)
      if (key === undefined) {
        return Effect.fail(
          apiError(401, "You didn't provide an API key. Send it in the Authorization header as 'Bearer <key>' or in the x-api-key header.", { code: "missing_api_key" })
        )
      }
      const session = key.length > MAX_KEY_LENGTH ? undefined : byDigest.get(apiKeyDigest(key))
      return session === undefined ? Effect.fail(apiError(401, "Incorrect API key provided: it names no open execution.", { code: "invalid_api_key" })) : Effect.succeed(session)
    }
  }
}

/** The key of a request: its `Authorization: Bearer` key, else its `x-api-key` header. */
const requestKey = (req: http.IncomingMessage): string | undefined => {
  const auth = req.headers.authorization
  const bearer = auth === undefined ? null : /^Bearer\s+(\S+)\s*$/i.exec(auth.trim())
  if (bearer !== null) return bearer[1]!
  const header = req.headers["x-api-key"]
  const value = (Array.isArray(header) ? header[0] : header)?.trim()
  return value === undefined || value === "" || /\s/.test(value) ? undefined : value
}

export type Sessions = ReturnType<typeof makeSessions>

/** The call's role: the `X-Gyre-Role` header, else the execution's default role. */
export const roleOf = (session: Session, req: http.IncomingMessage) => {
  const header = req.headers["x-gyre-role"]
  const value = (Array.isArray(header) ? header[0] : header)?.trim()
  if (value === undefined) return Effect.succeed(session.defaultRole)
  return value === "" || value.length > MAX_ROLE_LENGTH
    ? Effect.fail(apiError(400, `The X-Gyre-Role header must be a role name of 1 to ${MAX_ROLE_LENGTH} characters.`, { param: "X-Gyre-Role" }))
    : Effect.succeed(value)
}
