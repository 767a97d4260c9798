#!/usr/bin/env bash
# The two ways to install Postern, checked the way the README's Install section tells a newcomer
# to use them, on this (fresh Debian) machine:
#  1. `cargo install --locked --path crates/postern-cli` into a throwaway root; `postern --version`
#     and the smoke run (serve, an agent's initialize and tools/list, SIGTERM, audit verify)
#     against the installed binary.
#  2. The desktop app's .deb (scripts/package.sh): `dpkg -i`; the menu entry, icons and both
#     binaries in place; the app started from its menu entry's Exec line under Xvfb, in a D-Bus
#     session with an unlocked keyring; its window up and its gateway answering `tools/list`
#     through the installed `postern mcp`; then `dpkg -r`.
# Needs root for dpkg (CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n--> %s\n' "$*"; }

root=$(mktemp -d)
work=$(mktemp -d)
cleanup() {
  [ -n "${app_pid:-}" ] && kill "$app_pid" 2>/dev/null || true
  [ -n "${x_pid:-}" ] && kill "$x_pid" 2>/dev/null || true
  rm -rf "$root" "$work"
}
trap cleanup EXIT

step "cargo install --locked --path crates/postern-cli (into a throwaway root)"
cargo install --locked --quiet --path crates/postern-cli --root "$root" --target-dir "${CARGO_TARGET_DIR:-target}"
"$root/bin/postern" --version
POSTERN_BIN="$root/bin/postern" bash scripts/smoke.sh >/dev/null
echo "the installed postern serves an agent"

step "the .deb (Tauri bundler)"
deb=$(bash scripts/package.sh | tail -1)
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Depends\):/\1:/p'
package=$(dpkg-deb --field "$deb" Package)
dpkg -i "$deb" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -f -y -qq >/dev/null
dpkg -s "$package" >/dev/null
trap 'dpkg -r "$package" >/dev/null 2>&1 || true; cleanup' EXIT
desktop=$(dpkg -L "$package" | grep '^/usr/share/applications/.*\.desktop$' | head -1)
[ -n "$desktop" ] || { echo "no .desktop entry in $package" >&2; exit 1; }
dpkg -L "$package" | grep -q '^/usr/share/icons/hicolor/.*\.png$' || { echo "no icons in $package" >&2; exit 1; }
[ -x /usr/bin/postern ] || { echo "no /usr/bin/postern in $package" >&2; exit 1; }
/usr/bin/postern --version
exec_line=$(sed -n 's/^Exec=//p' "$desktop" | head -1 | sed 's/ %[a-zA-Z]//g')
echo "menu entry $desktop: Exec=$exec_line"

step "the installed app, started from its menu entry, under Xvfb"
n=$(for i in $(seq 120 199); do [ -e "/tmp/.X$i-lock" ] || { echo "$i"; break; }; done)
Xvfb ":$n" -screen 0 1280x900x24 -nolisten tcp >/dev/null 2>&1 &
x_pid=$!
for _ in $(seq 100); do [ -e "/tmp/.X11-unix/X$n" ] && break; sleep 0.1; done
export DISPLAY=":$n" XDG_DATA_HOME="$work/data" XDG_CONFIG_HOME="$work/config" XDG_RUNTIME_DIR="$work/run"
export WEBKIT_DISABLE_DMABUF_RENDERER=1 POSTERN_PORT=0
mkdir -p "$XDG_DATA_HOME" "$XDG_CONFIG_HOME" && mkdir -m 700 -p "$XDG_RUNTIME_DIR"
dbus-run-session -- bash -c '
  set -euo pipefail
  printf "%s" postern-install | gnome-keyring-daemon --unlock --components=secrets >/dev/null
  sh -c "$0" >"$XDG_RUNTIME_DIR/app.log" 2>&1 &
  app=$!
  for _ in $(seq 300); do
    /usr/bin/postern status 2>/dev/null | grep -q "^gateway     running" && break
    kill -0 "$app" 2>/dev/null || { cat "$XDG_RUNTIME_DIR/app.log"; echo "the app exited" >&2; exit 1; }
    sleep 0.2
  done
  /usr/bin/postern status | grep "^gateway"
  for _ in $(seq 100); do xdotool search --onlyvisible --name "^Postern\$" >/dev/null 2>&1 && break; sleep 0.2; done
  xdotool search --onlyvisible --name "^Postern\$" >/dev/null || { echo "no Postern window" >&2; exit 1; }
  echo "its window is up"
  answer=$(printf "%s\n%s\n%s\n" \
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"install-check\",\"version\":\"1\"}}}" \
    "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}" \
    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}" | /usr/bin/postern mcp)
  echo "$answer" | grep -q "\"http_request\"" || { echo "no tools/list answer: $answer" >&2; exit 1; }
  echo "its gateway answers tools/list through the installed postern mcp"
  kill -TERM "$app"
  wait "$app" || true
' "$exec_line"

step "dpkg -r $package"
dpkg -r "$package" >/dev/null
[ ! -e /usr/bin/postern ] && [ ! -e "$desktop" ] || { echo "dpkg -r left files behind" >&2; exit 1; }
echo "removed"
