#!/usr/bin/env bash
# Prints the path of a nats-server binary for Gyre's embedded default, obtaining one if needed.
#
# Order: $GYRE_NATS_SERVER; .gyre/bin/nats-server (fetched earlier); a nats-server on PATH at
# version 2.10 or newer; else a newer Debian suite's package is downloaded with apt (a temporary
# sources list derived from this machine's own, suite renamed) and unpacked with dpkg-deb -x
# into .gyre/; else Debian bookworm's 2.9.10 is installed with a warning (Gyre runs on 2.9 but
# loses sync_interval, i.e. acknowledged is not yet fsynced).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gyre/bin/nats-server

version_of() { "$1" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p' | head -n1; }
new_enough() { # $1 = version string; true when >= 2.10
  local major minor
  IFS=. read -r major minor _ <<<"$1"
  [ -n "$major" ] && { [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "${minor:-0}" -ge 10 ]; }; }
}
use() { echo "$1"; exit 0; }

if [ -n "${GYRE_NATS_SERVER:-}" ] && [ -x "$GYRE_NATS_SERVER" ]; then use "$GYRE_NATS_SERVER"; fi
if [ -x "$dest" ]; then use "$(pwd)/$dest"; fi
if command -v nats-server >/dev/null 2>&1; then
  onpath=$(command -v nats-server)
  if new_enough "$(version_of "$onpath")"; then use "$onpath"; fi
fi

sudo_cmd=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo_cmd="sudo -n"; fi

fetch_newer() { # $1 = suite name (trixie, sid)
  local suite=$1 work sources
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/lists/partial" "$work/archives/partial"
  sources="$work/sources.list"
  # One-line entries from this machine's own apt configuration, suite renamed.
  {
    cat /etc/apt/sources.list 2>/dev/null || true
    for f in /etc/apt/sources.list.d/*.list; do [ -f "$f" ] && cat "$f"; done
  } | awk '$1=="deb" && $0 ~ /debian/ && $0 !~ /security/ {print}' > "$work/one-line"
  # deb822 (.sources) entries: URIs line of Debian stanzas that are not the security archive.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN{RS=""} /Suites:/ && !/security/ && /debian/ {
      for (i=1;i<=NF;i++) if ($i=="URIs:") print "deb [trusted=yes] " $(i+1) " SUITE main" }' "$f"
  done > "$work/deb822"
  awk -v s="$suite" '{ for (i=1;i<=NF;i++) if ($i ~ /^(bookworm|bullseye|trixie|sid|stable|testing|unstable)$/) $i=s; print }' \
    "$work/one-line" > "$sources"
  sed "s/SUITE/$suite/" "$work/deb822" >> "$sources"
  sed -i 's/^deb \(\[[^]]*\] \)\?/deb [trusted=yes] /' "$sources"
  [ -s "$sources" ] || return 1
  local opts=(-o "Dir::Etc::SourceList=$sources" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives"
    -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1")
  apt-get "${opts[@]}" -qq update >/dev/null 2>&1 || return 1
  (cd "$work" && apt-get "${opts[@]}" -qq download nats-server >/dev/null 2>&1) || return 1
  local deb
  deb=$(ls "$work"/nats-server_*.deb 2>/dev/null | head -n1)
  [ -n "$deb" ] || return 1
  dpkg-deb -x "$deb" "$work/root"
  mkdir -p "$(dirname "$dest")"
  local bin
  bin=$(find "$work/root" -type f -name nats-server -perm -u+x | head -n1)
  [ -n "$bin" ] || return 1
  cp "$bin" "$dest"
  "$dest" --version >/dev/null 2>&1 || { rm -f "$dest"; return 1; }
}

if command -v apt-get >/dev/null 2>&1; then
  for suite in trixie sid; do
    if fetch_newer "$suite"; then
      echo "nats-server: fetched $("$dest" --version) from Debian $suite into $dest" >&2
      use "$(pwd)/$dest"
    fi
  done
  if ! command -v nats-server >/dev/null 2>&1; then
    $sudo_cmd apt-get -qq update >/dev/null 2>&1 || true
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get -qq install -y nats-server >/dev/null 2>&1 || true
  fi
fi

if command -v nats-server >/dev/null 2>&1; then
  echo "nats-server: WARNING: using $(nats-server --version) from PATH; 2.10+ is recommended (sync_interval: always is unavailable)" >&2
  use "$(command -v nats-server)"
fi
echo "nats-server: not found and could not be installed; set GYRE_NATS_SERVER or install nats-server >= 2.10" >&2
exit 1
