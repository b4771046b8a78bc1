/**
 * Wire form of token arrays inside JSON messages: base64 of the little-endian bytes of an
 * `Int32Array` (token ids, policy versions) or a `Float32Array` (log-probabilities).
 *
 * 4 bytes per value become 5.33 base64 characters, so a 1 MiB JetStream message carries
 * about 190k new tokens, and JSON.parse plus one `Buffer` copy decode it (no per-number
 * parsing). Hosts are little-endian (x86-64, arm64); the module refuses to load elsewhere
 * rather than silently writing the other byte order.
 */
import { Effect, Schema, SchemaGetter, SchemaIssue } from "effect"

if (new Uint8Array(Uint32Array.of(1).buffer)[0] !== 1) {
  throw new Error("src/tree/wire.ts: the token wire form assumes a little-endian host")
}

/** A Schema from base64 (little-endian bytes) to a typed array of 4-byte values. */
const typedArrayFromBase64 = <A extends Int32Array | Float32Array>(ctor: new (length: number) => A, name: string) =>
  Schema.String.pipe(
    Schema.decodeTo(Schema.instanceOf(ctor), {
      // Buffer skips characters outside the base64 alphabet, so a decoded length that
      // differs from what the string's length promises is how invalid input shows
      // (a regular expression over megabytes of base64 would cost 15x the decoding).
      decode: SchemaGetter.transformEffect((s: string) => {
        const bytes = Buffer.from(s, "base64")
        const padding = s.endsWith("==") ? 2 : s.endsWith("=") ? 1 : 0
        if (s.length % 4 !== 0 || bytes.length !== (s.length / 4) * 3 - padding || bytes.length % 4 !== 0) {
          return Effect.fail(new SchemaIssue.InvalidValue({ message: `expected base64 of a whole number of 4-byte ${name} values` }, s))
        }
        const out = new ctor(bytes.length / 4)
        new Uint8Array(out.buffer).set(bytes)
        return Effect.succeed(out)
      }),
      encode: SchemaGetter.transform((a: A): string => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64"))
    })
  )

/** Token ids or policy versions: base64 of little-endian int32. */
export const Int32ArrayFromBase64 = typedArrayFromBase64<Int32Array>(Int32Array, "int32")

/** Log-probabilities: base64 of little-endian float32. */
export const Float32ArrayFromBase64 = typedArrayFromBase64<Float32Array>(Float32Array, "float32")
