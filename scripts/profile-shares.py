#!/usr/bin/env python3
"""Where one bench row's CPU goes: reads a `perf record --call-graph fp` file (a frame-pointer
build of a bench), keeps the samples of one process within one row's time window, and prints
each frame's share of them, inclusive, with the frames it calls.

A row's window is the lifetime of the client process that ran it (`mcp_hop` starts one per row):
`--row-client PID` cuts the server's samples to the first and last sample of that process.

    perf record -F 2999 --call-graph fp -o perf.data <bench binary> --bench
    scripts/profile-shares.py perf.data --processes            # pids, samples, first/last time
    scripts/profile-shares.py perf.data --pid 18525 --row-client 18540 \\
        --frame 'Writer::run' --frame 'Engine::handle' --callees 'Engine::handle'

Shares are of the process's samples in the window; a sample counts once under the outermost
frame that matches (`--frame`), so the shares of several patterns add up."""

import argparse
import collections
import re
import subprocess
import sys


def samples(data):
    """Yields (pid, time, frames leaf first) for every sample in `data`."""
    out = subprocess.run(
        ["perf", "script", "-i", data, "-F", "comm,pid,tid,time,ip,sym"], capture_output=True, text=True, check=True
    ).stdout
    head, frames = None, []
    for line in out.splitlines() + [""]:
        if not line.strip():
            if head:
                yield head[0], head[1], frames
            head, frames = None, []
        elif line[0] not in " \t":
            match = re.search(r"\s(\d+)/\d+\s+([\d.]+):", line)
            head = (int(match.group(1)), float(match.group(2))) if match else None
            frames = []
        else:
            parts = line.strip().split(" ", 1)
            frames.append(parts[1] if len(parts) > 1 else "?")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a perf.data file recorded with --call-graph fp")
    parser.add_argument("--processes", action="store_true", help="list each pid's samples and time span")
    parser.add_argument("--pid", type=int, help="the process whose samples are shared out")
    parser.add_argument("--row-client", type=int, help="keep only samples within this pid's first and last")
    parser.add_argument("--frame", action="append", default=[], help="a regex; share of samples under it")
    parser.add_argument("--callees", action="append", default=[], help="a regex; the frames it calls, by share")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    every = list(samples(args.data))
    if args.processes or args.pid is None:
        spans = {}
        for pid, at, _ in every:
            first, last, n = spans.get(pid, (at, at, 0))
            spans[pid] = (min(first, at), max(last, at), n + 1)
        for pid, (first, last, n) in sorted(spans.items(), key=lambda kv: kv[1][0]):
            print(f"{pid:>8} {n:>8} samples  {first:.3f} .. {last:.3f}")
        return 0
    window = (float("-inf"), float("inf"))
    if args.row_client is not None:
        times = [at for pid, at, _ in every if pid == args.row_client]
        if not times:
            sys.exit(f"no samples of pid {args.row_client}")
        window = (min(times), max(times))
    kept = [frames for pid, at, frames in every if pid == args.pid and window[0] <= at <= window[1]]
    if not kept:
        sys.exit(f"no samples of pid {args.pid} in the window")
    total = len(kept)
    print(f"{total} samples of pid {args.pid} in {window[0]:.3f} .. {window[1]:.3f}")

    if args.frame:
        patterns = [(p, re.compile(p)) for p in args.frame]
        under = collections.Counter()
        for frames in kept:
            owner = next(
                (p for frame in reversed(frames) for p, rx in patterns if rx.search(frame)), "(none of these)"
            )
            under[owner] += 1
        for name, n in under.most_common():
            print(f"{100 * n / total:6.2f}%  {name}")
    for pattern in args.callees:
        rx = re.compile(pattern)
        called = collections.Counter()
        for frames in kept:
            at = [i for i, frame in enumerate(frames) if rx.search(frame)]
            if at:
                outermost = max(at)
                called[frames[outermost - 1] if outermost > 0 else "(itself)"] += 1
        print(f"== {pattern}: {100 * sum(called.values()) / total:.2f}%")
        for name, n in called.most_common(args.top):
            print(f"{100 * n / total:6.2f}%  {name[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
