#!/usr/bin/env bash
# Smoke test of the README's run command: `postern serve` on a fresh data directory (inside a
# private D-Bus session with an unlocked gnome-keyring, as on a desktop), then an agent's
# `initialize` and `tools/list` through `postern mcp`, then SIGTERM and `audit verify`.
set -euo pipefail
cd "$(dirname "$0")/.."
# POSTERN_BIN: an installed postern to check instead of this checkout's debug build.
if [ -z "${POSTERN_BIN:-}" ]; then
  cargo build --locked -q -p postern-cli
fi
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
export XDG_DATA_HOME="$home/data" XDG_CONFIG_HOME="$home/config" XDG_RUNTIME_DIR="$home/run"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
exec dbus-run-session -- bash -c '
  set -euo pipefail
  printf "%s" postern-smoke | gnome-keyring-daemon --unlock --components=secrets >/dev/null
  bin=target/debug/postern
  [ -n "${CARGO_TARGET_DIR:-}" ] && bin="$CARGO_TARGET_DIR/debug/postern"
  [ -n "${POSTERN_BIN:-}" ] && bin="$POSTERN_BIN"
  "$bin" serve --port 0 2>"$XDG_RUNTIME_DIR/serve.log" &
  pid=$!
  for _ in $(seq 100); do grep -q "gateway ready" "$XDG_RUNTIME_DIR/serve.log" && break; sleep 0.1; done
  cat "$XDG_RUNTIME_DIR/serve.log"
  answer=$(printf "%s\n%s\n%s\n" \
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"smoke\",\"version\":\"1\"}}}" \
    "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}" \
    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}" | "$bin" mcp)
  echo "$answer"
  echo "$answer" | grep -q "\"name\":\"postern\"" || { echo "no initialize answer" >&2; exit 1; }
  echo "$answer" | grep -q "\"execution_status\"" || { echo "no tools/list answer" >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid"
  "$bin" audit verify
'
