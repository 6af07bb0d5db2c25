#!/usr/bin/env bash
# The third-party load generators' venv (tests/e2e/clients.txt), built once and kept under
# ~/.cache/pdbench (a fresh clone reuses it): prints its directory.
#   scripts/clients-venv.sh            build it if missing, print where it is
# PDBENCH_CLIENTS_VENV=DIR uses DIR instead. Exits 1 (pip's output on stderr) if it cannot.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
pins="$here/tests/e2e/clients.txt"
key="$(sha256sum "$pins" | cut -c1-12)"
venv="${PDBENCH_CLIENTS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pdbench/clients-$key}"
py="${PY:-python3}"
if [ ! -f "$venv/.installed" ]; then
  echo "clients venv: installing $(grep -v '^#' "$pins" | xargs) into $venv" >&2
  # built where it stays (a venv cannot move); finished only once .installed is there
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  # torch alone first: the others then find it satisfied
  "$venv/bin/python" -m pip install -q "$(grep '^torch==' "$pins")" >&2
  "$venv/bin/python" -m pip install -q -r "$pins" >&2
  "$venv/bin/aiperf" --version >/dev/null
  "$venv/bin/guidellm" --version >/dev/null
  touch "$venv/.installed"
fi
echo "$venv"
