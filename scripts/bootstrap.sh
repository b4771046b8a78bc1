#!/usr/bin/env bash
# Installs what Gyre needs on a fresh machine, each step only when missing or stale:
#   1. npm packages (npm ci, when node_modules is absent or older than package-lock.json)
#   2. a nats-server >= 2.10 (scripts/nats-server.sh)
#   3. the native engine library (make -C native; make skips it when up to date)
#   4. torch for /usr/bin/python3, used by the engine's PyTorch agreement test
#      (scripts/python-torch.sh: Debian packages as root, else a warning)
#   5. Debian's chromium at /usr/bin/chromium, which the report test drives headless through
#      playwright-core (scripts/apt-packages.sh; never a downloaded browser), and openssl, with
#      which the TLS test makes its certificates
# Called by `npm test`, `npm run demo` and the benches, so the README's two commands work
# on a machine that has only Node and npm. `--run-only` (the demo's) stops after step 3: what a
# run needs, without the tests' torch, Chromium and openssl.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "bootstrap: installing npm packages (npm ci)" >&2
  npm ci --no-audit --no-fund >&2
fi

bash scripts/nats-server.sh >/dev/null

if [ -f native/Makefile ]; then
  make -s -C native >&2
fi

if [ "${1:-}" = "--run-only" ]; then
  exit 0
elif [ -n "${1:-}" ]; then
  echo "bootstrap: unknown argument '$1' (expected --run-only or nothing)" >&2
  exit 2
fi

bash scripts/python-torch.sh

bash scripts/apt-packages.sh "the report test in headless Chromium (test/report)" chromium
bash scripts/apt-packages.sh "the TLS test's certificates (test/security/tls.test.ts)" openssl
