#!/bin/sh
# Decode attention against the machine's read bandwidth, side by side in one run (issue 3's
# check; the ratio the issue asks for). Runs N repetitions of BM_ReadBandwidth and the chosen
# BM_DecodeAttention benchmarks in random interleaved order (so a noisy minute hits both), and
# prints for each the best and the median GiB/s (Google Benchmark's bytes_per_second, base
# 1024) over the repetitions and their ratio to the read bandwidth's best and median. The
# filter also picks BM_ReadBandwidthPrefetch (the same sum prefetching 16 lines ahead, as the
# decode kernel reads): its ratio says how far BM_ReadBandwidth is from this host's ceiling.
#
#   scripts/attention_ratio.sh [REPETITIONS] [FILTER]
#   scripts/attention_ratio.sh 8 'BM_DecodeAttention/(f16|q4)/(16384|65536)'
set -eu
reps=${1:-8}
filter=${2:-'BM_DecodeAttention/f16/(16384|65536)'}
bin=${BENCH_ATTENTION:-build/bench/bench_attention}
if [ ! -x "$bin" ]; then
  echo "attention_ratio.sh: $bin not found; build it with: cmake --build build --target bench_attention" >&2
  exit 2
fi
"$bin" --benchmark_filter="BM_ReadBandwidth|$filter" --benchmark_repetitions="$reps" \
  --benchmark_enable_random_interleaving=true 2>/dev/null |
  awk '
    /^BM_/ && /bytes_per_second=/ && !/_(mean|median|stddev|cv)/ {
      name = $1; sub(/\/min_time:.*/, "", name)
      match($0, /bytes_per_second=[0-9.]+[kMGT]?\/s/)
      v = substr($0, RSTART + 17, RLENGTH - 19); u = substr(v, length(v)); x = v + 0
      if (u == "k") x /= 1e6; else if (u == "M") x /= 1e3; else if (u == "T") x *= 1e3; else if (u != "G") x /= 1e9
      n[name]++; val[name, n[name]] = x
    }
    function sorted_stat(name, which,   i, j, k, a, t) {
      k = n[name]; for (i = 1; i <= k; i++) a[i] = val[name, i]
      for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      if (which == "best") return a[k]
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    END {
      bw = "BM_ReadBandwidth"
      if (!(bw in n)) { print "attention_ratio.sh: no BM_ReadBandwidth result" > "/dev/stderr"; exit 2 }
      bb = sorted_stat(bw, "best"); bm = sorted_stat(bw, "median")
      printf "%-36s %5s %12s %12s %12s %12s\n", "benchmark", "reps", "best GiB/s", "median GiB/s", "best ratio", "median ratio"
      printf "%-36s %5d %12.2f %12.2f %12s %12s\n", bw, n[bw], bb, bm, "1.00", "1.00"
      for (name in n) if (name != bw)
        printf "%-36s %5d %12.2f %12.2f %12.2f %12.2f\n", name, n[name], sorted_stat(name, "best"),
               sorted_stat(name, "median"), sorted_stat(name, "best") / bb, sorted_stat(name, "median") / bm
    }'
