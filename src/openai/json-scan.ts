/**
 * Scanning JSON as a model writes it, possibly unfinished: where one value ends, and the
 * members of an object with the span of each value. Tool-call parsers (`tool-formats.ts`)
 * use it to read a call's name as soon as it is written and to stream its arguments as the
 * raw text they are, while the rest is still being generated.
 */

const WS = /\s/

/** Index of the first non-whitespace character at or after `at` (text.length if none). */
export const skipSpace = (text: string, at: number): number => {
  while (at < text.length && WS.test(text[at]!)) at++
  return at
}

/** Where a JSON string starting at `at` (its opening quote) ends: after its closing quote, or "partial". */
const stringEnd = (text: string, at: number): number | "partial" => {
  for (let i = at + 1; i < text.length; i++) {
    const c = text[i]!
    if (c === "\\") i++
    else if (c === '"') return i + 1
  }
  return "partial"
}

const LITERAL = /^(?:-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)/

/**
 * Where the JSON value starting at `at` (no leading whitespace) ends: the index after it,
 * "partial" when the text ends inside it, "malformed" when it cannot be JSON.
 */
export const valueEnd = (text: string, at: number): number | "partial" | "malformed" => {
  if (at >= text.length) return "partial"
  const c = text[at]!
  if (c === '"') return stringEnd(text, at)
  if (c === "{" || c === "[") {
    const stack: Array<string> = []
    for (let i = at; i < text.length; i++) {
      const d = text[i]!
      if (d === '"') {
        const end = stringEnd(text, i)
        if (end === "partial") return "partial"
        i = end - 1
      } else if (d === "{" || d === "[") stack.push(d === "{" ? "}" : "]")
      else if (d === "}" || d === "]") {
        if (stack.pop() !== d) return "malformed"
        if (stack.length === 0) return i + 1
      }
    }
    return "partial"
  }
  const m = LITERAL.exec(text.slice(at, at + 64))
  if (m === null) return /^[-\dtfn]/.test(c) && text.length - at < 6 ? "partial" : "malformed"
  // a number at the end of the text may go on
  return at + m[0].length === text.length && /[\d.eE+-]$/.test(m[0]) ? "partial" : at + m[0].length
}

/** One member of an object: its key and the span of its value (`end` undefined while unfinished). */
export interface Member {
  readonly key: string
  readonly start: number
  readonly end: number | undefined
}

export type ObjectScan =
  | { readonly kind: "malformed" }
  | { readonly kind: "partial"; readonly members: ReadonlyArray<Member> }
  | { readonly kind: "complete"; readonly members: ReadonlyArray<Member>; readonly end: number }

/** Scans the object whose `{` is at `at`: its members so far, and where it ends. */
export const scanObject = (text: string, at: number): ObjectScan => {
  const members: Array<Member> = []
  let i = skipSpace(text, at + 1)
  if (i < text.length && text[i] === "}") return { kind: "complete", members, end: i + 1 }
  for (;;) {
    if (i >= text.length) return { kind: "partial", members }
    if (text[i] !== '"') return { kind: "malformed" }
    const keyEnd = stringEnd(text, i)
    if (keyEnd === "partial") return { kind: "partial", members }
    const key = JSON.parse(text.slice(i, keyEnd)) as string
    i = skipSpace(text, keyEnd)
    if (i >= text.length) return { kind: "partial", members }
    if (text[i] !== ":") return { kind: "malformed" }
    const start = skipSpace(text, i + 1)
    const end = valueEnd(text, start)
    if (end === "malformed") return { kind: "malformed" }
    if (end === "partial") {
      if (start < text.length) members.push({ key, start, end: undefined })
      return { kind: "partial", members }
    }
    members.push({ key, start, end })
    i = skipSpace(text, end)
    if (i >= text.length) return { kind: "partial", members }
    if (text[i] === "}") return { kind: "complete", members, end: i + 1 }
    if (text[i] !== ",") return { kind: "malformed" }
    i = skipSpace(text, i + 1)
  }
}
