#!/usr/bin/env bash
# The shell suite's harness: a coding agent in bash. It shows the model TASK.md, writes the
# reply's code block to solution.sh, runs the visible tests (check.sh tests) and sends the
# results back, for up to SHELL_TURNS turns or until they pass. HTTP with curl; JSON with
# `node -e` (jq is not on a fresh Debian machine; the runner puts its node on PATH).
set -euo pipefail
cd "$GYRE_WORKSPACE"
turns=${SHELL_TURNS:-3}
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT

# json <script> [args...]: runs a small node program over the state files.
json() { local js=$1; shift; node -e "const fs = require('fs'); const st = process.argv[1]; $js" "$state" "$@"; }

printf '%s' "You write bash scripts. Reply with the complete solution.sh in one \`\`\`bash code block." > "$state/system"
json 'fs.writeFileSync(st + "/messages.json", JSON.stringify([{ role: "system", content: fs.readFileSync(st + "/system", "utf8") }]))'
add() { # add <role> <file with the content>
  json 'const m = JSON.parse(fs.readFileSync(st + "/messages.json")); m.push({ role: process.argv[2], content: fs.readFileSync(process.argv[3], "utf8") }); fs.writeFileSync(st + "/messages.json", JSON.stringify(m))' "$1" "$2"
}
cp TASK.md "$state/prompt"
add user "$state/prompt"

for turn in $(seq 1 "$turns"); do
  json 'fs.writeFileSync(st + "/request.json", JSON.stringify({ model: process.env.SHELL_MODEL || "gyre", messages: JSON.parse(fs.readFileSync(st + "/messages.json")), max_tokens: Number(process.env.SHELL_MAX_TOKENS || 256), temperature: Number(process.env.SHELL_TEMPERATURE || 1) }))'
  curl -sS --fail-with-body --retry 3 -X POST "${OPENAI_BASE_URL%/}/chat/completions" \
    -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" -H "X-Gyre-Role: main" \
    --data-binary "@$state/request.json" -o "$state/response.json"
  json 'fs.writeFileSync(st + "/reply", JSON.parse(fs.readFileSync(st + "/response.json")).choices[0].message.content ?? "")'
  # The code is the reply's first fenced block, or the whole reply without one.
  json 'const r = fs.readFileSync(st + "/reply", "utf8"); const m = /```[a-z]*\n([\s\S]*?)```/.exec(r); fs.writeFileSync("solution.sh", m ? m[1] : r)'
  add assistant "$state/reply"
  bash "$GYRE_SUITE_DIR/check.sh" tests > "$state/results" || true
  read -r passed total <<< "$(tail -n 1 "$state/results")"
  echo "turn $turn: $passed/$total visible tests pass"
  [ "$passed" = "$total" ] && break
  { echo "Test results:"; head -c 2000 "$state/results"; echo "Fix solution.sh."; } > "$state/feedback"
  add user "$state/feedback"
done
