#!/usr/bin/env bash
# Builds the desktop app as a Debian package with the Tauri bundler (only the `deb` target: it
# downloads nothing at build time), with the `postern` CLI inside it (/usr/bin/postern), a
# .desktop entry and the icons. Prints the .deb's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ui.sh >/dev/null
cargo build --release --locked -q -p postern-cli
target=${CARGO_TARGET_DIR:-$PWD/target}
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
# The CLI goes in as a file of the package; its path depends on the target directory, so it is
# given here rather than in tauri.conf.json.
files=$(printf '{"bundle":{"linux":{"deb":{"files":{"/usr/bin/postern":"%s"}}}}}' "$target/release/postern")
(cd src-tauri && ../ui/node_modules/.bin/tauri build --bundles deb --ci --config "$files" >&2)
deb=$(ls -t "$target"/release/bundle/deb/*.deb | head -1)
echo "$deb"
