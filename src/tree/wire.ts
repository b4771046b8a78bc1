/**
 * Wire form of token arrays inside JSON messages: base64 of the little-endian bytes of an
 * `Int32Array` (token ids, policy versions) or a `Float32Array` (log-probabilities).
 *
 * 4 bytes per value become 5.33 base64 characters, so a 1 MiB JetStream message carries
 * about 190k new tokens, and JSON.parse plus one `Buffer` copy decode it (no per-number
 * parsing). Hosts are little-endian (x86-64, arm64); the module refuses to load elsewhere
 * rather than silently writing the other byte order.
 */
import { Schema, SchemaTransformation } from "effect"

if (new Uint8Array(Uint32Array.of(1).buffer)[0] !== 1) {
  throw new Error("src/tree/wire.ts: the token wire form assumes a little-endian host")
}

const base64ByteLength = (s: string): number =>
  (s.length / 4) * 3 - (s.endsWith("==") ? 2 : s.endsWith("=") ? 1 : 0)

type TypedArrayConstructor<A> = { new (length: number): A; readonly BYTES_PER_ELEMENT: number }

/** A Schema from base64 (little-endian bytes) to a typed array of 4-byte values. */
const typedArrayFromBase64 = <A extends Int32Array | Float32Array>(ctor: TypedArrayConstructor<A> & (abstract new (...args: any) => A), name: string) =>
  Schema.String.check(
    Schema.isBase64(),
    Schema.makeFilter((s: string) => base64ByteLength(s) % 4 === 0 || `expected base64 of a whole number of 4-byte ${name} values`)
  ).pipe(
    Schema.decodeTo(
      Schema.instanceOf(ctor),
      SchemaTransformation.transform({
        decode: (s: string): A => {
          const bytes = Buffer.from(s, "base64")
          const out = new ctor(bytes.length / 4)
          new Uint8Array(out.buffer).set(bytes)
          return out
        },
        encode: (a: A): string => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64")
      })
    )
  )

/** Token ids or policy versions: base64 of little-endian int32. */
export const Int32ArrayFromBase64 = typedArrayFromBase64<Int32Array>(Int32Array, "int32")

/** Log-probabilities: base64 of little-endian float32. */
export const Float32ArrayFromBase64 = typedArrayFromBase64<Float32Array>(Float32Array, "float32")
