#!/usr/bin/env python3
"""Cuts llama-logits output (every position's logits over the whole vocabulary) down to
what tests/families_test.cpp compares: every STRIDE-th column (64 unless given; 256 for
the 128k-151k vocabularies keeps about 500 a position), each position's argmax over the
whole vocabulary with its value, the tokens and the greedy continuation.

    subset.py FULL.llama-logits.txt [STRIDE] > ARCH.logits.txt
"""
import sys

def main():
    STRIDE = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    out = []
    for line in open(sys.argv[1]):
        parts = line.split()
        if not parts:
            continue
        tag = parts[0]
        if tag == "#":
            out.append(line.rstrip("\n"))
        elif tag in ("tokens", "greedy"):
            out.append(" ".join(parts))
        elif tag == "logits":
            pos, values = parts[1], parts[2:]
            if not any(l.startswith("columns") for l in out):
                out.append(f"columns {len(values)} {STRIDE}")
            best = max(range(len(values)), key=lambda i: float(values[i]))
            out.append(f"logits {pos} " + " ".join(values[::STRIDE]))
            out.append(f"argmax {pos} {best} {values[best]}")
    print("\n".join(out))

if __name__ == "__main__":
    main()
