#!/bin/sh
# Every case of issue 42's check 2 with compare_top1.sh, from the f16 inputs: makes the files
# with llama.cpp's llama-quantize (and `kvcache convert` for stories260K), then compares
# kvcache and llama.cpp on each, in one prefill and one id at a time, and prints one summary
# line per run (the full tables stay in $WORK/out/).
#
#   scripts/peer/top1_all.sh
#
# Files (in $WORK, made once, kept):
#   q4km.gguf, q80.gguf         llama-quantize Q4_K_M / Q8_0 of $DUMMY (a random-weight 125M
#                               llama in f16 with llama's sentencepiece vocabulary)
#   stories260K-f16.gguf        `kvcache convert --dtype f16` of llama2.c's stories260K (trained)
#   stories260K-q4km.gguf       llama-quantize Q4_K_M of it (dims of 64 and 172: no q4_K at all,
#                               llama-quantize falls back to q5_0 / q8_0 / f16; its log beside)
#   NAME-deq-f32.gguf           llama-quantize --allow-requantize F32 of each quantized file:
#                               the same weights dequantized by llama.cpp, the REF of that file
#                               (the logits of exact arithmetic on the quantized weights)
# Environment: KVCACHE (default build/kvcache), LLAMA (/tmp/llama-src), WORK (/tmp/top1-all),
#   DUMMY (~/.cache/kvcache/dummy-llama-125m-f16-s0-spm.gguf), STORIES (the stories260K folder,
#   default ../shared/models/stories260K beside the repository).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
kvcache=${KVCACHE:-build/kvcache}
case $kvcache in /*) ;; *) kvcache=$PWD/$kvcache ;; esac
llama=${LLAMA:-/tmp/llama-src}
work=${WORK:-/tmp/top1-all}
dummy=${DUMMY:-$HOME/.cache/kvcache/dummy-llama-125m-f16-s0-spm.gguf}
stories=${STORIES:-$repo/../shared/models/stories260K}
quantize=$llama/build/bin/llama-quantize
for f in "$kvcache" "$quantize"; do
  if [ ! -x "$f" ]; then
    echo "top1_all.sh: $f not found (set KVCACHE / LLAMA)" >&2
    exit 2
  fi
done
if [ ! -f "$dummy" ]; then
  echo "top1_all.sh: $dummy not found; set DUMMY to an f16 llama GGUF with a vocabulary" >&2
  exit 2
fi
mkdir -p "$work/out"

quant() {  # quant IN OUT TYPE [--allow-requantize]: llama-quantize once, its log beside OUT
  if [ ! -f "$2" ]; then
    "$quantize" ${4:+"$4"} "$1" "$2" "$3" 2 >"$2.log" 2>&1 || {
      echo "top1_all.sh: llama-quantize $1 -> $3 failed; see $2.log" >&2
      exit 1
    }
  fi
}
quant "$dummy" "$work/q4km.gguf" Q4_K_M
quant "$dummy" "$work/q80.gguf" Q8_0
if [ ! -f "$work/stories260K-f16.gguf" ]; then
  "$kvcache" convert -m "$stories/stories260K.bin" --tokenizer "$stories/tok512.bin" \
    --dtype f16 -o "$work/stories260K-f16.gguf" >&2
fi
quant "$work/stories260K-f16.gguf" "$work/stories260K-q4km.gguf" Q4_K_M
for q in q4km q80 stories260K-q4km; do
  quant "$work/$q.gguf" "$work/$q-deq-f32.gguf" F32 --allow-requantize
done

for name in f16 q80 q4km stories260K-f16 stories260K-q4km; do
  ref=""
  case $name in
  f16) file=$dummy ;;
  stories260K-f16) file=$work/$name.gguf ;;
  *) file=$work/$name.gguf ref=$work/$name-deq-f32.gguf ;;
  esac
  for mode in prefill one-by-one; do
    flag=""
    [ "$mode" = one-by-one ] && flag=--one-by-one
    out=$work/out/$name-$mode.txt
    # shellcheck disable=SC2086 # flag is empty or one word
    KVCACHE=$kvcache WORK=$work/out/$name-$mode REF=$ref LLAMA=$llama \
      "$here/compare_top1.sh" "$file" $flag >"$out" 2>&1 || {
      echo "$name $mode: compare_top1.sh failed; see $out" >&2
      continue
    }
    echo "$name $mode | $(grep '^agree' "$out" | sed 's/ (vocab [0-9]*, / (/') | $(grep '^reference' "$out" | sed 's/.*rms diff/rms diff/')"
  done
done
