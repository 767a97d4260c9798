#!/usr/bin/env bash
# The randomized fault campaign (tests/chaos/chaos.py): the release `postern serve`, agents on the
# official Python and TypeScript MCP SDKs over both transports, a counting target with Idempotency-Key semantics,
# faults at the target and SIGKILL/SIGTERM of bridges, agents and the gateway at random instants;
# the no-duplicate invariants are checked after every schedule. Prints its seed; a failing seed
# replays the same schedules with --seed S (one of them with --only INDEX).
#
#   scripts/chaos.sh                      # the short campaign CI runs (50 schedules)
#   scripts/chaos.sh --schedules 1000     # the long one whose figures are in the README
#   scripts/chaos.sh --seed 42 --only 17  # replay one schedule
#   scripts/chaos.sh --process-fault crash_point --schedules 200  # one kind of fault in every schedule
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/clients.sh  # sets $py (the Python SDK venv) and $ts
# With the crash points of fault-test builds (inert unless FAILPOINTS arms one).
cargo build --release --locked -q -p postern-cli --features failpoints
bin="${CARGO_TARGET_DIR:-target}/release/postern"
bin=$(realpath "$bin")

home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
export XDG_DATA_HOME="$home/data" XDG_RUNTIME_DIR="$home/run"
mkdir -p "$XDG_DATA_HOME" "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
exec dbus-run-session -- bash -c '
  printf "%s" postern-chaos | gnome-keyring-daemon --unlock --components=secrets >/dev/null
  exec "$0" tests/chaos/chaos.py --postern "$1" "${@:2}"
' "$PWD/$py/.venv/bin/python" "$bin" "$@"
