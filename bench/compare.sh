#!/usr/bin/env bash
# Runs `kiln bench` and llama.cpp's `llama-bench` back to back on the same file with the
# same threads, and prints both tables plus the kiln/llama.cpp ratio per test.
# llama.cpp is a yardstick built outside this repository: pass its llama-bench binary.
#   bench/compare.sh LLAMA_BENCH MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 5]
set -euo pipefail
llama_bench=$1 model=$2
shift 2
p=512 n=128 t=2 r=5
while [ $# -gt 0 ]; do
  case $1 in
    -p) p=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -t) t=$2; shift 2 ;;
    -r) r=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
kiln_json=$(mktemp) llama_json=$(mktemp)
trap 'rm -f "$kiln_json" "$llama_json"' EXIT
"$here/build/kiln" bench "$model" -p "$p" -n "$n" -t "$t" -r "$r" -o json --quiet >"$kiln_json"
"$llama_bench" -m "$model" -p "$p" -n "$n" -t "$t" -r "$r" -o json 2>/dev/null >"$llama_json"
python3 - "$kiln_json" "$llama_json" <<'PY'
import json, sys
kiln = json.load(open(sys.argv[1]))
llama = json.load(open(sys.argv[2]))
def key(row):
    return ("pp%d" % row["n_prompt"]) if row["n_gen"] == 0 else ("tg%d" % row["n_gen"]), row["n_threads"]
L = {key(r): r for r in llama}
print("| test | threads | kiln t/s | llama.cpp t/s | kiln / llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: |")
for r in kiln:
    k = key(r)
    if k not in L:
        continue
    l = L[k]
    print("| %s | %d | %.2f ± %.2f | %.2f ± %.2f | %.2f |" % (k[0], k[1], r["avg_ts"], r["stddev_ts"],
          l["avg_ts"], l["stddev_ts"], r["avg_ts"] / l["avg_ts"]))
PY
