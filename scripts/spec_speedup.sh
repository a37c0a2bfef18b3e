#!/usr/bin/env bash
# Speculative decoding's speed-up on an input-grounded task (issue 45): stories260K is given a
# passage it wrote (the first P ids of llama2.c's greedy story, ../shared/golden/stories260K), C
# times, and the story's opening again, so that continuing means repeating the passage. Plain greedy decoding
# and `--spec ngram` (prompt lookup) alternate R times in one run; prints each run's decode tok/s,
# the median ratio, whether the ids are identical, and the acceptance line.
#
#   scripts/spec_speedup.sh [kvcache] [-n N] [-t T] [-r R] [-p P] [-c C] [-k K] [extra generate args...]
# -k: --spec-k of the speculative runs (default: generate's).
set -euo pipefail
bin=${1:-build/kvcache}
shift || true
n=100 t=1 r=5 p=120 c=1 k=
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) n=$2; shift 2 ;;
    -t) t=$2; shift 2 ;;
    -r) r=$2; shift 2 ;;
    -p) p=$2; shift 2 ;;
    -c) c=$2; shift 2 ;;
    -k) k=$2; shift 2 ;;
    *) break ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/../shared/models/stories260K/stories260K.bin
golden=$root/../shared/golden/stories260K/once_upon_a_time.ids
[[ -f $model && -f $golden ]] || { echo "spec_speedup: needs $model and $golden" >&2; exit 2; }
opening=$(sed -n 's/^prompt_ids: //p' "$golden")
passage=$(sed -n 's/^generated_ids: //p' "$golden" | tr ' ' '\n' | head -n "$p" | tr '\n' ' ')
prompt=""
for _ in $(seq "$c"); do prompt="$prompt $opening $passage"; done
prompt="${prompt# } $opening"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plain=() spec=()
for i in $(seq "$r"); do
  for mode in plain spec; do
    args=()
    [[ $mode == spec ]] && args=(--spec ngram ${k:+--spec-k $k})
    "$bin" generate -m "$model" --prompt-ids "$prompt" -n "$n" --temp 0 --ignore-eos --output ids \
      -t "$t" "${args[@]}" "$@" >"$tmp/$mode.ids" 2>"$tmp/$mode.err"
    tps=$(grep -o 'decode: [0-9.]* tok/s' "$tmp/$mode.err" | awk '{print $2}')
    [[ $mode == plain ]] && plain+=("$tps") || spec+=("$tps")
  done
  cmp -s "$tmp/plain.ids" "$tmp/spec.ids" || { echo "spec_speedup: ids differ in round $i" >&2; exit 1; }
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mp=$(median "${plain[@]}") ms=$(median "${spec[@]}")
echo "prompt: $(wc -w <<<"$prompt") ids, -n $n, -t $t, $r rounds"
echo "plain decode tok/s: ${plain[*]} (median $mp)"
echo "spec ngram tok/s:   ${spec[*]} (median $ms)"
echo "ratio (median): $(awk -v a="$ms" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')x, ids identical in every round"
grep -o 'speculative.*' "$tmp/spec.err" || true
