/**
 * JSON lines files written and read as a stream, for `--export` and `--from-export`: a file
 * is never held whole in memory. `LineWriter` appends text through a buffer of `FLUSH_BYTES`,
 * and writes a token array as a JSON array in slices (`numbers`), so a call whose prompt holds
 * hundreds of thousands of tokens never becomes one string of them; `forEachLine` reads a file
 * in blocks of `BLOCK_BYTES` and hands each line to its callback, holding one line at a time.
 */
import * as fs from "node:fs"

const FLUSH_BYTES = 1 << 20
const BLOCK_BYTES = 1 << 20
/** Values per slice of a written array. */
const SLICE = 16384

/** A file of JSON lines, written in order. */
export class LineWriter {
  private readonly fd: number
  private pending: Array<string> = []
  private pendingChars = 0
  lines = 0

  constructor(file: string) {
    this.fd = fs.openSync(file, "w")
  }

  /** Appends raw text (the caller writes the JSON; `end` closes the line). */
  write(text: string): void {
    this.pending.push(text)
    this.pendingChars += text.length
    if (this.pendingChars >= FLUSH_BYTES) this.flush()
  }

  /** Appends a JSON array of `values` (non-finite numbers as null, as JSON.stringify writes them). */
  numbers(values: ArrayLike<number>): void {
    this.write("[")
    for (let from = 0; from < values.length; from += SLICE) {
      const to = Math.min(values.length, from + SLICE)
      const parts = new Array<string>(to - from)
      for (let i = from; i < to; i++) {
        const v = values[i]!
        parts[i - from] = Number.isFinite(v) ? String(v) : "null"
      }
      this.write(from === 0 ? parts.join(",") : `,${parts.join(",")}`)
    }
    this.write("]")
  }

  /** Ends the current line. */
  end(): void {
    this.write("\n")
    this.lines++
  }

  /** One value as one line. */
  json(value: unknown): void {
    this.write(JSON.stringify(value))
    this.end()
  }

  private flush(): void {
    if (this.pending.length === 0) return
    fs.writeSync(this.fd, this.pending.join(""))
    this.pending = []
    this.pendingChars = 0
  }

  close(): void {
    this.flush()
    fs.closeSync(this.fd)
  }
}

/** Calls `f` with each non-empty line of `file` and its number (from 1), reading block by block. */
export const forEachLine = (file: string, f: (line: string, n: number) => void): void => {
  const fd = fs.openSync(file, "r")
  try {
    const block = Buffer.allocUnsafe(BLOCK_BYTES)
    let carry: Array<Buffer> = []
    let n = 0
    const emit = (bytes: Buffer) => {
      n++
      const line = bytes.toString("utf8")
      if (line.trim() !== "") f(line, n)
    }
    for (;;) {
      const read = fs.readSync(fd, block, 0, BLOCK_BYTES, null)
      if (read === 0) break
      let start = 0
      for (let nl = block.indexOf(10, 0); nl !== -1 && nl < read; nl = block.indexOf(10, start)) {
        const piece = block.subarray(start, nl)
        emit(carry.length === 0 ? piece : Buffer.concat([...carry, piece]))
        carry = []
        start = nl + 1
      }
      if (start < read) carry.push(Buffer.from(block.subarray(start, read)))
    }
    if (carry.length > 0) emit(Buffer.concat(carry))
  } finally {
    fs.closeSync(fd)
  }
}
