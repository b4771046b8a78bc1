/**
 * The JSON text of a value encoded by a plain Schema, written directly: for a schema whose
 * encoded form is its type (no transformations anywhere: structs, arrays, literals, strings,
 * finite numbers, booleans, null, unions of literals or of structs tagged by one literal field),
 * `jsonWriter(schema)` gives a function returning exactly
 * `JSON.stringify(Schema.encodeSync(Schema.toCodecJson(schema))(value))` (properties in the
 * schema's order, properties the schema does not name left out, undefined optional ones omitted),
 * about ten times faster, because it walks the value once with no parser.
 *
 * It does not run refinements (an `Int` check, a minimum): it is for values a program built to
 * its own type, such as a policy's state. A value whose shape does not fit (a wrong primitive, a
 * missing field, a non-finite number, a tag no member has) makes the writer return undefined, so
 * the caller can take the schema's own encoder, which gives its encoding or its error.
 */
import type { Schema } from "effect"
import type * as AST from "effect/SchemaAST"

/** A value's JSON text, or undefined when it does not fit the schema. */
type Write = (value: unknown) => string | undefined

const primitive = (ok: (v: unknown) => boolean, text: (v: never) => string): Write => (v) => (ok(v) ? text(v as never) : undefined)
const numberText = (n: number) => String(n) // JSON's own text for a finite number
const booleanText = (b: boolean) => (b ? "true" : "false")

const objectWriter = (ast: AST.Objects): Write | undefined => {
  if (ast.indexSignatures.length > 0) return undefined
  const fields: Array<{ readonly key: string; readonly label: string; readonly omitted: boolean; readonly write: Write }> = []
  for (const p of ast.propertySignatures) {
    const write = compile(p.type)
    if (typeof p.name !== "string" || write === undefined) return undefined
    const omitted = p.type.context?.isOptional === true || (p.type._tag === "Union" && p.type.types.some((t) => t._tag === "Undefined"))
    fields.push({ key: p.name, label: JSON.stringify(p.name) + ":", omitted, write })
  }
  return (v) => {
    if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined
    const record = v as Record<string, unknown>
    let text = ""
    for (const f of fields) {
      const value = record[f.key]
      if (value === undefined && f.omitted) continue // as JSON.stringify leaves out an undefined property
      const written = f.write(value)
      if (written === undefined) return undefined
      text += (text === "" ? "{" : ",") + f.label + written
    }
    return text === "" ? "{}" : text + "}"
  }
}

const arrayWriter = (ast: AST.Arrays): Write | undefined => {
  const item = ast.elements.length === 0 && ast.rest.length === 1 ? compile(ast.rest[0]!) : undefined
  if (item === undefined) return undefined
  return (v) => {
    if (!Array.isArray(v)) return undefined
    let text = "["
    for (let i = 0; i < v.length; i++) {
      const written = item(v[i])
      if (written === undefined) return undefined
      text += (i > 0 ? "," : "") + written
    }
    return text + "]"
  }
}

/** The field every member fixes to a literal of its own, and each literal's member. */
const taggedUnion = (members: ReadonlyArray<AST.AST>): Write | undefined => {
  if (!members.every((m): m is AST.Objects => m._tag === "Objects")) return undefined
  const key = members[0]!.propertySignatures.find((p) => p.type._tag === "Literal" && typeof p.name === "string")?.name
  const byTag = new Map<unknown, Write>()
  for (const m of members) {
    const tag = m.propertySignatures.find((p) => p.name === key && p.type._tag === "Literal")?.type as AST.Literal | undefined
    const write = objectWriter(m)
    if (typeof key !== "string" || tag === undefined || write === undefined || byTag.has(tag.literal)) return undefined
    byTag.set(tag.literal, write)
  }
  return (v) => (typeof v === "object" && v !== null ? byTag.get((v as Record<string, unknown>)[key as string])?.(v) : undefined)
}

const unionWriter = (ast: AST.Union): Write | undefined => {
  const defined = ast.types.filter((t) => t._tag !== "Undefined") // undefined: a field left out (see objectWriter)
  if (defined.length === 1 && defined.length < ast.types.length) return compile(defined[0]!)
  if (!ast.types.every((t) => t._tag === "Literal" && typeof t.literal !== "bigint")) return taggedUnion(ast.types)
  const literals = new Set(ast.types.map((t) => (t as AST.Literal).literal))
  return primitive((v) => literals.has(v as AST.LiteralValue), JSON.stringify)
}

const compile = (ast: AST.AST): Write | undefined => {
  if (ast.encoding !== undefined) return undefined
  switch (ast._tag) {
    case "String":
      return primitive((v) => typeof v === "string", JSON.stringify)
    case "Number":
      return primitive((v) => typeof v === "number" && Number.isFinite(v), numberText)
    case "Boolean":
      return primitive((v) => typeof v === "boolean", booleanText)
    case "Null":
      return primitive((v) => v === null, () => "null")
    case "Literal":
      return typeof ast.literal === "bigint" ? undefined : primitive((v) => v === ast.literal, JSON.stringify)
    case "Objects":
      return objectWriter(ast)
    case "Arrays":
      return arrayWriter(ast)
    case "Union":
      return unionWriter(ast)
    default:
      return undefined
  }
}

/** The direct JSON writer of `schema`, or undefined when the schema is not plain (see the module). */
export const jsonWriter = (schema: Schema.Top): ((value: unknown) => string | undefined) | undefined =>
  compile(schema.ast)
