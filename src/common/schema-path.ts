/**
 * Where in a document a Schema issue is: `["tasks", 2, "split"]` becomes `tasks[2].split`,
 * the form every error message of Gyre uses to name a field.
 */
export const fieldPath = (at: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> = []): string =>
  at
    .map((p) => (typeof p === "object" ? p.key : p))
    .reduce<string>((s, k) => (typeof k === "number" ? `${s}[${k}]` : s === "" ? String(k) : `${s}.${String(k)}`), "")
