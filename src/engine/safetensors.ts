/**
 * The safetensors file format as pure code: parsing a header into tensor entries with their
 * absolute byte ranges in the file, and encoding the header of a file to write.
 *
 * Format (https://huggingface.co/docs/safetensors): u64 little-endian header length N, N bytes
 * of JSON `{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end)}}`,
 * then the data section (offsets relative to its start). Parsing checks what a writer can get
 * wrong (offsets out of the file, overlaps, sizes that disagree with dtype x shape) and throws
 * one line naming the tensor.
 */

/** The stored element types the engine converts (gyre.h gyre_dtype). */
export const dtypes = { F32: { code: 0, bytes: 4, torch: "float32" }, F16: { code: 1, bytes: 2, torch: "float16" }, BF16: { code: 2, bytes: 2, torch: "bfloat16" } } as const
export type Dtype = keyof typeof dtypes
export const isDtype = (s: string): s is Dtype => s in dtypes

/** Bytes of the element types safetensors defines (for checking sizes of any entry). */
const elementBytes: Record<string, number> = { F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, BOOL: 1, F8_E4M3: 1, F8_E5M2: 1 }

export interface TensorEntry {
  readonly name: string
  readonly dtype: string
  readonly shape: ReadonlyArray<number>
  /** Absolute byte range in the file. */
  readonly begin: number
  readonly end: number
}

/** Length of the header JSON, from the file's first 8 bytes. */
export const headerLength = (first8: Uint8Array): number => {
  const n = new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true)
  if (n > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`header length ${n} is not plausible`)
  return Number(n)
}

/** The tensor entries of a header (`json`, the N bytes after the length) of a file of `fileSize` bytes. */
export const parseHeader = (json: Uint8Array, fileSize: number): Array<TensorEntry> => {
  let header: unknown
  try {
    header = JSON.parse(new TextDecoder().decode(json))
  } catch (e) {
    throw new Error(`header is not JSON (${e instanceof Error ? e.message : String(e)})`)
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) throw new Error("header is not a JSON object")
  const dataStart = 8 + json.length
  const entries: Array<TensorEntry> = []
  for (const [name, value] of Object.entries(header)) {
    if (name === "__metadata__") continue
    const v = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown }
    const shape = v.shape, offsets = v.data_offsets
    const ints = (a: unknown, n?: number): a is Array<number> =>
      Array.isArray(a) && (n === undefined || a.length === n) && a.every((x) => Number.isSafeInteger(x) && x >= 0)
    if (typeof v.dtype !== "string" || !ints(shape) || !ints(offsets, 2)) throw new Error(`tensor '${name}' lacks dtype, shape or data_offsets`)
    const [begin, end] = [offsets[0]! + dataStart, offsets[1]! + dataStart]
    if (end < begin) throw new Error(`tensor '${name}' has data_offsets ending before they begin`)
    if (end > fileSize) throw new Error(`truncated: tensor '${name}' needs bytes up to ${end} but the file has ${fileSize}`)
    const width = elementBytes[v.dtype]
    const numel = shape.reduce((a, b) => a * b, 1)
    if (width !== undefined && end - begin !== numel * width) throw new Error(`tensor '${name}' spans ${end - begin} bytes, ${v.dtype} [${shape.join(", ")}] needs ${numel * width}`)
    entries.push({ name, dtype: v.dtype, shape, begin, end })
  }
  const sorted = [...entries].sort((a, b) => a.begin - b.begin)
  for (let i = 1; i < sorted.length; i++) {
    if (sorted[i]!.begin < sorted[i - 1]!.end) throw new Error(`tensors '${sorted[i - 1]!.name}' and '${sorted[i]!.name}' overlap`)
  }
  return entries
}

/** The first bytes of a file holding `tensors` in this order: length, JSON header (8-aligned). */
export const encodeHeader = (
  tensors: ReadonlyArray<{ readonly name: string; readonly dtype: Dtype; readonly shape: ReadonlyArray<number> }>,
  metadata: Readonly<Record<string, string>> = { format: "pt" }
): Uint8Array => {
  const header: Record<string, unknown> = { __metadata__: metadata }
  let offset = 0
  for (const t of tensors) {
    const bytes = t.shape.reduce((a, b) => a * b, 1) * dtypes[t.dtype].bytes
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] }
    offset += bytes
  }
  const json = new TextEncoder().encode(JSON.stringify(header))
  const length = json.length + ((8 - (json.length % 8)) % 8)
  const out = new Uint8Array(8 + length).fill(0x20, 8)
  new DataView(out.buffer).setBigUint64(0, BigInt(length), true)
  out.set(json, 8)
  return out
}
