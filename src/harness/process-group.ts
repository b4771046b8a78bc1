/**
 * Runs a command in its own process group with a wall-clock limit and bounded output.
 *
 * The child is the leader of a new process group (`detached`), so everything it starts can be
 * signalled at once: at the limit the group gets SIGTERM, then SIGKILL after a grace period;
 * when the leader exits the group gets SIGKILL, so nothing a harness left behind outlives
 * it. Its stdout and stderr are read as they come (a flooding child never blocks on a full
 * pipe) and kept as head and tail of at most `outputCapBytes` each, with the bytes dropped
 * between them counted: memory stays bounded whatever the child prints. The group is
 * registered with the parent-death watchdog (`child-watchdog.ts`) while it runs, so it is
 * killed even when this process dies with SIGKILL. With `uid`/`gid` the command runs as that
 * user (a runner running as root gives harnesses an unprivileged uid).
 */
import { spawn } from "node:child_process"
import { writeFile } from "node:fs/promises"
import { guard } from "../runtime/child-watchdog.ts"

export interface GroupCommand {
  readonly command: ReadonlyArray<string>
  readonly cwd: string
  readonly env: Readonly<Record<string, string>>
  readonly timeoutMs: number
  /** Between SIGTERM and SIGKILL at the limit. */
  readonly graceMs: number
  /** Bytes kept of each of stdout and stderr (half from the start, half from the end). */
  readonly outputCapBytes: number
  /** Run as this user and group (needs root). */
  readonly uid?: number | undefined
  readonly gid?: number | undefined
}

export interface GroupResult {
  /** Exit code of the leader; null when a signal ended it or it never started. */
  readonly exitCode: number | null
  readonly signal: string | null
  readonly timedOut: boolean
  /** Why the command could not be started (e.g. no such file), if it could not. */
  readonly startError: string | undefined
  readonly durationMs: number
  readonly stdout: string
  readonly stderr: string
  /** Bytes the child wrote in all (kept or not). */
  readonly outputBytes: number
}

/** Head and tail of a byte stream, each at most `half` bytes. */
class CappedText {
  private readonly head: Array<Buffer> = []
  private headBytes = 0
  private tail: Array<Buffer> = []
  private tailBytes = 0
  total = 0

  constructor(private readonly half: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length
    if (this.headBytes < this.half) {
      const take = Buffer.from(chunk.subarray(0, this.half - this.headBytes))
      this.head.push(take)
      this.headBytes += take.length
      chunk = chunk.subarray(take.length)
    }
    if (chunk.length === 0) return
    this.tail.push(Buffer.from(chunk.length > this.half ? chunk.subarray(chunk.length - this.half) : chunk))
    this.tailBytes += Math.min(chunk.length, this.half)
    while (this.tailBytes - this.tail[0]!.length >= this.half) this.tailBytes -= this.tail.shift()!.length
  }

  text(): string {
    const tail = Buffer.concat(this.tail)
    const kept = tail.subarray(Math.max(0, tail.length - this.half))
    const dropped = this.total - this.headBytes - kept.length
    const middle = dropped > 0 ? `\n[... ${dropped} bytes dropped ...]\n` : ""
    return Buffer.concat(this.head).toString("utf8") + middle + kept.toString("utf8")
  }
}

const signalGroup = (pid: number, signal: NodeJS.Signals) => {
  try {
    process.kill(-pid, signal)
  } catch {
    // the group is already gone
  }
}

/** How long to wait for the pipes to close after the group was killed (a process that left the group may hold them). */
const CLOSE_WAIT_MS = 1000

/** Runs `cmd` to the end (or its limit); never rejects. Aborting `signal` kills the group at once. */
export const runInGroup = (cmd: GroupCommand, signal?: AbortSignal): Promise<GroupResult> =>
  new Promise((resolve) => {
    const started = Date.now()
    const out = new CappedText(Math.max(1, Math.floor(cmd.outputCapBytes / 2)))
    const err = new CappedText(Math.max(1, Math.floor(cmd.outputCapBytes / 2)))
    let timedOut = false
    let startError: string | undefined
    let exit: { code: number | null; signal: string | null } | undefined
    const timers: Array<ReturnType<typeof setTimeout>> = []

    const child = spawn(cmd.command[0]!, cmd.command.slice(1), {
      cwd: cmd.cwd,
      env: cmd.env,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      ...(cmd.uid !== undefined ? { uid: cmd.uid } : {}),
      ...(cmd.gid !== undefined ? { gid: cmd.gid } : {})
    })
    const release = child.pid !== undefined ? guard(child.pid, true) : () => undefined
    child.stdout.on("data", (d: Buffer) => out.push(d))
    child.stderr.on("data", (d: Buffer) => err.push(d))

    let finished = false
    const finish = () => {
      if (finished) return
      finished = true
      release()
      timers.forEach(clearTimeout)
      signal?.removeEventListener("abort", onAbort)
      resolve({
        exitCode: exit?.code ?? null,
        signal: exit?.signal ?? null,
        timedOut,
        startError,
        durationMs: Date.now() - started,
        stdout: out.text(),
        stderr: err.text(),
        outputBytes: out.total + err.total
      })
    }
    const stop = (graceMs: number) => {
      if (child.pid === undefined) return
      signalGroup(child.pid, "SIGTERM")
      timers.push(setTimeout(() => signalGroup(child.pid!, "SIGKILL"), graceMs))
    }
    const onAbort = () => stop(0)
    signal?.addEventListener("abort", onAbort)
    if (signal?.aborted) onAbort()
    timers.push(
      setTimeout(() => {
        timedOut = true
        stop(cmd.graceMs)
      }, cmd.timeoutMs)
    )

    child.on("error", (e) => {
      // The command could not be started: no exit and no close will follow.
      startError = e.message
      finish()
    })
    child.on("exit", (code, sig) => {
      exit = { code, signal: sig }
      timers.forEach(clearTimeout)
      signalGroup(child.pid!, "SIGKILL")
      timers.push(
        setTimeout(() => {
          child.stdout.destroy()
          child.stderr.destroy()
          finish()
        }, CLOSE_WAIT_MS)
      )
    })
    child.on("close", () => {
      if (exit !== undefined && startError === undefined) finish()
    })
  })

/** One line for logs and outcome details: how the command ended. */
export const describeEnd = (r: GroupResult): string =>
  r.startError !== undefined
    ? `could not start: ${r.startError}`
    : `${r.timedOut ? "timed out, " : ""}${r.exitCode !== null ? `exit ${r.exitCode}` : `killed by ${r.signal}`} after ${r.durationMs} ms`

/** `text` cut to `max` characters, "..." marking the cut. */
export const clip = (text: string, max: number) => (text.length <= max ? text : `${text.slice(0, max)}...`)

/** The last `max` characters of `text`, "..." marking the cut. */
export const tailOf = (text: string, max: number) => (text.length <= max ? text : `...${text.slice(text.length - max)}`)

/** Writes a run's end and its kept output to `file` (`harness.log`, `scorer.log`); a write that fails is ignored. */
export const writeGroupLog = (file: string, title: string, r: GroupResult): Promise<void> =>
  writeFile(file, `# ${title}: ${describeEnd(r)}, ${r.outputBytes} bytes of output\n## stdout\n${r.stdout}\n## stderr\n${r.stderr}\n`).catch(() => undefined)
