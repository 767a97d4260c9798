#!/usr/bin/env bash
# The soak (tests/chaos/soak.py): 64 agents on the official Python and TypeScript MCP SDKs, half over the bridge and
# half over Streamable HTTP, mixed traffic (reads, idempotent payments, irreversible wires, SSH on
# a real loopback sshd) against the release `postern serve` for 10 minutes; prints the gateway's
# RSS and fd series with their slopes, latency percentiles, and audit verify. On demand, not in CI.
#
#   scripts/soak.sh [--agents 64] [--minutes 10] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/clients.sh  # sets $py (the Python SDK venv) and $ts
# The same build as scripts/chaos.sh (crash points compiled in, inert): one binary at this path,
# so a soak never swaps the campaign's binary for one without crash points mid-run.
cargo build --release --locked -q -p postern-cli --features failpoints
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/postern")
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
export XDG_DATA_HOME="$home/data" XDG_RUNTIME_DIR="$home/run"
mkdir -p "$XDG_DATA_HOME" "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
exec dbus-run-session -- bash -c '
  printf "%s" postern-soak | gnome-keyring-daemon --unlock --components=secrets >/dev/null
  exec "$0" tests/chaos/soak.py --postern "$1" "${@:2}"
' "$PWD/$py/.venv/bin/python" "$bin" "$@"
