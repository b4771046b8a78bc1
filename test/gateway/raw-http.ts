/**
 * Raw HTTP/1.1 over a TCP socket, for inputs no well-behaved client sends: any bytes as the
 * request, written at once or dribbled, and what came back (status, body, whether and when
 * the server closed the connection).
 */
import * as net from "node:net"

export interface RawAnswer {
  /** The status of the first response line; 0 when the server answered nothing. */
  readonly status: number
  readonly text: string
  /** The server closed the connection (else we gave up after `timeoutMs`). */
  readonly closed: boolean
  readonly ms: number
  /** The connection failed (refused, reset) before any answer. */
  readonly error?: string
}

export interface RawOptions {
  readonly timeoutMs?: number
  /** Written after `request`, one piece every `everyMs` (a slow client). */
  readonly dribble?: { readonly pieces: ReadonlyArray<string | Uint8Array>; readonly everyMs: number }
}

/** Sends `request` to 127.0.0.1:`port` and collects the answer until the server closes or `timeoutMs`. */
export const rawRequest = (port: number, request: string | Uint8Array, options: RawOptions = {}): Promise<RawAnswer> =>
  new Promise((resolve) => {
    const started = Date.now()
    const socket = net.connect(port, "127.0.0.1")
    const chunks: Array<Buffer> = []
    let timer: NodeJS.Timeout | undefined
    let drip: NodeJS.Timeout | undefined
    let settled = false
    const settle = (closed: boolean, error?: string) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      clearInterval(drip)
      socket.destroy()
      const text = Buffer.concat(chunks).toString("latin1")
      const status = /^HTTP\/1\.[01] (\d{3})/.exec(text)
      resolve({ status: status === null ? 0 : Number(status[1]), text, closed, ms: Date.now() - started, ...(error === undefined ? {} : { error }) })
    }
    timer = setTimeout(() => settle(false), options.timeoutMs ?? 10_000)
    socket.on("data", (d) => chunks.push(d))
    socket.on("end", () => settle(true))
    socket.on("close", () => settle(true))
    socket.on("error", (e) => settle(true, chunks.length === 0 ? e.message : undefined))
    socket.on("connect", () => {
      socket.write(request)
      const pieces = [...(options.dribble?.pieces ?? [])]
      if (pieces.length > 0) {
        drip = setInterval(() => {
          const piece = pieces.shift()
          if (piece === undefined || socket.destroyed) return clearInterval(drip)
          socket.write(piece)
        }, options.dribble!.everyMs)
      }
    })
  })

/** A request with a `content-length` body (the header right unless `headers` gives one). */
export const httpRequest = (method: string, target: string, headers: Record<string, string>, body = ""): string => {
  const all = { host: "127.0.0.1", connection: "close", ...(body === "" ? {} : { "content-length": String(Buffer.byteLength(body)) }), ...headers }
  return `${method} ${target} HTTP/1.1\r\n${Object.entries(all).map(([k, v]) => `${k}: ${v}`).join("\r\n")}\r\n\r\n${body}`
}

/** The JSON body of an answer (after the blank line), or undefined. */
export const jsonOf = (answer: RawAnswer): any => {
  const at = answer.text.indexOf("\r\n\r\n")
  try {
    return JSON.parse(answer.text.slice(at + 4))
  } catch {
    return undefined
  }
}
