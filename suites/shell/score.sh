#!/usr/bin/env bash
# The shell suite's scorer: the fraction of the task's hidden tests that solution.sh passes.
# No solution.sh in the workspace: no artifact.
set -u
cd "$GYRE_WORKSPACE"
if [ ! -f solution.sh ]; then
  echo '{"score": 0, "no_artifact": true, "details": "no solution.sh"}'
  exit 0
fi
report=$(bash "$GYRE_SUITE_DIR/check.sh" "$GYRE_SUITE_DIR/hidden/$GYRE_TASK_ID")
read -r passed total <<< "$(tail -n 1 <<< "$report")"
[ "$total" -gt 0 ] || { echo "no hidden tests for $GYRE_TASK_ID" >&2; exit 1; }
score=$(node -e 'console.log(process.argv[1] / process.argv[2])' "$passed" "$total")
echo "{\"score\": $score, \"details\": {\"passed\": $passed, \"total\": $total}}"
