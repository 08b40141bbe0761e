#!/usr/bin/env bash
# Runs `kiln bench` and llama.cpp's `llama-bench` back to back on the same file with the
# same threads, alternating for several rounds (this machine's memory bandwidth drifts
# with its neighbours' load, so one run of each can mislead), and prints per engine the
# median over rounds of each round's mean, plus the kiln/llama.cpp ratio of the medians.
# llama.cpp is a yardstick built outside this repository: pass its llama-bench binary.
#   bench/compare.sh LLAMA_BENCH MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 3] [--rounds 3]
set -euo pipefail
llama_bench=$1 model=$2
shift 2
p=512 n=128 t=2 r=3 rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    -p) p=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -t) t=$2; shift 2 ;;
    -r) r=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$rounds"); do
  "$here/build/kiln" bench "$model" -p "$p" -n "$n" -t "$t" -r "$r" -o json --quiet >"$out/kiln.$i.json"
  "$llama_bench" -m "$model" -p "$p" -n "$n" -t "$t" -r "$r" -o json 2>/dev/null >"$out/llama.$i.json"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def key(row):
    return ("pp%d" % row["n_prompt"]) if row["n_gen"] == 0 else ("tg%d" % row["n_gen"]), row["n_threads"]
def collect(engine):
    per_test = {}
    for i in range(1, rounds + 1):
        for row in json.load(open("%s/%s.%d.json" % (out, engine, i))):
            per_test.setdefault(key(row), []).append(row["avg_ts"])
    return per_test
kiln, llama = collect("kiln"), collect("llama")
print("| test | threads | kiln t/s (median; rounds) | llama.cpp t/s (median; rounds) | kiln / llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: |")
for k in kiln:
    if k not in llama:
        continue
    km, lm = statistics.median(kiln[k]), statistics.median(llama[k])
    fmt = lambda v: ", ".join("%.1f" % x for x in v)
    print("| %s | %d | %.2f (%s) | %.2f (%s) | %.2f |" % (k[0], k[1], km, fmt(kiln[k]), lm, fmt(llama[k]), km / lm))
PY
