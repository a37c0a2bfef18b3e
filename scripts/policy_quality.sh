#!/usr/bin/env bash
# The quality cost of the lossy KV policies (docs/architecture.md, "Lossy KV policies") on
# stories260K: a story prompt (BOS + ~110 tokens), exact greedy generation of 400 tokens, then
# for each policy the same 510 tokens through the policy's cache as generate feeds them (the
# prompt in one prefill, then token by token: `logits --n-prompt`), compared with exact
# attention at every position after the prompt: max and mean |logit - exact logit| and how
# often the policy's top token is exact's greedy token (teacher-forced agreement).
# Usage: scripts/policy_quality.sh [KVCACHE_BINARY] [SPEC ...]
set -euo pipefail
kv=${1:-build/kvcache}
shift || true
model=${MODEL:-$(dirname "$0")/../../shared/models/stories260K/stories260K.bin}
specs=("$@")
if [ ${#specs[@]} -eq 0 ]; then
  specs=(exact streaming:sink=4,window=64 streaming:sink=0,window=64 streaming:sink=4,window=128
         streaming:sink=4,window=256 h2o:heavy=32,recent=32 h2o:heavy=64,recent=64
         h2o:heavy=128,recent=128 snapkv:budget=32,window=8,kernel=7
         snapkv:budget=64,window=16,kernel=7 snapkv:budget=64,window=16,kernel=1)
fi
prompt="Once upon a time, there was a little girl named Lily. She loved to play in the park \
with her big red ball. One day, she saw a small dog sitting under a tree. The dog looked sad \
and hungry. Lily wanted to help the dog, so she went home and asked her mom for some food. Her \
mom gave her a bowl of milk and a piece of bread."
prompt_ids="1 $(printf '%s' "$prompt" | "$kv" tokenize -m "$model")"
n_prompt=$(wc -w <<<"$prompt_ids")
gen=$("$kv" generate -m "$model" --prompt-ids "$prompt_ids" -n 400 --temp 0 --ignore-eos \
  --output ids 2>/dev/null)
# stories260K's context is 512 positions: feed at most that many ids.
gen=$(tr ' ' '\n' <<<"$gen" | head -n $((512 - n_prompt)) | tr '\n' ' ')
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "prompt: $n_prompt tokens, exact greedy continuation fed: $(wc -w <<<"$gen") tokens"
echo
echo "| policy | max abs logit diff | mean abs logit diff | top-1 agreement |"
echo "|---|---:|---:|---:|"
for spec in "${specs[@]}"; do
  "$kv" logits -m "$model" --prompt-ids "$prompt_ids $gen" --n-prompt "$n_prompt" \
    --kv-policy "$spec" --compare-exact -o "$out" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("| `%s` | %.4g | %.4g | %.1f%% |" % (r["policy"], r["max_abs_logit_diff"], r["mean_abs_logit_diff"], 100*r["top1_agreement"]))'
done
