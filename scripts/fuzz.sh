#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer through cargo-fuzz, on the stable toolchain with
# --sanitizer none) of every parser that takes outside input. On demand, not in CI:
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET…]
# The corpora are committed as fuzz/corpus.tar.xz (minimised with `cargo fuzz cmin`; one file
# instead of ~16,000) and unpacked into fuzz/corpus/<target> on first use; a run adds what it
# finds there. To keep new finds: `bash scripts/fuzz.sh --save` minimises and repacks them.
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the run — turn it into a
# regression test beside the code it broke (and a named input in the corpus). Prints
# executions per target.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
all=(canonical action_record manifest marker binding jsonrpc_framing terminal_answer resume_token)
[ -d fuzz/corpus ] || tar -C fuzz -xJf fuzz/corpus.tar.xz
if [ "${1:-}" = --save ]; then
  for t in "${all[@]}"; do cargo fuzz cmin --sanitizer none -O -a "$t" "fuzz/corpus/$t" >/dev/null 2>&1 || exit 1; done
  tar -C fuzz -cJf fuzz/corpus.tar.xz corpus && echo "fuzz/corpus.tar.xz: $(ls fuzz/corpus/* | wc -l) inputs"
  exit 0
fi
seconds="${1:-60}"; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
cargo fuzz build --sanitizer none -O -a >/dev/null || exit 1
total=0; failed=0
for t in "${targets[@]}"; do
  log=$(mktemp)
  mkdir -p "fuzz/corpus/$t"
  if cargo fuzz run --sanitizer none -O -a "$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" -max_len=4096 -timeout=10 >"$log" 2>&1; then
    status=ok
  else
    status=CRASH; failed=$((failed + 1))
  fi
  # libFuzzer's last status line (#N …) counts the executions, crash or not.
  execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  execs=${execs:-0}; total=$((total + execs))
  printf '%-16s %-6s %12s execs in %ss, corpus %s inputs\n' "$t" "$status" "$execs" "$seconds" "$(ls "fuzz/corpus/$t" | wc -l)"
  [ "$status" = ok ] || grep -E 'panicked|Test unit written|SUMMARY' "$log" | head -5
  rm -f "$log"
done
echo "total: $total executions, $failed target(s) crashed"
[ "$failed" -eq 0 ]
