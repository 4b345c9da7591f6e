#!/usr/bin/env bash
# Runs one fuzz target for a given time:
#   fuzz/run.sh <import_raw|registry_convert|reaper_faults|consume|export|artifact|stablehlo> <seconds> [libFuzzer args...]
# e.g. `fuzz/run.sh export 1200 -runs=1000000 -jobs=1 -workers=1` (stops at whichever
# comes first). HANDOFF_FUZZ_FEATURES=torch adds the torch import on CPU to `consume`
# (needs LIBTORCH and LD_LIBRARY_PATH as `cargo xtask env` prints).
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Builds with
# AddressSanitizer (cargo-fuzz's default; LeakSanitizer on, so a leaked keep-alive
# fails the run) and debug assertions, starts from the committed seeds in
# corpus/<target>/ (and regressions/<target>/) and keeps what it finds in
# target/corpus/<target>/ (not committed).
# Prints libFuzzer's final stats (stat::number_of_executed_units is the execution
# count) and exits non-zero on any crash, panic, leak or sanitizer report; the
# failing input is in artifacts/<target>/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${1:?usage: fuzz/run.sh <target> <seconds> [libFuzzer args]}"
secs="${2:?usage: fuzz/run.sh <target> <seconds> [libFuzzer args]}"
shift 2
cd "$here"
work="$here/target/corpus/$target"
mkdir -p "$work" "$here/artifacts/$target"
export CARGO_TARGET_DIR="${HANDOFF_FUZZ_TARGET_DIR:-$here/target}"
features=()
if [ -n "${HANDOFF_FUZZ_FEATURES:-}" ]; then features=(--features "$HANDOFF_FUZZ_FEATURES"); fi
# Inputs that once found a bug run too (read-only), see regressions/README.md.
seeds=()
for d in "$here/corpus/$target" "$here/regressions/$target"; do
  if [ -d "$d" ]; then seeds+=("$d"); fi
done
exec cargo +nightly fuzz run --debug-assertions ${features[@]+"${features[@]}"} "$target" "$work" ${seeds[@]+"${seeds[@]}"} -- \
  -max_total_time="$secs" -print_final_stats=1 -max_len=4096 -timeout=10 -rss_limit_mb=4096 "$@"
