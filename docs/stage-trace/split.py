#!/usr/bin/env python3
"""Per-stage split of the fan-out benchmark's latency phase, from the trace that
docs/stage-trace/daemon.patch adds to the daemon (PERF_TRACE_FILE=<file>).

usage: split.py <trace file> <first CHAT sequence of the latency phase>

With `bench-fanout --members 10 --runs 1 --posts 200` that sequence is 202 (the warm-up post and
the run's 200 come first).

Each trace line is `<event> <a> <b> <unix ns>`: W0-W3 per CHAT sequence (pulled with its stored
time, lane batch started, fences proved, copies sent), R0-R3 per INBOX sequence (pulled with its
stored time, batch started, fences proved, frame sent with the post's CHAT sequence), FA/FS/FD
per fence (asked, sent, answered; the letter after them is the bucket name's eighth character).
Only posts from that sequence on are counted. The trace is written every 300 ms, so the last
frames before the daemon stops may be missing; the split is of the frames present.
"""
import collections
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main():
    ev = collections.defaultdict(dict)
    fences = collections.defaultdict(dict)
    for line in open(sys.argv[1]):
        s, a, b, t = line.split()
        a, b, t = int(a), int(b), int(t)
        if s[:2] in ("FS", "FD"):
            fences[(s[2], a)][s[:2]] = t
        elif s[0] in "WR":
            ev[s][a] = (t, b)
    first = int(sys.argv[2])
    start = ev["W0"][first][0]
    rows = collections.defaultdict(list)
    for iseq, (t3, cseq) in ev["R3"].items():
        if cseq < first or cseq not in ev["W0"] or iseq not in ev["R0"]:
            continue
        w = {k: ev[k][cseq][0] for k in ("W0", "W1", "W2", "W3")}
        r = {k: ev[k][iseq][0] for k in ("R0", "R1", "R2", "R3")}
        chat, inbox = ev["W0"][cseq][1], ev["R0"][iseq][1]
        for name, ns in (
            ("post stored -> writer pulled", w["W0"] - chat),
            ("writer lane hop", w["W1"] - w["W0"]),
            ("writer fences", w["W2"] - w["W1"]),
            ("route + copies sent", w["W3"] - w["W2"]),
            ("copies sent -> stored", inbox - w["W3"]),
            ("entry stored -> reader pulled", r["R0"] - inbox),
            ("reader lane hop", r["R1"] - r["R0"]),
            ("reader fences", r["R2"] - r["R1"]),
            ("decide + frame sent", r["R3"] - r["R2"]),
            ("post stored -> frame sent", r["R3"] - chat),
        ):
            rows[name].append(ns / 1e6)
    print(f"frames {len(rows['post stored -> frame sent'])} (ms)")
    print(f"{'stage':32} {'p50':>7} {'p90':>7} {'p99':>7}")
    for name, v in rows.items():
        print(f"{name:32} {pct(v, .5):7.3f} {pct(v, .9):7.3f} {pct(v, .99):7.3f}")
    by = collections.defaultdict(list)
    for (tag, _), v in fences.items():
        if "FS" in v and "FD" in v and v["FS"] >= start:
            by[tag].append((v["FD"] - v["FS"]) / 1e6)
    for tag, v in sorted(by.items()):
        print(f"fence round trip, bucket '{tag}': n={len(v)} p50 {pct(v, .5):.3f} p90 {pct(v, .9):.3f} p99 {pct(v, .99):.3f}")


main()
