#!/usr/bin/env bash
# Runs ./solution.sh on every <case>.in of directory $1 (5 s each) and compares its stdout
# with <case>.out. Prints one line per case ("pass 1" or "fail 1: expected ... got ...") and
# last "<passed> <total>". Used by the harness (visible tests) and the scorer (hidden tests).
set -u
dir=$1
passed=0
total=0
for input in "$dir"/*.in; do
  [ -e "$input" ] || continue
  name=$(basename "$input" .in)
  total=$((total + 1))
  got=$(timeout 5 bash ./solution.sh < "$input" 2>/dev/null | head -c 4096; printf x)
  want=$(cat "$dir/$name.out"; printf x)
  if [ "$got" = "$want" ]; then
    passed=$((passed + 1))
    echo "pass $name"
  else
    printf 'fail %s: input %q expected %q got %q\n' "$name" "$(cat "$input")" "${want%x}" "${got%x}"
  fi
done
echo "$passed $total"
