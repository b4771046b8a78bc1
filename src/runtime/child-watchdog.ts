/**
 * The parent-death watchdog: children of this process (the embedded nats-server, harness
 * process groups) never outlive it, even when it is killed with SIGKILL.
 *
 * One small `sh` per process, started on first use in its own session (a signal to this
 * process's group does not reach it), reads its stdin, a pipe only this process holds open.
 * `guard(pid)` writes `add pid` (`add -pgid` for a group), its release `del pid`. When this process
 * dies, however it dies, the kernel closes the pipe: the watchdog reads end-of-file, sends
 * SIGTERM to every target still registered, then SIGKILL two seconds later, and exits. Killed
 * children are reparented and reaped by init; the live ones are reaped by this process. The
 * pipe and the watchdog are unref'd, so they never keep this process alive.
 */
import { spawn, type ChildProcess } from "node:child_process"

const SCRIPT = `
ids=""
while read -r op id; do
  case "$op" in
    add) ids="$ids $id" ;;
    del) kept=""; for i in $ids; do [ "$i" = "$id" ] || kept="$kept $i"; done; ids="$kept" ;;
  esac
done
[ -z "$ids" ] && exit 0
for i in $ids; do kill -s TERM -- "$i" 2>/dev/null; done
sleep 2
for i in $ids; do kill -s KILL -- "$i" 2>/dev/null; done
`

let watchdog: ChildProcess | undefined

const send = (line: string): void => {
  if (watchdog === undefined || watchdog.exitCode !== null || watchdog.signalCode !== null) {
    watchdog = spawn("/bin/sh", ["-c", SCRIPT], { detached: true, stdio: ["pipe", "ignore", "ignore"] })
    watchdog.on("error", () => undefined)
    watchdog.stdin!.on("error", () => undefined)
    watchdog.unref()
    ;(watchdog.stdin as unknown as { unref?: () => void }).unref?.()
  }
  watchdog.stdin!.write(`${line}\n`)
}

/** Kill target of a process (`pid`) or of its whole process group (`-pid`). */
const target = (pid: number, group: boolean) => String(group ? -pid : pid)

/** Registers `pid` (its group when `group`) to be killed when this process dies; returns the release. */
export const guard = (pid: number, group = false): (() => void) => {
  const t = target(pid, group)
  send(`add ${t}`)
  let released = false
  return () => {
    if (released) return
    released = true
    send(`del ${t}`)
  }
}

/** The watchdog's pid (for tests), or undefined before the first `guard`. */
export const watchdogPid = (): number | undefined => watchdog?.pid
