#!/usr/bin/env bash
# Gives /usr/bin/python3 a torch for the engine's PyTorch agreement test (test/engine/torch.test.ts):
# installs Debian's python3-torch and libopenblas0-pthread (the threaded OpenBLAS Debian's torch
# is fast with) when missing. Only as root with apt-get (`apt-get update` once, then
# `apt-get install -y --no-install-recommends`, output kept in a temporary log); otherwise, or
# when the install fails, it warns and exits 0, and the test reports itself skipped with the reason.
set -uo pipefail

packages=(python3-torch libopenblas0-pthread)
missing=()
if command -v dpkg-query >/dev/null; then
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
elif ! /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then
  missing=("${packages[@]}")
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "bootstrap: warning: ${missing[*]} missing (needs root and apt-get to install); the PyTorch agreement test will be skipped" >&2
  exit 0
fi
echo "bootstrap: installing ${missing[*]} with apt-get for the PyTorch agreement test" >&2
log=$(mktemp "${TMPDIR:-/tmp}/gyre-python-torch.XXXXXX")
if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 5 "$log" >&2
  echo "bootstrap: warning: could not install ${missing[*]} (see $log); the PyTorch agreement test will be skipped" >&2
else
  rm -f "$log"
fi
exit 0
