/**
 * Field-level difference of two JSON values (what `gyre replay --verify` prints for a divergent
 * record): every leaf path where they differ, `[i]` for array items and `.key` for fields.
 */

export interface FieldDifference {
  readonly path: string
  readonly expected: unknown
  readonly recorded: unknown
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v)

/** The leaves where `expected` and `recorded` differ (a value missing on one side is `undefined`). */
export const jsonDiff = (expected: unknown, recorded: unknown, path = ""): Array<FieldDifference> => {
  if (Array.isArray(expected) && Array.isArray(recorded)) {
    const n = Math.max(expected.length, recorded.length)
    return Array.from({ length: n }, (_, i) => jsonDiff(expected[i], recorded[i], `${path}[${i}]`)).flat()
  }
  if (isObject(expected) && isObject(recorded)) {
    const keys = [...new Set([...Object.keys(expected), ...Object.keys(recorded)])]
    return keys.flatMap((k) => jsonDiff(expected[k], recorded[k], `${path}.${k}`))
  }
  return JSON.stringify(expected) === JSON.stringify(recorded) ? [] : [{ path: path === "" ? "." : path, expected, recorded }]
}
