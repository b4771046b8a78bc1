/** Types of `world.mjs` for TypeScript callers (tests, the benchmark). */
export interface LongMessage {
  readonly role: "system" | "user" | "assistant" | "tool"
  readonly content: string
  readonly tool_call_id?: string
}
export interface LongConfig {
  readonly scale: number
  readonly calls: number
  readonly systemTokens: number
  readonly toolTokens: number
  readonly outputTokens: number
  readonly window: number
  readonly compactAt: number
  readonly retries: number
  readonly back: number
  readonly subagents: number
  readonly subCalls: number
  readonly temperature: number
  readonly ignoreEos: boolean
  readonly model: string
  readonly policy: "model" | "oracle"
}
/** One model call of the script: its decision id, role, the reply it expects, and whether it starts a new history. */
export interface LongCall {
  readonly id: string
  readonly role: "main" | "main-summary" | "subagent" | "subagent-summary"
  readonly expected: string
  readonly fresh: boolean
}
export interface LongStats {
  readonly calls: number
  readonly main: number
  readonly retries: number
  readonly subagents: number
  readonly subagentCalls: number
  readonly compactions: number
}
export declare const MESSAGE_OVERHEAD: number
export declare const modules: ReadonlyArray<string>
export declare const kinds: ReadonlyArray<{ readonly tool: string; readonly verb: string; readonly last: (module: string) => string }>
export declare const configFrom: (env: Readonly<Record<string, string | undefined>>) => LongConfig
export declare const maxObservation: (cfg: LongConfig) => number
export declare const quote: (reply: string, cfg: LongConfig) => string
export declare const systemPromptOf: (taskId: string, cfg: LongConfig) => string
export declare const compactRequest: (module: string) => string
export declare const reportRequest: (module: string) => string
export declare const seedOf: (text: string) => number
export declare const generator: (seed: number) => () => number
export declare const runScript: (taskId: string, cfg: LongConfig, ask: (messages: ReadonlyArray<LongMessage>, call: LongCall) => Promise<string>) => Promise<LongStats>
export declare const expectedReplies: (taskId: string, cfg: LongConfig) => Promise<Map<string, string>>
export declare const creditOf: (reply: string, expected: string) => number
export declare const oracleReply: (messages: ReadonlyArray<LongMessage>) => string
