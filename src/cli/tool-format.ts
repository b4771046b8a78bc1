/**
 * `--tool-format` (serve, train, demo): how the served model writes tool calls, where its
 * checkpoint's chat template leaves it open (Gyre's template, or a template that renders no
 * calls). A template that renders calls fixes the format; a flag that disagrees with it is a
 * usage error, since the parser must read what the template writes.
 */
import { type ChatFormat } from "../openai/chat.ts"
import { ToolFormatMismatch, chatFormatOf } from "../openai/hf-chat.ts"
import { TOOL_FORMATS, type ToolFormatName } from "../openai/tool-formats.ts"
import { UsageError } from "./args.ts"

export const toolFormatFlag = {
  kind: "string",
  doc: "tool-call format of the model (default: the one its chat template renders, else hermes): hermes <tool_call>{json}</tool_call>, qwen3-coder <tool_call><function=...>, llama3-json {\"name\", \"parameters\"}, mistral [TOOL_CALLS][...]",
  choices: TOOL_FORMATS
} as const

/** A tool format's name from a flag or a journaled configuration (a name it does not know is a usage error). */
export const toolFormatName = (command: string, value: string | undefined): ToolFormatName | undefined => {
  if (value === undefined) return undefined
  if (!(TOOL_FORMATS as ReadonlyArray<string>).includes(value)) throw new UsageError(`gyre ${command}: --tool-format must be one of ${TOOL_FORMATS.join("|")}, got ${value}`)
  return value as ToolFormatName
}

/** The checkpoint's chat format with `--tool-format`; a format its template does not render is a usage error. */
export const chatFormatFor = async (command: string, checkpoint: string, toolFormat: string | undefined): Promise<ChatFormat> => {
  try {
    return await chatFormatOf(checkpoint, toolFormatName(command, toolFormat))
  } catch (e) {
    if (e instanceof ToolFormatMismatch) throw new UsageError(`gyre ${command}: --tool-format ${e.asked}: ${e.message}`)
    throw e
  }
}
