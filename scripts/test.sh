#!/usr/bin/env bash
# Runs every test. The SSH channel's tests start their own OpenSSH sshd on 127.0.0.1 (installed
# here if missing; installing openssh-server does not start the system's). The vault's tests use
# the real OS keychain, so on Linux this starts a private D-Bus session with an unlocked
# gnome-keyring (Secret Service) around the test run, in a throwaway XDG data directory; nothing
# touches the desktop's own keyring.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v dbus-run-session >/dev/null || need+=(dbus)
command -v gnome-keyring-daemon >/dev/null || need+=(gnome-keyring)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
# The desktop app: WebKitGTK and friends to build it, Xvfb and WebKitWebDriver to drive it.
pkg-config --exists webkit2gtk-4.1 2>/dev/null || need+=(libwebkit2gtk-4.1-dev libgtk-3-dev libayatana-appindicator3-dev librsvg2-dev libxdo-dev libssl-dev pkg-config)
command -v Xvfb >/dev/null || need+=(xvfb)
command -v WebKitWebDriver >/dev/null || need+=(webkit2gtk-driver)
# Notifications as a desktop shows them (dunst, watched with dbus-monitor), the X focus (xdotool)
# and a screenshot of the whole screen (ImageMagick's import), for the desktop E2E.
command -v dunst >/dev/null || need+=(dunst)
command -v dbus-monitor >/dev/null || need+=(dbus-bin)
command -v xdotool >/dev/null || need+=(xdotool)
command -v import >/dev/null || need+=(imagemagick)
if ((${#need[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh needs: ${need[*]} (sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
if ! command -v tauri-driver >/dev/null; then
  cargo install tauri-driver --version '^2' --locked
fi

# The official MCP SDKs the gateway's end-to-end tests drive, pinned by
# tests/clients/python/requirements.txt and tests/clients/ts/package-lock.json.
source scripts/clients.sh  # sets $py (the Python SDK venv) and $ts

# The desktop app's front end: built (the app embeds it) and its component tests run.
bash scripts/ui.sh test

keyring_home=$(mktemp -d)
trap 'rm -rf "$keyring_home"' EXIT
export XDG_DATA_HOME="$keyring_home/data" XDG_RUNTIME_DIR="$keyring_home/run"
mkdir -p "$XDG_DATA_HOME" "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

# The keyring password only protects this throwaway keyring.
exec dbus-run-session -- bash -c '
  printf "%s" postern-test-keyring | gnome-keyring-daemon --unlock --components=secrets >/dev/null
  exec cargo nextest run --workspace --locked --no-fail-fast --features postern-cli/failpoints "$@"
' test-session "$@"
