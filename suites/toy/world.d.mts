/** Types of `world.mjs` for TypeScript callers (tests, the warm start). */
export interface ToyMessage {
  readonly role: "system" | "user" | "assistant" | "tool"
  readonly content: string
  readonly tool_call_id?: string
}
export interface ToyConfig {
  readonly steps: number
  readonly forkEvery: number
  readonly subSteps: number
  readonly itemRate: number
  readonly compactBytes: number
  readonly failRate: number
  readonly maxRetries: number
  readonly toolMs: number
  readonly toolSigma: number
  readonly tailAlpha: number
  readonly temperature: number
  readonly maxTokens: number
  readonly model: string
  readonly policy: "model" | "oracle"
  readonly demos: string | undefined
  readonly randomSeed: number | undefined
}
export interface ToyStep {
  readonly text: string
  readonly reply: string
  readonly sub?: ReadonlyArray<ToyStep>
}
export declare const configFrom: (env: Readonly<Record<string, string | undefined>>) => ToyConfig
export declare const systemPrompt: string
export declare const compactRequest: string
export declare const generator: (seed: number) => () => number
export declare const executionSeed: (seed: string, execution: string) => number
export declare const seedOf: (text: string) => number
export declare const scriptOf: (taskId: string, cfg: ToyConfig) => ReadonlyArray<ToyStep>
export declare const expectedReplies: (script: ReadonlyArray<ToyStep>) => Map<string, string>
export declare const creditOf: (reply: string, expected: string) => number
export declare const wellFormed: (reply: string) => boolean
export declare const oracleReply: (messages: ReadonlyArray<ToyMessage>) => string
export declare const latencySampler: (rand: () => number, cfg: ToyConfig) => { readonly slowness: number; readonly next: () => number }
