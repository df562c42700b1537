#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz / libFuzzer) of every parser of untrusted input.
#   scripts/fuzz.sh [target...]     FUZZ_SECONDS (default 60) per target
# Seeds (committed) are in fuzz/seeds/<target>; what libFuzzer finds on top of them goes to
# fuzz/corpus/<target> (ignored by git), crashes to fuzz/artifacts/<target>. The stable toolchain
# runs cargo-fuzz's nightly flags (-Zsanitizer=address) with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo ">> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then mapfile -t targets < <(cargo fuzz list); fi
cargo fuzz build
mkdir -p target
summary=target/fuzz-summary.txt
: >"$summary"
failed=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  dict=()
  [ -f "fuzz/dicts/$t.dict" ] && dict=("-dict=fuzz/dicts/$t.dict")
  log="target/fuzz-$t.log"
  echo ">> fuzz $t for ${SECONDS_PER_TARGET}s (log: $log)"
  if cargo fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
      -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "${dict[@]}" >"$log" 2>&1; then
    status=ok
  else
    status="FAILED (see $log and fuzz/artifacts/$t)"
    failed=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  printf '%-12s %s: %s runs, %s exec/s, %s\n' "$t" "$status" "${runs:-?}" "${rate:-?}" "${cov:-cov: ?}" | tee -a "$summary"
done
echo ">> summary in $summary"
exit $failed
