#!/usr/bin/env bash
# Installs Debian packages when missing: `bash scripts/apt-packages.sh "WHAT NEEDS THEM" pkg...`.
# Only as root with apt-get (`apt-get update` once, then `apt-get install -y --no-install-recommends`,
# output kept in a temporary log); otherwise, or when the install fails, it warns (naming what will
# be skipped) and exits 0. Used by the bootstrap for torch (scripts/python-torch.sh) and for the
# Chromium the report test drives.
set -uo pipefail

purpose=$1
shift
packages=("$@")
missing=()
if command -v dpkg-query >/dev/null; then
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
else
  missing=("${packages[@]}")
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "bootstrap: warning: ${missing[*]} missing (needs root and apt-get to install); $purpose will be skipped" >&2
  exit 0
fi
echo "bootstrap: installing ${missing[*]} with apt-get for $purpose" >&2
log=$(mktemp "${TMPDIR:-/tmp}/gyre-apt.XXXXXX")
if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 5 "$log" >&2
  echo "bootstrap: warning: could not install ${missing[*]} (see $log); $purpose will be skipped" >&2
else
  rm -f "$log"
fi
exit 0
