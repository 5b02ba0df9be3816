#!/usr/bin/env python3
"""Compares two parsers' descriptions of the same inputs (one line per input, same order).

usage: compare.py NAMES OURS THEIRS

Fails when both parsers accept an input as a complete request head but read it differently (method,
target, version, body framing, where the head ends, number of fields): that disagreement is exactly what
request smuggling exploits. Inputs that one parser refuses are counted, not failed: HTTPWire is stricter
than http_parser by design (it refuses every ambiguous framing), and accepts methods http_parser does not
know; those inputs are listed so the difference stays visible.
"""
import sys

names = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
ours = open(sys.argv[2], encoding="utf-8", errors="replace").read().splitlines()
theirs = open(sys.argv[3], encoding="utf-8", errors="replace").read().splitlines()
if not (len(names) == len(ours) == len(theirs)):
    sys.exit(f"differential: line counts differ: {len(names)} inputs, {len(ours)} ours, {len(theirs)} theirs")

agree = both_refuse = stricter = laxer = 0
laxer_examples = []
disagreements = []
for name, a, b in zip(names, ours, theirs):
    a_ok, b_ok = a.startswith("ok "), b.startswith("ok ")
    if a_ok and b_ok:
        if a == b:
            agree += 1
        else:
            disagreements.append((name, a, b))
    elif not a_ok and not b_ok:
        both_refuse += 1
    elif b_ok:
        stricter += 1
    else:
        laxer += 1
        laxer_examples.append((name, a, b))

print(f"differential vs http_parser over {len(names)} inputs: {agree} read alike, {both_refuse} refused or incomplete in both, "
      f"{stricter} refused only by HTTPWire, {laxer} accepted only by HTTPWire")
for name, a, b in laxer_examples[:10]:
    print(f"  accepted only by HTTPWire: {name}: {b}")
for name, a, b in disagreements:
    print(f"DISAGREEMENT {name}\n  HTTPWire:    {a}\n  http_parser: {b}")
sys.exit(1 if disagreements else 0)
