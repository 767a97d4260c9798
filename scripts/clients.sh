#!/usr/bin/env bash
# Installs the official MCP SDK clients the tests, the fault campaign and the soak drive, pinned by
# tests/clients/python/requirements.txt and tests/clients/ts/package-lock.json (reinstalled only
# when a pin changes). Sourced by scripts/test.sh, scripts/chaos.sh and scripts/soak.sh.
py=tests/clients/python
if [ ! -x "$py/.venv/bin/python" ] || ! cmp -s "$py/requirements.txt" "$py/.venv/installed.txt"; then
  python3 -m venv "$py/.venv"
  "$py/.venv/bin/pip" install -q --disable-pip-version-check -r "$py/requirements.txt"
  cp "$py/requirements.txt" "$py/.venv/installed.txt"
fi
ts=tests/clients/ts
if [ ! -d "$ts/node_modules" ] || ! cmp -s "$ts/package-lock.json" "$ts/node_modules/.installed-lock.json"; then
  (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$ts/package-lock.json" "$ts/node_modules/.installed-lock.json"
fi
