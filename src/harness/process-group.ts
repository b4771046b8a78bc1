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
import { spawn, type ChildProcessByStdio } from "node:child_process"
import { writeFile } from "node:fs/promises"
import type { Readable } from "node:stream"
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

/** One command's run: its group's limits and signals, its kept output, and its end reported once to `done`. */
class GroupRun {
  private readonly started = Date.now()
  private readonly out: CappedText
  private readonly err: CappedText
  private readonly child: ChildProcessByStdio<null, Readable, Readable>
  private readonly release: () => void
  private readonly timers: Array<ReturnType<typeof setTimeout>> = []
  private readonly onAbort = () => this.stop(0)
  private timedOut = false
  private startError: string | undefined
  private exit: { code: number | null; signal: string | null } | undefined
  private finished = false

  constructor(
    cmd: GroupCommand,
    private readonly signal: AbortSignal | undefined,
    private readonly done: (result: GroupResult) => void
  ) {
    const half = Math.max(1, Math.floor(cmd.outputCapBytes / 2))
    this.out = new CappedText(half)
    this.err = new CappedText(half)
    this.child = spawn(cmd.command[0]!, cmd.command.slice(1), {
      cwd: cmd.cwd,
      env: cmd.env,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      ...(cmd.uid !== undefined ? { uid: cmd.uid } : {}),
      ...(cmd.gid !== undefined ? { gid: cmd.gid } : {})
    })
    this.release = this.child.pid !== undefined ? guard(this.child.pid, true) : () => undefined
    this.child.stdout.on("data", (d: Buffer) => this.out.push(d))
    this.child.stderr.on("data", (d: Buffer) => this.err.push(d))
    signal?.addEventListener("abort", this.onAbort)
    if (signal?.aborted) this.onAbort()
    this.timers.push(
      setTimeout(() => {
        this.timedOut = true
        this.stop(cmd.graceMs)
      }, cmd.timeoutMs)
    )
    this.watch()
  }

  private watch() {
    const child = this.child
    child.on("error", (e) => {
      // The command could not be started: no exit and no close will follow.
      this.startError = e.message
      this.finish()
    })
    child.on("exit", (code, sig) => {
      this.exit = { code, signal: sig }
      this.timers.forEach(clearTimeout)
      signalGroup(child.pid!, "SIGKILL")
      this.timers.push(
        setTimeout(() => {
          child.stdout.destroy()
          child.stderr.destroy()
          this.finish()
        }, CLOSE_WAIT_MS)
      )
    })
    child.on("close", () => {
      if (this.exit !== undefined && this.startError === undefined) this.finish()
    })
  }

  /** SIGTERM to the group, SIGKILL after `graceMs`. */
  private stop(graceMs: number) {
    const pid = this.child.pid
    if (pid === undefined) return
    signalGroup(pid, "SIGTERM")
    this.timers.push(setTimeout(() => signalGroup(pid, "SIGKILL"), graceMs))
  }

  private finish() {
    if (this.finished) return
    this.finished = true
    this.release()
    this.timers.forEach(clearTimeout)
    this.signal?.removeEventListener("abort", this.onAbort)
    this.done({
      exitCode: this.exit?.code ?? null,
      signal: this.exit?.signal ?? null,
      timedOut: this.timedOut,
      startError: this.startError,
      durationMs: Date.now() - this.started,
      stdout: this.out.text(),
      stderr: this.err.text(),
      outputBytes: this.out.total + this.err.total
    })
  }
}

/** Runs `cmd` to the end (or its limit); never rejects. Aborting `signal` kills the group at once. */
export const runInGroup = (cmd: GroupCommand, signal?: AbortSignal): Promise<GroupResult> =>
  new Promise((resolve) => void new GroupRun(cmd, signal, resolve))

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
