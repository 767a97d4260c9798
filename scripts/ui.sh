#!/usr/bin/env bash
# The desktop app's front end (ui/): install it from the committed lockfile, build it into
# ui/dist (which the Tauri shell embeds at compile time, so this runs before any cargo build of
# src-tauri), and with `test`, type-check it (svelte-check: an error or a warning fails) and run
# its component tests (vitest).
set -euo pipefail
cd "$(dirname "$0")/../ui"
if [ ! -d node_modules ] || ! cmp -s package-lock.json node_modules/.installed-lock.json; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.installed-lock.json
fi
npx vite build --logLevel warn
if [ "${1:-}" = test ]; then
  npx svelte-check --tsconfig ./tsconfig.json --fail-on-warnings --output machine
  npx vitest run
fi
