#!/usr/bin/env bash
# Gives /usr/bin/python3 a torch for the engine's PyTorch agreement test (test/engine/torch.test.ts):
# Debian's python3-torch and libopenblas0-pthread (the threaded OpenBLAS Debian's torch is fast
# with), installed when missing by scripts/apt-packages.sh (as root with apt-get; otherwise it
# warns and the test reports itself skipped with the reason).
set -uo pipefail
if ! command -v dpkg-query >/dev/null && /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then exit 0; fi
exec bash "$(dirname "$0")/apt-packages.sh" "the PyTorch agreement test" python3-torch libopenblas0-pthread
