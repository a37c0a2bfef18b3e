#!/usr/bin/env bash
# Runs the libFuzzer targets `make fuzz` built, one after the other, each for SECONDS from its
# checked-in corpus (tests/fuzz/corpus/<t>, read-only), regressions and dictionary (dict/<t>.dict,
# the field names and magic values of its format); new inputs go to
# BUILD/fuzz-out/<t>/corpus, crashes / timeouts / OOMs to BUILD/fuzz-out/<t>/artifacts. Prints one
# summary line per target and exits 1 when any target found something.
#   usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]
# FUZZ_KEEP_GOING=1: libFuzzer's fork mode, which records every crash and keeps fuzzing instead of
# stopping at the first (for a target with known, not yet fixed findings).
set -uo pipefail

build=${1:?usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(gguf safetensors llama2c_checkpoint llama2c_tokenizer hf_config hf_tokenizer openai_request chat_template http)
fi

found=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz.sh: no $bin (is '$t' a target? did the build fail?)" >&2; exit 2; }
  out="$build/fuzz-out/$t"
  mkdir -p "$out/corpus" "$out/artifacts"
  dirs=("$out/corpus" "$root/tests/fuzz/corpus/$t")
  [ -d "$root/tests/fuzz/regressions/$t" ] && dirs+=("$root/tests/fuzz/regressions/$t")
  flags=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$out/artifacts/"
         -print_final_stats=1)
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && flags+=(-dict="$root/tests/fuzz/dict/$t.dict")
  [ "${FUZZ_KEEP_GOING:-0}" = 1 ] && flags+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  echo "== fuzz_$t for ${seconds}s (log: $out/log)"
  start="$out/.started"  # findings of this run: artifacts newer than this (older ones are kept)
  touch "$start"
  nice -n 10 "$bin" "${flags[@]}" "${dirs[@]}" >"$out/log" 2>&1
  rc=$?
  # Executions: the final stats line (plain mode) or the last progress line's #N (fork mode).
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/log" | awk '{print $2}' | tail -1)
  [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$out/log" | tail -1 | tr -d '#')
  corpus=$(find "$out/corpus" -type f | wc -l)
  findings=$(find "$out/artifacts" -type f -newer "$start" | wc -l)
  line=$(printf '%-20s execs %-10s corpus %-6s findings %-3s exit %s' "$t" "${execs:-?}" "$corpus" "$findings" "$rc")
  summary+=("$line")
  if [ "$findings" -gt 0 ] || [ "$rc" -ne 0 ]; then
    found=1
    find "$out/artifacts" -type f -newer "$start" | sed 's/^/   /'
  fi
done
echo
echo "fuzz summary (${seconds}s per target):"
printf '  %s\n' "${summary[@]}"
exit $found
