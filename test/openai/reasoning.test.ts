/**
 * Reasoning text (`src/openai/reasoning.ts`) and the turns a harness sends back
 * (`src/openai/turns.ts`): `<think>` split from the content as templates do, held back while
 * it may still close; a turn found again by any of its call ids, or by its content without
 * reasoning, however the harness carries the reasoning.
 */
import { describe, expect, it } from "vitest"
import type { ChatMessage } from "../../src/openai/messages.ts"
import { endsInReasoning, splitReasoning, withoutReasoning } from "../../src/openai/reasoning.ts"
import { AssistantTurns } from "../../src/openai/turns.ts"

const final = { final: true }

describe("reasoning", () => {
  it("splits a turn's leading <think> block from its content, newlines around it dropped", () => {
    expect(splitReasoning("<think>\nplan\nmore\n</think>\n\nanswer", final)).toEqual({ reasoning: "plan\nmore", content: "answer" })
    expect(splitReasoning("  <think>plan</think>answer", final)).toEqual({ reasoning: "plan", content: "answer" })
    expect(splitReasoning("answer <think>not reasoning</think>", final)).toEqual({ reasoning: "", content: "answer <think>not reasoning</think>" })
    // cut off before </think>: all reasoning
    expect(splitReasoning("<think>\nplan", final)).toEqual({ reasoning: "plan", content: "" })
    // the prompt opened <think>: the turn starts inside it
    expect(splitReasoning("plan\n</think>\n\nanswer", { final: true, open: true })).toEqual({ reasoning: "plan", content: "answer" })
    expect(endsInReasoning("<|im_start|>assistant\n<think>\n")).toBe(true)
    expect(endsInReasoning("<think>\n\n</think>\n\n")).toBe(false)
  })

  it("while generating, holds back what may still become the start of reasoning or its end", () => {
    const text = "  <think>\nthe plan </ok\n</think>\n\nthe answer"
    const whole = splitReasoning(text, final)
    let previous = { reasoning: "", content: "" }
    for (let n = 0; n <= text.length; n++) {
      const part = splitReasoning(text.slice(0, n), { final: false })
      expect(whole.reasoning.startsWith(part.reasoning) && whole.content.startsWith(part.content)).toBe(true)
      expect(part.reasoning.startsWith(previous.reasoning) && part.content.startsWith(previous.content)).toBe(true)
      previous = part
    }
    expect(splitReasoning("  <thi", { final: false })).toEqual({ reasoning: "", content: "" })
    expect(splitReasoning("<think>plan</thi", { final: false })).toEqual({ reasoning: "plan", content: "" })
  })

  it("strips inline reasoning from a message's text", () => {
    expect(withoutReasoning("<think>plan</think>\n answer \n")).toBe("answer")
    expect(withoutReasoning("plan</think>answer")).toBe("answer") // the opening tag was in the prompt
    expect(withoutReasoning("answer")).toBe("answer")
  })
})

describe("assistant turns sent back", () => {
  const turns = new AssistantTurns()
  const callTurn = Int32Array.from([1, 2, 3])
  const plainTurn = Int32Array.from([4, 5])
  turns.remember(callTurn, ["call_a", "call_b"], "")
  turns.remember(plainTurn, [], "the answer")
  const call = (id: string, args = "{}") => ({ id, type: "function" as const, function: { name: "f", arguments: args } })
  const assistant = (fields: Partial<Extract<ChatMessage, { role: "assistant" }>>): Extract<ChatMessage, { role: "assistant" }> => ({ role: "assistant", ...fields })

  it("are found by their call ids: re-serialised, reordered, some dropped, reasoning anywhere", () => {
    expect(turns.lookup(assistant({ tool_calls: [call("call_a", '{"x": 1}'), call("call_b")] }))).toBe(callTurn)
    expect(turns.lookup(assistant({ tool_calls: [call("call_b"), call("call_a", '{\n  "x" : 1\n}')] }))).toBe(callTurn)
    expect(turns.lookup(assistant({ tool_calls: [call("call_b")], reasoning_content: "plan", content: "<think>x</think>" }))).toBe(callTurn)
    // a call this gateway did not make: not its turn
    expect(turns.lookup(assistant({ tool_calls: [call("call_a"), call("call_z")] }))).toBeUndefined()
    expect(turns.lookup(assistant({ tool_calls: [call("call_z")], content: "the answer" }))).toBeUndefined()
  })

  it("are found by their content without reasoning, trimmed", () => {
    for (const content of ["the answer", "  the answer\n", "<think>plan</think>\nthe answer", "plan</think>the answer"]) {
      expect(turns.lookup(assistant({ content })), content).toBe(plainTurn)
    }
    expect(turns.lookup(assistant({ content: [{ type: "text", text: "the " }, { type: "text", text: "answer" }], reasoning_content: "plan" }))).toBe(plainTurn)
    expect(turns.lookup(assistant({ content: "another answer" }))).toBeUndefined()
    // the call turn without its calls (a harness that dropped them): its empty content
    expect(turns.lookup(assistant({ content: null }))).toBe(callTurn)
  })
})
