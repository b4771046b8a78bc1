/**
 * What the gateway's API routes share around a chat turn (`./chat-turn.ts`): the served-model
 * check and the sampled tokens' log-probs (all three APIs); for the Responses and Messages
 * routes, an answer that is either one JSON document or a stream of named events
 * (`event: <type>`, opened by the API's first events before anything else is sent), and running
 * a turn into the writer of the API's output: a streamed call feeds it each delta as generated,
 * a non-streamed one the whole answer at once, so both build the same output.
 */
import { Effect } from "effect"
import { tokenText } from "../openai/chat.ts"
import { apiError, type ApiError, type TokenLogprob } from "../openai/openai.ts"
import type { ChatTurnsShape, GatewayCall, TurnAnswer, TurnDelta, TurnRequest } from "./chat-turn.ts"
import { eventStream, sendJson } from "./http.ts"

/** Sends one named event of a streamed answer. */
export type Sink = (type: string, payload: Record<string, unknown>) => void

/** One named event: its type and payload. */
export type NamedEvent = readonly [type: string, payload: Record<string, unknown>]

/** What a turn's deltas are written as: the API's output being built (and streamed). */
export type VisibleDelta = Pick<TurnDelta, "content" | "reasoning" | "toolCalls">

export interface DeltaWriter {
  readonly delta: (d: VisibleDelta) => void
}

/** The 404 of a model this gateway does not serve. */
export const unknownModel = (name: string, model: string) =>
  apiError(404, `The model '${name}' does not exist. This gateway serves '${model}'.`, { param: "model", code: "model_not_found" })

/** The request's model, or the 404 of another. */
export const served = (model: string, name: string) => (name === model ? Effect.void : Effect.fail(unknownModel(name, model)))

/** The log-prob of each token (the sampled ones only: `top_logprobs` is empty). */
export const tokenLogprobs = (tokenizer: ChatTurnsShape["tokenizer"], tokens: ArrayLike<number>, logprobs: ArrayLike<number>): Array<TokenLogprob> =>
  Array.from(tokens, (t, i) => ({ token: tokenText(t, tokenizer), logprob: logprobs[i]!, bytes: tokenizer.tokenBytes(t), top_logprobs: [] }))

/** A turn's answer in one API: named events when `streamed` (`frame` gives each one's data, `opening` the events that go first), else one JSON document. */
export const turnOutput = (
  call: GatewayCall,
  streamed: boolean,
  frame: (type: string, payload: Record<string, unknown>) => unknown,
  opening: () => ReadonlyArray<NamedEvent>
) => {
  const stream = streamed ? eventStream(call.res, { doneMarker: false }) : undefined
  const send: Sink = (type, payload) => stream?.send(frame(type, payload), type)
  const sink: Sink | undefined =
    stream === undefined
      ? undefined
      : (type, payload) => {
          if (!stream.started) for (const [first, p] of opening()) send(first, p)
          send(type, payload)
        }
  const endWith = (last: ReadonlyArray<NamedEvent>) => {
    for (const [type, payload] of last) sink!(type, payload)
    stream!.end()
  }
  return {
    /** The events' sink; undefined when the answer is one document. */
    sink,
    /** A stream that has started ends with `last`; otherwise nothing is sent (the HTTP layer answers the failure). */
    endStarted: (last: ReadonlyArray<NamedEvent>) => (stream?.started === true ? endWith(last) : undefined),
    /** Not streamed: `document` with status 200; streamed: the `last` events, then the end. */
    end: (document: unknown, last: ReadonlyArray<NamedEvent>) => (stream === undefined ? sendJson(call.res, 200, document) : endWith(last))
  }
}

/** A whole answer as one delta (what a non-streamed call writes). */
const wholeAnswer = (answer: TurnAnswer): VisibleDelta => ({
  content: answer.content ?? "",
  reasoning: answer.reasoning ?? "",
  toolCalls: answer.toolCalls.map((c, index) => ({ index, ...c }))
})

/**
 * Runs `turn` into `writer`: streamed, each delta as it is generated (`see` sees it first);
 * otherwise the whole answer once the turn is done.
 */
export const writeTurn = (
  turns: ChatTurnsShape,
  call: GatewayCall,
  id: string,
  turn: TurnRequest,
  writer: DeltaWriter,
  streamed: boolean,
  see: (d: TurnDelta) => void = () => undefined
): Effect.Effect<TurnAnswer, ApiError> =>
  turns
    .run(
      call,
      id,
      turn,
      streamed
        ? (d) => {
            see(d)
            writer.delta(d)
          }
        : undefined
    )
    .pipe(Effect.tap((answer) => Effect.sync(() => (streamed ? undefined : writer.delta(wholeAnswer(answer))))))
