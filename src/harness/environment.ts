/**
 * What a harness or scorer process inherits: only `INHERITED` of the runner's environment (no
 * NATS credentials, no runner settings), with the runner's own node first on PATH; the
 * variables that point a harness's model clients at the gateway (`gatewayEnv`); and the
 * variables a request may not set (`FORBIDDEN_ENV`: dynamic loaders, shell and interpreter
 * start-up, credentials, the runner's own), which the runner refuses with `ForbiddenEnvironment`.
 */
import * as path from "node:path"

/** Environment variables a harness or scorer inherits from the runner. */
const INHERITED = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SHELL", "TERM"]

/** Variables a request may not set: dynamic loaders, shell and interpreter start-up, credentials, the runner's own. */
export const FORBIDDEN_ENV =
  /^(LD_.*|DYLD_.*|BASH_ENV|ENV|BASH_FUNC_.*|SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|IFS|NODE_OPTIONS|NODE_PATH|NODE_EXTRA_CA_CERTS|PYTHONSTARTUP|PYTHONPATH|PYTHONHOME|PERL5OPT|PERL5LIB|RUBYOPT|RUBYLIB|JAVA_TOOL_OPTIONS|GIT_.*|NATS_.*|GYRE_.*|OPENAI_.*|ANTHROPIC_.*|PATH|HOME)$/

/** The environment every harness and scorer starts from. */
export const baseEnv = (): Record<string, string> => {
  const env: Record<string, string> = {}
  for (const name of INHERITED) if (process.env[name] !== undefined) env[name] = process.env[name]!
  // The runner's own node is on PATH, so suites can use `node` for scripts and JSON.
  env.PATH = [path.dirname(process.execPath), env.PATH].filter((p) => p !== undefined && p !== "").join(":")
  return env
}

/** The gateway's base URL as Anthropic's clients take it: without the trailing `/v1`. */
export const anthropicBaseUrl = (baseUrl: string) => baseUrl.replace(/\/v1\/?$/, "")

/**
 * The variables that point a harness's model clients at the gateway with the execution's key:
 * OpenAI's (`OPENAI_BASE_URL` ends in `/v1`, as the OpenAI SDK and Responses-API CLIs expect)
 * and Anthropic's (`ANTHROPIC_BASE_URL` without it: the Anthropic SDK and Messages-API CLIs
 * append `/v1/messages`; the key both as `ANTHROPIC_API_KEY`, sent as `x-api-key`, and as
 * `ANTHROPIC_AUTH_TOKEN`, sent as `Authorization: Bearer`).
 */
export const gatewayEnv = (baseUrl: string, key: string): Record<string, string> => ({
  OPENAI_BASE_URL: baseUrl,
  OPENAI_API_KEY: key,
  ANTHROPIC_BASE_URL: anthropicBaseUrl(baseUrl),
  ANTHROPIC_API_KEY: key,
  ANTHROPIC_AUTH_TOKEN: key
})
