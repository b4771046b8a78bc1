/**
 * The agent-cli suite's tasks and judgement, shared by its harness and scorer: a task id names
 * a file to create and the exact line it must hold (drawn from the id, FNV-1a), and a result is
 * judged by what the workspace holds afterwards.
 */
import * as fs from "node:fs"
import * as path from "node:path"

const FILES = ["greeting.txt", "answer.txt", "name.txt", "notes.txt", "todo.txt", "motto.txt", "hello.sh", "VERSION"]
const WORDS = ["hello", "world", "gyre", "agent", "oak", "river", "stone", "blue", "seven", "quiet", "lamp", "north", "apple", "cloud", "ember", "tide"]

/** FNV-1a of a string. */
const fnv = (s) => {
  let h = 0x811c9dc5
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0
  return h
}

/** The task `id`: the file to create, the line it must hold, and the prompt that asks for it. */
export const taskOf = (id) => {
  const h = fnv(id)
  const file = FILES[h % FILES.length]
  const line = `${WORDS[(h >>> 3) % WORDS.length]} ${WORDS[(h >>> 7) % WORDS.length]}`
  return { file, line, prompt: `Create the file ${file} in the working directory containing exactly this line: ${line}` }
}

/** Dice coefficient of two strings' character multisets, in [0, 1]. */
export const similarity = (a, b) => {
  if (a.length + b.length === 0) return 1
  const counts = new Map()
  for (const c of a) counts.set(c, (counts.get(c) ?? 0) + 1)
  let shared = 0
  for (const c of b) {
    const n = counts.get(c) ?? 0
    if (n > 0) {
      shared++
      counts.set(c, n - 1)
    }
  }
  return (2 * shared) / ([...a].length + [...b].length)
}

/**
 * The score of a workspace for task `id`: 1 when the file holds exactly the line (a trailing
 * newline allowed); 0.25 + 0.5 x similarity when the file exists with other content; when it
 * does not, 0.25 x the similarity of the model's replies in the last CLI run (`lastReply`) to the line.
 */
export const judge = (id, workspace, lastReply) => {
  const { file, line } = taskOf(id)
  const target = path.join(workspace, file)
  if (fs.existsSync(target) && fs.statSync(target).isFile()) {
    const content = fs.readFileSync(target, "utf8")
    if (content.replace(/\r?\n$/, "") === line) return { score: 1, file: "exact" }
    return { score: 0.25 + 0.5 * similarity(content, line), file: "differs" }
  }
  return { score: 0.25 * similarity(lastReply, line), file: "missing" }
}
