/**
 * A TCP proxy for fault injection between a client and a server: passes bytes through,
 * delays every chunk by `delayMs`, cuts every connection (and refuses new ones) until
 * restored.
 */
import * as net from "node:net"

export interface TcpProxy {
  readonly url: string
  delay(ms: number): void
  cut(): void
  restore(): void
  close(): Promise<void>
}

export const startProxy = (target: { host: string; port: number }): Promise<TcpProxy> =>
  new Promise((resolve) => {
    let delayMs = 0
    let down = false
    const sockets = new Set<net.Socket>()
    const forward = (from: net.Socket, to: net.Socket) =>
      from.on("data", (chunk) => {
        if (delayMs === 0) to.write(chunk)
        else setTimeout(() => !to.destroyed && to.write(chunk), delayMs)
      })
    const server = net.createServer((client) => {
      if (down) return void client.destroy()
      const upstream = net.connect(target.port, target.host)
      for (const s of [client, upstream]) {
        sockets.add(s)
        s.on("error", () => undefined)
        s.on("close", () => {
          sockets.delete(s)
          client.destroy()
          upstream.destroy()
        })
      }
      forward(client, upstream)
      forward(upstream, client)
    })
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port
      resolve({
        url: `nats://127.0.0.1:${port}`,
        delay: (ms) => void (delayMs = ms),
        cut: () => {
          down = true
          for (const s of sockets) s.destroy()
        },
        restore: () => void (down = false),
        close: () =>
          new Promise((r) => {
            for (const s of sockets) s.destroy()
            server.close(() => r())
          })
      })
    })
  })
