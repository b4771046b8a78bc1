/**
 * A chat prompt's token ids from its pieces, and its length within a context limit.
 *
 * A chat format (`chat.ts`) renders a request as pieces: text to encode with the model's
 * tokenizer, and ids taken as they are (special tokens, the remembered tokens of earlier
 * assistant turns). `renderPieces` encodes them all at once. `promptWithin` is what the
 * gateway's context check uses, bounded so that no body blocks the event loop for long:
 *
 * 1. a bound known before encoding: a text of b UTF-8 bytes has at least b / maxTokenBytes
 *    tokens (`Tokenizer.maxTokenBytes`; exact for the byte tokenizer), so a prompt whose
 *    bound reaches the limit fails at once;
 * 2. the exact count, encoding part by part (`Tokenizer.encodeParts`: the text between added
 *    tokens, so one message at a time in a chat template), letting other work run every
 *    `SLICE_MS` and stopping as soon as the limit is reached.
 *
 * One part (a single message without special tokens) is encoded in one go; step 1 bounds it
 * to limit x maxTokenBytes bytes.
 */
import { Effect, Schema } from "effect"
import type { Tokenizer } from "../engine/tokenizer.ts"

/** Text to encode, or ids to take as they are. */
export type PromptPiece = string | ArrayLike<number>

/** A prompt at or over the context limit: `tokens` it has (at least, with `atLeast`). */
export class PromptTooLong extends Schema.TaggedError<PromptTooLong>()("PromptTooLong", {
  limit: Schema.Number,
  tokens: Schema.Number,
  atLeast: Schema.Boolean
}) {}

/** Longest stretch of encoding between two turns of the event loop. */
const SLICE_MS = 8

const utf8Bytes = (text: string) => Buffer.byteLength(text, "utf8")

/** Fewer tokens than the pieces encode to (see the module comment). */
export const tokensAtLeast = (tokenizer: Tokenizer, pieces: ReadonlyArray<PromptPiece>): number => {
  let n = 0
  for (const p of pieces) n += typeof p === "string" ? Math.ceil(utf8Bytes(p) / tokenizer.maxTokenBytes) : p.length
  return n
}

/** All the pieces' ids. */
export const renderPieces = (tokenizer: Tokenizer, pieces: ReadonlyArray<PromptPiece>): Int32Array => {
  const ids: Array<number> = []
  for (const p of pieces) {
    const part = typeof p === "string" ? tokenizer.encode(p) : p
    for (let i = 0; i < part.length; i++) ids.push(part[i]!)
  }
  return Int32Array.from(ids)
}

const nextTurn = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))

/** The pieces' ids when they are fewer than `limit` (undefined: no limit), else PromptTooLong. */
export const promptWithin = (tokenizer: Tokenizer, pieces: ReadonlyArray<PromptPiece>, limit: number | undefined): Effect.Effect<Int32Array, PromptTooLong> =>
  Effect.gen(function* () {
    const max = limit ?? Number.POSITIVE_INFINITY
    const bound = tokensAtLeast(tokenizer, pieces)
    if (bound >= max) return yield* new PromptTooLong({ limit: max, tokens: bound, atLeast: true })
    const ids: Array<number> = []
    let since = performance.now()
    for (const p of pieces) {
      for (const part of typeof p === "string" ? tokenizer.encodeParts(p) : [p]) {
        for (let i = 0; i < part.length; i++) ids.push(part[i]!)
        if (ids.length >= max) return yield* new PromptTooLong({ limit: max, tokens: ids.length, atLeast: true })
        if (performance.now() - since > SLICE_MS) {
          yield* nextTurn
          since = performance.now()
        }
      }
    }
    return Int32Array.from(ids)
  })

/**
 * The prompt's token count with the model's tokenizer, for a caller that only counts
 * (`/v1/messages/count_tokens`): past `limit` it stops and answers at least that many.
 */
export const countPromptTokens = (tokenizer: Tokenizer, pieces: ReadonlyArray<PromptPiece>, limit?: number): Effect.Effect<number> =>
  promptWithin(tokenizer, pieces, limit).pipe(
    Effect.map((ids) => ids.length),
    Effect.catchTag("PromptTooLong", (e) => Effect.succeed(e.tokens))
  )
