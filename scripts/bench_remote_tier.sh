#!/usr/bin/env bash
# The shared remote tier end to end (issue 41's benchmark): two `kvcache serve` processes share
# one redis-server. Each round sends a fresh 2,000-token prompt (random token ids, seeded by the
# round) to server A, waits until A's write-behind has put its blocks in Redis, then sends the
# same prompt to server B (a remote hit: B never saw it) and another fresh prompt of the same
# length to B (cold: computed from scratch). Rounds alternate which of B's requests goes first.
# TTFT is the time of a non-streamed request for one token (curl's time_total: the prefill plus
# one decode step, HTTP on loopback included). Prints per round, then the medians, the ratio,
# the cached tokens of the hit, and whether the hit's token equals A's.
#
#   scripts/bench_remote_tier.sh [ROUNDS] [MODEL] [THREADS]
#   scripts/bench_remote_tier.sh 7 dummy:llama-125m 2
#
# Needs redis-server, curl and jq (scripts/install_deps.sh installs redis; curl and jq are
# Debian's). The servers run one after the other, never at once, so each has the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-7}
model=${2:-dummy:llama-125m}
threads=${3:-2}
prompt_tokens=${PROMPT_TOKENS:-2000}
cli=${KVCACHE:-build/kvcache}
for bin in redis-server redis-cli curl jq "$cli"; do
  command -v "$bin" >/dev/null || [ -x "$bin" ] || { echo "bench_remote_tier.sh: $bin not found" >&2; exit 2; }
done

work=$(mktemp -d /tmp/kvcache_bench_remote.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rport=$(free_port)
redis-server --bind 127.0.0.1 --port "$rport" --dir "$work" --save '' --appendonly no \
  --maxmemory 2gb --maxmemory-policy allkeys-lru --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" PING >/dev/null 2>&1 && break; sleep 0.05; done

start_serve() {  # name -> port on stdout once listening
  local name=$1 log="$work/$1.log"
  "$cli" serve --model "$model" --port 0 -t "$threads" --max-cache-len 4096 \
    --kv-remote "redis://127.0.0.1:$rport" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1200); do
    if grep -q 'listening on http://127.0.0.1:' "$log"; then
      sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1
      return
    fi
    sleep 0.1
  done
  echo "serve $name did not start:" >&2
  cat "$log" >&2
  exit 1
}
pa=$(start_serve A)
pb=$(start_serve B)

prompt() {  # seed -> JSON array of prompt_tokens ids (BOS 1 first)
  python3 -c "import random,sys; r=random.Random($1); print('[1,' + ','.join(str(r.randrange(3, 30000)) for _ in range($prompt_tokens - 1)) + ']')"
}
request() {  # port prompt_file -> "seconds cached_tokens cached_remote token"
  local out="$work/reply.json" t
  t=$(curl -s -o "$out" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data-binary "@$2" "http://127.0.0.1:$1/v1/completions")
  jq -r --arg t "$t" '[$t, .usage.prompt_tokens_details.cached_tokens,
      (.usage.prompt_tokens_details.cached_tokens_remote // 0),
      (.choices[0].text | @json)] | join(" ")' "$out"
}
body() {  # seed -> request body file
  local f="$work/body_$1.json"
  printf '{"prompt": %s, "max_tokens": 1, "temperature": 0}' "$(prompt "$1")" >"$f"
  echo "$f"
}
stored() { redis-cli -p "$rport" DBSIZE | tr -d '\r'; }

# Warm-up: one cold request on each server (page faults of the weights, first allocations).
request "$pa" "$(body 1000)" >/dev/null
request "$pb" "$(body 1001)" >/dev/null

echo "round  cold_ms  hit_ms  ratio  hit_cached  hit_remote  same_token  ram_hit_ms"
cold_all=() hit_all=() ram_all=()
for r in $(seq "$rounds"); do
  shared=$(body "$r")
  fresh=$(body $((r + 500)))
  before=$(stored)
  read -r _ _ _ tok_a <<<"$(request "$pa" "$shared")"
  # Wait (at most 10 s) until A's blocks are in Redis: the key count stops growing.
  last=-1
  for _ in $(seq 200); do
    now=$(stored)
    [ "$now" -gt "$before" ] && [ "$now" = "$last" ] && break
    last=$now
    sleep 0.05
  done
  if [ $((r % 2)) -eq 0 ]; then
    read -r t_hit cached remote tok_b <<<"$(request "$pb" "$shared")"
    read -r t_cold _ _ _ <<<"$(request "$pb" "$fresh")"
  else
    read -r t_cold _ _ _ <<<"$(request "$pb" "$fresh")"
    read -r t_hit cached remote tok_b <<<"$(request "$pb" "$shared")"
  fi
  read -r t_ram _ _ _ <<<"$(request "$pa" "$shared")"  # A again: its own RAM hit
  same=$([ "$tok_a" = "$tok_b" ] && echo yes || echo NO)
  awk -v r="$r" -v c="$t_cold" -v h="$t_hit" -v k="$cached" -v m="$remote" -v s="$same" -v a="$t_ram" \
    'BEGIN { printf "%5d  %7.1f  %6.1f  %5.2f  %10d  %10d  %-10s  %10.1f\n", r, c * 1e3, h * 1e3, c / h, k, m, s, a * 1e3 }'
  cold_all+=("$t_cold")
  hit_all+=("$t_hit")
  ram_all+=("$t_ram")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
mc=$(median "${cold_all[@]}")
mh=$(median "${hit_all[@]}")
mr=$(median "${ram_all[@]}")
awk -v c="$mc" -v h="$mh" -v a="$mr" 'BEGIN { printf "median: cold %.1f ms, remote hit %.1f ms: %.2fx; RAM hit on A %.1f ms\n", c * 1e3, h * 1e3, c / h, a * 1e3 }'
# Redis hung (SIGSTOP: connections open, no replies): fresh prompts to B. Until the breaker
# opens (3 failed calls), each waits one lookup deadline more than cold; then none does.
redis_pid=${pids[0]}
kill -STOP "$redis_pid"
hung=()
for i in 1 2 3 4 5; do
  read -r t _ _ _ <<<"$(request "$pb" "$(body $((900 + i)))")"
  hung+=("$(awk -v t="$t" -v c="$mc" 'BEGIN { printf "%.1f", (t - c) * 1e3 }')")
done
kill -CONT "$redis_pid"
echo "redis hung: TTFT minus the cold median, 5 fresh prompts in turn (ms): ${hung[*]}"
echo "server B: $(curl -s "http://127.0.0.1:$pb/metrics" | grep -E '^kvcache_remote_(lookups|hits|misses|corrupt|errors|timeouts|waits_expired|bytes_in|lookup_seconds)_total' | sed 's/^kvcache_remote_//; s/_total / /' | tr '\n' ' ')"
echo "redis: $(redis-cli -p "$rport" INFO memory | grep -E '^used_memory_human' | tr -d '\r'), keys $(stored)"
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus; commit $(git rev-parse --short HEAD)"
