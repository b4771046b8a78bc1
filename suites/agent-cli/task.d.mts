/** Types of task.mjs (the agent-cli suite's tasks and judgement) for the TypeScript tests. */
export interface AgentCliTask {
  readonly file: string
  readonly line: string
  readonly prompt: string
}
export declare const taskOf: (id: string) => AgentCliTask
export declare const similarity: (a: string, b: string) => number
export declare const judge: (id: string, workspace: string, lastReply: string) => { readonly score: number; readonly file: "exact" | "differs" | "missing" }
