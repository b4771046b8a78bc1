/**
 * One line for an error, for logs and the CLI's last word: its message, or for a tagged error
 * without one (the runtime's carry fields, not messages) its tag and fields as JSON.
 */
export const errorLine = (error: unknown): string => {
  if (!(error instanceof Error)) return String(error)
  if (error.message !== "") return error.message
  const tag = (error as { readonly _tag?: unknown })._tag
  return typeof tag === "string" ? `${tag} ${JSON.stringify(error)}` : error.name
}
