#!/usr/bin/env python3
"""Per-stage split of the raw pipeline's latency phase, from the trace that
docs/stage-trace/daemon.patch adds to `smoke bench-fanout-raw` (PERF_RAW_TRACE_FILE=<file>).

usage: raw-split.py <trace file> [latency posts, default 400]

Each line is `<event> <stream sequence> <stored ns> <unix ns> <Nats-Msg-Id>`: Q0/Q3 per post
(pulled by the copy stage with its stored time; copies sent), S0/S3 per entry (pulled by the
frame stage with its stored time; frame sent). An entry's id starts with its post's id. The
last <latency posts> posts by CHAT sequence are counted (the benchmark's latency phase).
"""
import collections
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main():
    q0, q3, s0, s3 = {}, {}, {}, {}
    for line in open(sys.argv[1]):
        ev, a, b, t, id_ = line.split()
        a, b, t = int(a), int(b), int(t)
        if ev == "Q0":
            q0[id_] = (a, b, t)
        elif ev == "Q3":
            q3[id_] = t
        elif ev == "S0":
            s0[id_] = (a, b, t)
        elif ev == "S3":
            s3[id_] = t
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    posts = set(sorted(q0, key=lambda k: q0[k][0])[-n:])
    rows = collections.defaultdict(list)
    for eid, (_, stored, t) in s0.items():
        pid = eid.split(":")[0]
        if pid not in posts or eid not in s3 or pid not in q3:
            continue
        _, post_stored, pulled = q0[pid]
        for name, ns in (
            ("post stored -> copy stage pulled", pulled - post_stored),
            ("copy pulled -> copies sent", q3[pid] - pulled),
            ("copies sent -> stored", stored - q3[pid]),
            ("entry stored -> frame stage pulled", t - stored),
            ("entry pulled -> frame sent", s3[eid] - t),
            ("post stored -> frame sent", s3[eid] - post_stored),
        ):
            rows[name].append(ns / 1e6)
    print(f"frames {len(rows['post stored -> frame sent'])} (ms)")
    print(f"{'stage':36} {'p50':>7} {'p90':>7} {'p99':>7}")
    for name, v in rows.items():
        print(f"{name:36} {pct(v, .5):7.3f} {pct(v, .9):7.3f} {pct(v, .99):7.3f}")


main()
