#!/bin/sh
# Top-1 agreement of kvcache and llama.cpp on one GGUF file (issue 42, check 2): both engines
# evaluate the same 64 token ids (BOS, as llama.cpp reads it from the file, then the start of a
# fixed English text tokenized by `kvcache tokenize` of that file; nothing else added by either
# engine), each writes the next-token logits of every position as float32 [64][vocab], and the
# table gives per position the top-1 of each, whether they agree, the top-1/top-2 margin of
# each (a tiny margin on a random-weight model makes a disagreement a tie, not a bug) and the
# largest |logit difference|; then a summary line "agree N/64".
#
# Not part of the CMake build or of ctest. Needs a built llama.cpp tree (its include/,
# ggml/include/ and build/bin/libllama.so) and a built kvcache CLI; builds
# scripts/peer/llama_logits.cc with g++ into the work directory (each run, about a second).
#
#   scripts/peer/compare_top1.sh MODEL.gguf [--one-by-one]
#
#   --one-by-one  feed the ids one at a time in both engines (kvcache: `logits --cache dynamic`,
#                 the decode path; llama.cpp: one llama_decode per id) instead of one prefill.
# Environment:
#   KVCACHE=build/kvcache     the kvcache binary to test
#   LLAMA=/tmp/llama-src      llama.cpp source tree with its build in $LLAMA/build
#   WORK=(mktemp -d)          where llama_logits, the ids and the logits files go (kept)
#   THREADS=2                 threads of both engines
#   IDS="1 450 ..."           use these ids instead of BOS + the text
#   REF=model-f16.gguf        also run llama.cpp on this (unquantized) file and print how far
#                             each engine's logits are from it: whether the two engines differ
#                             by less than the quantization itself moves the logits
set -eu
if [ $# -lt 1 ]; then
  sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
model=$1
shift
mode=prefill
if [ $# -gt 0 ]; then
  case $1 in
  --one-by-one) mode=one-by-one ;;
  *)
    echo "compare_top1.sh: unknown argument $1 (only --one-by-one)" >&2
    exit 2
    ;;
  esac
fi
here=$(cd "$(dirname "$0")" && pwd)
kvcache=${KVCACHE:-build/kvcache}
llama=${LLAMA:-/tmp/llama-src}
threads=${THREADS:-2}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
if [ ! -x "$kvcache" ]; then
  echo "compare_top1.sh: kvcache binary $kvcache not found; set KVCACHE or build the kvcache target" >&2
  exit 2
fi
if [ ! -f "$llama/build/bin/libllama.so" ]; then
  echo "compare_top1.sh: $llama/build/bin/libllama.so not found; set LLAMA to a built llama.cpp tree" >&2
  exit 2
fi

peer=$work/llama_logits
g++ -O2 -std=c++17 -Wall -Wextra -Werror "$here/llama_logits.cc" -I"$llama/include" \
  -I"$llama/ggml/include" -L"$llama/build/bin" -lllama -Wl,-rpath,"$llama/build/bin" -o "$peer"

# The prompt: 64 ids. The text is long enough for 63 tokens in a 32000-entry and a 512-entry
# sentencepiece vocabulary.
text="Once upon a time, there was a little girl named Lily who lived in a small house near the forest. Every morning she walked to the river with her dog, Max, to watch the fish jump. One day, Max found a shiny red ball under a big tree, and they played together until the sun went down."
# Its words on one line, single spaces.
words() { printf '%s' "$1" | tr '\n' ' ' | sed 's/  */ /g; s/^ //; s/ $//'; }
tok_note="ids given in IDS"
if [ -n "${IDS:-}" ]; then
  ids=$IDS
else
  bos=$("$peer" -m "$model" --print-bos)
  if [ "$bos" -lt 0 ]; then
    echo "compare_top1.sh: $model has no BOS token; give the ids in IDS" >&2
    exit 2
  fi
  body=$(printf %s "$text" | "$kvcache" tokenize -m "$model")
  # Not used for the logits (both engines get kvcache's ids), a check of the file's vocabulary.
  peer_body=$(printf %s "$text" | "$peer" -m "$model" --tokenize)
  if [ "$(words "$body")" = "$(words "$peer_body")" ]; then
    tok_note="the text's ids: kvcache tokenize = llama_tokenize ($(echo "$body" | wc -w) ids)"
  else
    tok_note="the text's ids DIFFER: kvcache tokenize $(words "$body"); llama_tokenize $(words "$peer_body")"
  fi
  ids=$(echo "$bos $body" | tr ' ' '\n' | grep -v '^$' | head -n 64 | tr '\n' ' ' | sed 's/ $//')
