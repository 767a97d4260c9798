"""Postern's soak: many agents, mixed traffic, for a long time; the gateway must not grow.

Real parts only, as in the fault campaign: the release `postern serve` (real SQLite file, real
Secret Service keychain), agents on the official Python and TypeScript MCP SDKs — half over the `postern mcp`
bridge, half over Streamable HTTP — a counting HTTP target with Idempotency-Key semantics, and a
real OpenSSH sshd on loopback for `ssh_exec` (ssh_marker contract).

Every agent loops over a random mix of calls, each a new intent: reads (GET, read_only),
idempotent payments (idempotency_key), irreversible wires, and SSH commands. Every few seconds
the gateway's resident memory and open file descriptors are sampled. At the end it prints the
series, their slopes after warm-up (least squares), latency percentiles per kind of call, the
answers by state and error code, and runs `postern audit verify`. It fails if an answer was lost,
the journal does not verify, or a target effect was duplicated.

Usage: soak.py --postern BIN [--agents 64] [--minutes 10] [--json FILE]
"""

import argparse
import json
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import chaos
import target as counting_target

WARM_UP_S = 60
SAMPLE_EVERY_S = 5


def manifest(port):
    return chaos.manifest(port) + f"""
[[tool]]
name = "balance"
description = "Read the balance."
method = "GET"
url = "http://127.0.0.1:{port}/balance"
"""


def sample(pid):
    rss_kib = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return rss_kib, len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_minute(points):
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def agent_loop(n, connect, python, stop, results):
    rng = random.Random(n)
    agent = chaos.Agent(chaos.agent_command("python" if n % 4 else "typescript", python))
    try:
        if (agent.connect(connect) or {}).get("event") != "connected":
            results.append(("connect", "failed", None, 0))
            return
        i = 0
        while not stop.is_set():
            i += 1
            kind = rng.choice(["read", "read", "pay", "wire", "ssh"])
            intent = int(f"{n + 1:03d}{i:07d}")
            tool, arguments = {
                "read": ("balance", {}),
                "pay": ("pay", {"amount": intent}),
                "wire": ("wire", {"amount": intent}),
                "ssh": ("ssh_exec", {"host": "soak", "command": f"echo {intent}"}),
            }[kind]
            tag = f"c{i}"
            started = time.monotonic()
            agent.send(op="call", tag=tag, tool=tool, arguments=arguments)
            event = agent.expect(lambda e: e["event"] in ("result", "connection_closed") and e.get("tag", tag) == tag, 60)
            elapsed = time.monotonic() - started
            if event is None or event["event"] != "result":
                results.append((kind, "no_answer", None, elapsed))
                if event is None or event["event"] == "agent_exited":
                    return
                agent.connect(connect)
                continue
            structured = event.get("structured") or {}
            code = (structured.get("error") or {}).get("code")
            results.append((kind, structured.get("state") or "error", code, elapsed))
    finally:
        agent.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postern", required=True)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    ledger, target_port = counting_target.serve()
    workdir = Path(tempfile.mkdtemp(prefix="postern-soak-"))
    data_dir = workdir / "data"
    data_dir.mkdir(mode=0o700)
    tools = workdir / "tools.toml"
    tools.write_text(manifest(target_port))
    sshd, ssh_port, key, host_key = chaos.start_sshd(workdir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    gw = chaos.Gateway(args.postern, data_dir, tools, http_port)
    chaos.add_ssh_host(gw, "soak", ssh_port, key, host_key, workdir / "markers")
    gw.start()
    token = gw.cli("agents", "add", "soak").stdout.strip()
    python = sys.executable
    bridge = {"transport": "stdio", "command": gw.postern, "args": ["mcp"],
              "env": {"POSTERN_DATA_DIR": str(data_dir), "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", ""),
                      "PATH": os.environ.get("PATH", "")}}
    http = {"transport": "http", "url": f"http://127.0.0.1:{http_port}/mcp", "token": token}

    stop = threading.Event()
    results = []
    threads = [threading.Thread(target=agent_loop, args=(n, bridge if n % 2 == 0 else http, python, stop, results),
                                daemon=True) for n in range(args.agents)]
    started = time.monotonic()
    for t in threads:
        t.start()
    series = []
    end = started + args.minutes * 60
    while time.monotonic() < end:
        t = round(time.monotonic() - started, 1)
        rss, fds = sample(gw.proc.pid)
        series.append({"t_s": t, "rss_kib": rss, "fds": fds, "answers": len(results)})
        print(f"  t={t:7.1f}s rss={rss / 1024:7.1f} MiB fds={fds:5d} answers={len(results)}", flush=True)
        time.sleep(SAMPLE_EVERY_S)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    elapsed = time.monotonic() - started

    steady = [p for p in series if p["t_s"] >= WARM_UP_S]
    by_kind = defaultdict(list)
    states, codes = Counter(), Counter()
    for kind, state, code, latency in results:
        by_kind[kind].append(latency)
        states[state] += 1
        if code:
            codes[code] += 1
    duplicates = {intent: n for intent, n in ledger.effects.items() if n > 1}
    gw.kill(signal.SIGTERM)
    verify = gw.cli("audit", "verify")
    sshd.terminate()
    figures = {
        "agents": args.agents, "elapsed_s": round(elapsed, 1), "answers": len(results),
        "calls_per_s": round(len(results) / elapsed, 1),
        "rss_mib_first_last": [round(steady[0]["rss_kib"] / 1024, 1), round(steady[-1]["rss_kib"] / 1024, 1)] if steady else None,
        "rss_slope_kib_per_min": round(slope_per_minute([(p["t_s"], p["rss_kib"]) for p in steady]), 1),
        "fds_first_last": [steady[0]["fds"], steady[-1]["fds"]] if steady else None,
        "fds_slope_per_min": round(slope_per_minute([(p["t_s"], p["fds"]) for p in steady]), 2),
        "latency_ms": {k: {"n": len(v), "p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "max": percentile(v, 1.0)}
                       for k, v in sorted(by_kind.items())},
        "states": dict(states), "error_codes": dict(codes),
        "duplicates": len(duplicates), "audit_verify_exit": verify.returncode, "series": series,
    }
    print("soak: " + json.dumps({k: v for k, v in figures.items() if k != "series"}, sort_keys=True), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    failed = []
    if duplicates:
        failed.append(f"duplicate effects at the target: {duplicates}")
    if verify.returncode != 0:
        failed.append(f"audit verify failed: {verify.stdout}{verify.stderr}")
    if states.get("no_answer"):
        failed.append(f"{states['no_answer']} calls got no answer")
    if failed:
        print("soak: FAILED\n  " + "\n  ".join(failed), file=sys.stderr)
        print(f"  data directory kept: {data_dir}", file=sys.stderr)
        sys.exit(1)
    print("soak: passed", flush=True)


if __name__ == "__main__":
    main()