fi
n=$(echo "$ids" | wc -w)
echo "$ids" >"$work/ids.txt"

if [ "$mode" = one-by-one ]; then
  kv_extra="--cache dynamic"
  ll_extra="--one-by-one"
else
  kv_extra=""
  ll_extra=""
fi
# shellcheck disable=SC2086 # kv_extra / ll_extra are word lists on purpose
"$kvcache" logits -m "$model" --prompt-ids "$ids" -o "$work/kvcache.f32" -t "$threads" $kv_extra >&2
# shellcheck disable=SC2086
"$peer" -m "$model" --prompt-ids "$ids" -o "$work/llama.f32" -t "$threads" $ll_extra
ref_out=""
if [ -n "${REF:-}" ]; then
  ref_out=$work/reference.f32
  # shellcheck disable=SC2086
  "$peer" -m "$REF" --prompt-ids "$ids" -o "$ref_out" -t "$threads" $ll_extra
fi

echo "model $model, $mode, $n ids: $ids"
echo "$tok_note"
echo "kvcache $kvcache; llama.cpp $llama ($(git -C "$llama" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')); work dir $work"
python3 - "$work/kvcache.f32" "$work/llama.f32" "$n" "$work/ids.txt" "$ref_out" "${REF:-}" <<'EOF'
import math
import sys
from array import array

kv_path, ll_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = open(sys.argv[4]).read().split()
ref_path, ref_model = sys.argv[5], sys.argv[6]


def load(path):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


kv, ll = load(kv_path), load(ll_path)
if len(kv) != len(ll) or len(kv) % n != 0:
    sys.exit("compare_top1.sh: the logits files differ in size (%d and %d floats for %d positions)"
             % (len(kv), len(ll), n))
vocab = len(kv) // n


def top2(row):
    best = max(range(len(row)), key=row.__getitem__)
    second = max(row[i] for i in range(len(row)) if i != best)
    return best, row[best] - second


# margin: top-1 minus top-2 logit of that engine. llama_gap: how much higher llama.cpp scores
# its own top-1 than kvcache's (0 when they agree); rank: where kvcache's top-1 is in
# llama.cpp's order.
print("pos  next_id  top1_kvcache  top1_llama  agree  margin_kvcache  margin_llama  max|diff|  llama_gap  rank")
agree = 0
worst_diff = 0.0
worst_gap = 0.0
min_margin = float("inf")
for p in range(n):
    a = kv[p * vocab:(p + 1) * vocab]
    b = ll[p * vocab:(p + 1) * vocab]
    ta, ma = top2(a)
    tb, mb = top2(b)
    diff = max(abs(x - y) for x, y in zip(a, b))
    worst_diff = max(worst_diff, diff)
    min_margin = min(min_margin, mb)
    rank = 1 + sum(1 for v in b if v > b[ta])
    gap = b[tb] - b[ta]
    worst_gap = max(worst_gap, gap)
    ok = ta == tb
    agree += ok
    nxt = ids[p + 1] if p + 1 < n else "-"
    print("%3d  %7s  %12d  %10d  %5s  %14.5f  %12.5f  %9.5f  %9.5f  %4d"
          % (p, nxt, ta, tb, "yes" if ok else "NO", ma, mb, diff, gap, rank))
print("agree %d/%d  (vocab %d, max|diff| over all %.5f, smallest llama.cpp top-1 margin %.5f, "
      "largest llama_gap at a disagreement %.5f)"
      % (agree, n, vocab, worst_diff, min_margin, worst_gap))
if ref_path:
    ref = load(ref_path)
    if len(ref) != len(kv):
        sys.exit("compare_top1.sh: REF %s has another vocabulary size" % ref_model)

    def rms(x, y):
        return math.sqrt(sum((u - v) ** 2 for u, v in zip(x, y)) / len(x))

    def top1_agree(x):
        return sum(top2(x[p * vocab:(p + 1) * vocab])[0] == top2(ref[p * vocab:(p + 1) * vocab])[0]
                   for p in range(n))

    mean = sum(ref) / len(ref)
    std = math.sqrt(sum((v - mean) ** 2 for v in ref) / len(ref))
    print("reference %s in llama.cpp (logit std %.4f): rms diff kvcache-llama.cpp %.5f, "
          "kvcache-reference %.5f, llama.cpp-reference %.5f; top-1 = reference's: kvcache %d/%d, "
          "llama.cpp %d/%d" % (ref_model, std, rms(kv, ll), rms(kv, ref), rms(ll, ref),
                               top1_agree(kv), n, top1_agree(ll), n))
EOF
