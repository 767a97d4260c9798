"""Postern's randomized fault campaign: the no-duplicate promise as a measured property.

Real parts only: the `postern serve` binary on a private data directory (real SQLite file, real
Secret Service keychain in the caller's D-Bus session), agents built on the official Python MCP
SDKs (tests/clients/python/agent.py, tests/clients/ts/agent.mjs) over both transports (`postern mcp` bridge and Streamable
HTTP), a counting target with IETF Idempotency-Key semantics and a status endpoint (target.py), and
a real OpenSSH sshd on loopback whose commands append to a ledger file (the SSH tools' effects).

Each schedule is one intent (a unique amount) of one agent process. Its plan is drawn from
`random.Random(f"{seed}:{index}")`: the tool (idempotency-key payment; the same at a target that
forgets a key 1.5 s after answering, under a contract that declares a 1 s retention; status-query
payment, whose status route answers truthfully or, drawn per schedule, 503, 410, a 200 that is not
its JSON, or 409 forever; irreversible wire, also as the built-in `http_request` whose body is
written out anew for every repeat — a JSON text spaced or compact, its members in either order, or
the object; an SSH command under the marker protocol or irreversible; or a tool of an upstream MCP
server — tests/upstreams/counting.py over stdio, Postern's child — that is irreversible, keyed by
an idempotency argument, or hinted `idempotentHint` while every call has an effect), the
transport, a fault at the target for the first request (cut before, reset after the effect, half
an answer, stall beyond the timeout, slow; for an upstream tool, the server killed after the
effect and before its answer), the SDK (Python; TypeScript 1.x at 2025-11-25; the current
TypeScript client at 2026-07-28), the path (as it is; a new connection and request id for every
repeat; over HTTP through a relay run as `nobody`, so the gateway cannot name the process and the
run is the token's — root only; there a killed agent is restarted and its new process repeats
the call), and a fault of a process at a random instant (SIGKILL
of the bridge or of the agent's HTTP connection, SIGKILL or SIGTERM of the gateway then a
restart, SIGKILL of the agent, or a crash point armed at one of the gateway's durable boundaries
— before/after `dispatched` or `completed` is committed, before the send, before the response is
journaled, before the answer leaves — where the gateway aborts as on a power cut; the binary is
built with `--features failpoints`). The agent behaves like a real client: on an error, a dropped
connection or an unknown outcome it reconnects and repeats the same call with the same arguments
until it gets a final answer or the schedule's budget ends.

After every schedule the invariants are checked; any violation prints the seed, the schedule and
the offending execution's journal timeline, and the run fails:
  1. side effects at the target per intent <= 1, and == 1 when the agent was told of a success;
  2. every answer an agent received names an execution whose journal agrees (the execution exists,
     its journal has the state the agent was told, and a result the agent received is the one
     stored);
  3. no execution is left accepted/authorized/dispatched once the schedule settles;
  4. `postern audit verify` exits 0 after every crash and restart, and at the end;
  5. no execution an agent was told about is missing from the journal after a crash.

Usage: chaos.py --postern BIN [--schedules N] [--seed S] [--only INDEX] [--json FILE]
"""

import argparse
import json
import os
import queue
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import target as counting_target

HERE = Path(__file__).resolve().parent
AGENT = HERE.parent / "clients" / "python" / "agent.py"
TS_AGENT = HERE.parent / "clients" / "ts" / "agent.mjs"


def agent_command(sdk, python):
    """The agent process for an SDK: the official Python SDK, or the TypeScript SDK in either
    generation (1.x at 2025-11-25; the current @modelcontextprotocol/client, 2026-07-28), same
    line protocol."""
    if sdk == "python":
        return [python, str(AGENT)]
    if sdk == "python_discover":
        return ["env", "POSTERN_PY_NEGOTIATE=auto", python, str(AGENT)]
    if sdk == "typescript_client":
        return ["env", "POSTERN_TS_SDK=client", "node", str(TS_AGENT)]
    return ["node", str(TS_AGENT)]


SDKS = ["python", "python_discover", "typescript", "typescript_client"]
# How the agent reaches the gateway and repeats: as it is; over a new connection (and a new
# request id) for every repeat; or over HTTP through a TCP relay run as another user, so the
# gateway cannot name the process (the run is the token's).
PATHS = ["plain", "plain", "reconnect_each_retry", "relay"]

RELAY = HERE.parent / "clients" / "relay.py"


def start_relay(gateway_port):
    """A TCP relay to the gateway run as `nobody` (needs root and setpriv); None where it cannot."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None, None
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                             RELAY.read_text(), str(gateway_port)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline().strip())

TOOLS = ["pay", "pay", "wire", "pay_checked", "pay_checked", "pay_brief", "http_wire", "ssh_pay", "ssh_wire",
         "up__pay", "up__charge", "up__set_flag"]
# How the status route of `pay_checked` answers in a schedule: truthfully, or as a target that
# cannot or will not tell (each inconclusive under the contract: nothing may be sent again).
STATUS_MODES = ["truthful", "truthful", "unavailable", "gone", "garbage", "always_in_flight"]


def arguments(tool, intent, rng):
    """The arguments of one call of the schedule's intent. `http_wire` is the built-in
    `http_request`, and its body is written out anew for every attempt, as models do when they
    retry: a JSON text, spaced or not, its members in either order, or the object itself."""
    if tool == "up__set_flag":
        return {"name": intent}
    if tool != "http_wire":
        return {"amount": int(intent)}
    members = [("amount", int(intent)), ("to", "acct_chaos")]
    if rng.random() < 0.5:
        members.reverse()
    body = dict(members)
    form = rng.choice(["spaced", "compact", "object"])
    if form == "spaced":
        body = json.dumps(body)
    elif form == "compact":
        body = json.dumps(body, separators=(",", ":"))
    return {"method": "POST", "url": f"{HTTP_WIRE_BASE[0]}/wire", "body": body}


HTTP_WIRE_BASE = [None]  # the target's base URL, set in main()
# The agent's name for a campaign tool (`http_wire` is the built-in `http_request`).
TOOL_NAMES = {"http_wire": "http_request"}
# The upstream MCP server (tests/upstreams/counting.py) Postern runs as its child.
COUNTING_UPSTREAM = HERE.parent / "upstreams" / "counting.py"
TARGET_FAULTS = ["none", "none", "slow", "stall", "cut_before", "reset_after", "mid_response"]
PROCESS_FAULTS = ["none", "kill_bridge", "kill_bridge", "kill_gateway", "kill_gateway", "term_gateway", "kill_agent",
                  "crash_point", "crash_point"]
# The gateway's crash points at each durable boundary (built with --features failpoints): armed
# for one schedule, the gateway aborts there as on a power cut, and is restarted.
CRASH_POINTS = ["store::commit::before::dispatched", "store::commit::after::dispatched",
                "engine::dispatched::before_send", "engine::observed::before_journal",
                "store::commit::before::completed", "store::commit::after::completed",
                "engine::journaled::before_answer"]
SUCCESS = {"completed", "result_delivered", "completed_result_not_delivered"}
FINAL_WITHOUT_SUCCESS = {"needs_review", "denied"}
UNSETTLED = ("accepted", "authorized", "dispatched")
SCHEDULE_BUDGET_S = 25
ATTEMPTS = 8


def manifest(port, ssh_effects=None):
    base = f"http://127.0.0.1:{port}"
    upstream = '\n[servers.up.tools.charge]\nidempotency_argument = "idempotencyKey"\n'
    schema = '{ type = "object", properties = { amount = { type = "integer" } }, required = ["amount"] }'
    ssh = "" if ssh_effects is None else f"""
[[tool]]
name = "ssh_pay"
description = "Record a payment on the ledger host (checked through its marker if uncertain)."
ssh = {{ host = "chaos", command = "echo {{amount}} >> {ssh_effects} && sleep 0.3" }}
timeout = "2s"
input_schema = {schema}
contract = {{ class = "ssh_marker" }}

[[tool]]
name = "ssh_wire"
description = "Record a wire on the ledger host (irreversible)."
ssh = {{ host = "chaos", command = "echo {{amount}} >> {ssh_effects} && sleep 0.3" }}
timeout = "2s"
input_schema = {schema}
contract = {{ class = "irreversible" }}
"""
    return upstream + ssh + f"""
[[tool]]
name = "pay_checked"
description = "Make a payment; an uncertain attempt is checked at the target's status endpoint."
method = "POST"
url = "{base}/pay_checked"
timeout = "2s"
input_schema = {schema}
contract = {{ class = "status_query", idempotency_header = "Idempotency-Key", status_query = {{ method = "GET", url_template = "{base}/status/{{execution_id}}", done = [{{ status = 200, pointer = "/status_query", equals = true }}], in_flight = [409], never_received = [404] }} }}

[[tool]]
name = "pay_brief"
description = "Make a payment at a target that remembers an idempotency key for 1.5 s."
method = "POST"
url = "{base}/pay_brief"
timeout = "2s"
input_schema = {schema}
contract = {{ class = "idempotency_key", idempotency_header = "Idempotency-Key", key_retention = "1s" }}

[[tool]]
name = "pay"
description = "Make a payment (the target honours Idempotency-Key)."
method = "POST"
url = "{base}/pay"
timeout = "2s"
input_schema = {schema}
contract = {{ class = "idempotency_key", idempotency_header = "Idempotency-Key" }}

[[tool]]
name = "wire"
description = "Send a wire transfer (irreversible)."
method = "POST"
url = "{base}/wire"
timeout = "2s"
input_schema = {schema}
contract = {{ class = "irreversible" }}
"""


class Violation(Exception):
    pass


def start_sshd(workdir):
    """A real OpenSSH sshd on a free loopback port with a client key; returns (proc, port, key, host key)."""
    os.makedirs("/run/sshd", exist_ok=True)
    d = workdir / "sshd"
    d.mkdir()
    for name in ("host_ed25519", "id_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_ed25519'}\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PidFile {d}/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n"
        "MaxStartups 200\nMaxSessions 200\n")
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("sshd did not start")
            time.sleep(0.05)
    return sshd, port, d / "id_ed25519", d / "host_ed25519.pub"


def add_ssh_host(gw, name, port, key, host_key, markers):
    account = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    added = gw.cli("vault", "add-ssh", name, "--address", "127.0.0.1", "--port", str(port), "--user", account,
                   "--key-file", str(key), "--host-key-file", str(host_key), "--marker-dir", str(markers))
    if added.returncode != 0:
        raise SystemExit(f"vault add-ssh failed: {added.stderr}")


def ssh_effects(path, intent):
    """Side effects of the SSH tools for one intent: lines the command appended on the host."""
    try:
        return sum(1 for line in Path(path).read_text().split() if line == intent)
    except FileNotFoundError:
        return 0


class Gateway:
    """`postern serve` on one data directory and one HTTP port, restartable."""

    def __init__(self, postern, data_dir, tools, port):
        self.postern, self.data_dir, self.tools, self.port = postern, data_dir, tools, port
        self.env = dict(os.environ, POSTERN_DATA_DIR=str(data_dir), POSTERN_TOOLS=str(tools), POSTERN_LOG="warn")
        self.proc = None
        self.restarts = 0
        self.log = open(data_dir / "serve.log", "ab")

    def start(self, crash_point=None):
        env = dict(self.env, POSTERN_LOG="info,rmcp=error")
        if crash_point:
            env["FAILPOINTS"] = f"{crash_point}=return"
        self.proc = subprocess.Popen(
            [self.postern, "serve", "--port", str(self.port), "--drain-seconds", "10"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        ready = queue.Queue()

        def pump(pipe, log):
            for line in pipe:
                log.write(line)
                log.flush()
                if b"postern gateway ready" in line:
                    ready.put(True)

        threading.Thread(target=pump, args=(self.proc.stderr, self.log), daemon=True).start()
        try:
            ready.get(timeout=30)
        except queue.Empty:
            raise Violation("postern serve did not become ready (see serve.log)")

    def kill(self, sig):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.restarts += 1

    def crashed(self, within):
        """Whether the gateway process ended (a crash point fired) within `within` seconds."""
        try:
            self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return False
        self.restarts += 1
        return True

    def cli(self, *args):
        return subprocess.run([self.postern, *args], env=self.env, capture_output=True, text=True, timeout=120)

    def db(self):
        return sqlite3.connect(f"file:{self.data_dir / 'postern.db'}?mode=ro", uri=True, timeout=10)

    def verify(self, when):
        run = self.cli("audit", "verify")
        if run.returncode != 0:
            raise Violation(f"audit verify failed {when}: {run.stdout}{run.stderr}")


class Agent:
    """One agent process (official Python or TypeScript SDK) driven line by line."""

    def __init__(self, command):
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.events = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.expect(lambda e: e["event"] == "ready", 30)

    def _pump(self):
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass
        self.events.put({"event": "agent_exited"})

    def send(self, **command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def expect(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return None
            if event["event"] == "agent_exited" or pred(event):
                return event

    def connect(self, command):
        self.send(op="connect", **command)
        return self.expect(
            lambda e: e["event"] in ("connected", "connect_failed") or (e["event"] == "error" and e.get("op") == "connect"),
            30)

    def bridge_pids(self):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def add_upstream(gw, counter_dir):
    """The counting upstream as a vault server, its token a keychain secret."""
    (counter_dir / "expected_token").write_text("chaos-upstream-token")
    run = subprocess.run(
        [gw.postern, "servers", "add", "up", "--env", f"COUNTER_DIR={counter_dir}", "--secret-env", "COUNTER_TOKEN",
         "--", sys.executable, str(COUNTING_UPSTREAM)],
        env=gw.env, input="chaos-upstream-token\n", capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        raise Violation(f"servers add failed: {run.stderr}")


def upstream_effects(counter_dir, intent):
    path = counter_dir / "effects.jsonl"
    if not path.exists():
        return 0
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    return sum(1 for r in records if (r.get("amount") == int(intent) and r.get("kind") in ("pay", "charge"))
               or (r.get("kind") == "set_flag" and r.get("name") == intent))


# The executions of one intent, whichever tool: its amount, an `http_request` body's amount (the
# record holds a JSON body by its value), or the flag an upstream tool sets.
OF_INTENT = ("(json_extract(record, '$.arguments.amount') = :amount "
             "OR json_extract(record, '$.arguments.body.amount') = :amount "
             "OR json_extract(record, '$.arguments.name') = :name)")


def intent_params(intent):
    return {"amount": int(intent), "name": intent}


def timeline(gw, execution_id):
    with gw.db() as db:
        rows = db.execute(
            "SELECT seq, event, state, body FROM journal WHERE execution_id = ? ORDER BY seq", (execution_id,)
        ).fetchall()
    return [{"seq": s, "event": e, "state": st, "detail": json.loads(b)["payload"].get("detail")} for s, e, st, b in rows]


def run_schedule(index, seed, gw, target_port, python, token, figures, told, verbose, only_fault=None,
                 counter_dir=None, relay_port=None):
    rng = random.Random(f"{seed}:{index}")
    tool = rng.choice(TOOLS)
    transport = rng.choice(["stdio", "http"])
    target_fault = rng.choice(TARGET_FAULTS)
    process_fault = rng.choice(PROCESS_FAULTS)
    if only_fault:
        process_fault = only_fault
    fault_at = rng.uniform(0.0, 0.4)
    crash_point = rng.choice(CRASH_POINTS) if process_fault == "crash_point" else None
    sdk = rng.choice(SDKS)
    path = rng.choice(PATHS)
    status_mode = rng.choice(STATUS_MODES) if tool == "pay_checked" else "truthful"
    if path == "relay":
        if relay_port is None:
            path = "plain"
        else:
            transport = "http"
    intent = f"{seed % 100000}{index:06d}"
    plan = {"index": index, "tool": tool, "transport": transport, "target_fault": target_fault,
            "process_fault": process_fault, "fault_at_s": round(fault_at, 3), "intent": intent, "sdk": sdk,
            "path": path}
    if tool == "pay_checked":
        plan["status_route"] = status_mode
        figures["status_routes"][status_mode] += 1
    figures["sdks"][sdk] += 1
    figures["paths"][path] += 1
    figures["tools"][tool] += 1
    if crash_point:
        plan["crash_point"] = crash_point
        figures["crash_points"][crash_point] += 1
        # Re-armed: the gateway restarts with the point armed for this schedule's first call.
        gw.kill(signal.SIGTERM)
        gw.start(crash_point=crash_point)
    die = counter_dir / "die_after_effect"
    die.unlink(missing_ok=True)
    if tool.startswith("up__"):
        # At an upstream server the fault is the server dying after the effect, before its answer.
        target_fault = "upstream_dies" if target_fault in ("reset_after", "mid_response", "stall", "cut_before") else "none"
        plan["target_fault"] = target_fault
        if target_fault == "upstream_dies":
            die.write_text("")
    figures["target_faults"][target_fault] += 1
    figures["process_faults"][process_fault] += 1
    figures["transports"][transport] += 1
    urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{target_port}/_plan", data=json.dumps({"intent": intent, "fault": target_fault, "status": status_mode}).encode(),
        method="POST"), timeout=10).read()

    if transport == "stdio":
        connect = {"transport": "stdio", "command": gw.postern, "args": ["mcp"],
                   "env": {"POSTERN_DATA_DIR": str(gw.data_dir), "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", ""),
                           "PATH": os.environ.get("PATH", "")}}
    else:
        port = relay_port if path == "relay" else gw.port
        connect = {"transport": "http", "url": f"http://127.0.0.1:{port}/mcp", "token": token}
    agent = Agent(agent_command(sdk, python))
    answers = []  # (execution_id, state, result) the agent was told
    sent = []  # the arguments of each attempt
    success = False
    try:
        deadline = time.monotonic() + SCHEDULE_BUDGET_S
        connected = agent.connect(connect)
        if connected is not None and connected.get("event") == "connected":
            plan["protocol"] = connected.get("protocol") or ("stdio" if transport == "stdio" else None)
            figures["protocols"][f"{plan['protocol']}"] += 1
        for attempt in range(ATTEMPTS):
            if time.monotonic() > deadline:
                break
            if attempt > 0 and path == "reconnect_each_retry" and connected is not None:
                # A new connection for every repeat: a new session (or none) and a new request id.
                agent.send(op="drop")
                agent.expect(lambda e: e["event"] == "dropped", 10)
                connected = agent.connect(connect)
            if connected is None or connected["event"] != "connected":
                time.sleep(0.3)
                connected = agent.connect(connect)
                continue
            tag = f"a{attempt}"
            args = arguments(tool, intent, rng)
            if sent and args != sent[-1]:
                figures["rewritten_repeats"] += 1
            sent.append(args)
            agent.send(op="call", tag=tag, tool=TOOL_NAMES.get(tool, tool), arguments=args)
            if attempt == 0 and process_fault != "none":
                time.sleep(fault_at)
                if process_fault == "kill_bridge":
                    if transport == "stdio":
                        for pid in agent.bridge_pids():
                            os.kill(pid, signal.SIGKILL)
                    else:
                        agent.send(op="drop")
                elif process_fault in ("kill_gateway", "term_gateway"):
                    gw.kill(signal.SIGKILL if process_fault == "kill_gateway" else signal.SIGTERM)
                    figures["crashes" if process_fault == "kill_gateway" else "terminations"] += 1
                    gw.start()
                    gw.verify(f"after {process_fault} in schedule {index}")
                    check_nothing_lost(gw, told)
                elif process_fault == "kill_agent":
                    agent.kill()
                    if path != "relay":
                        # A new process is a new run: its repeat would be a new intent.
                        return plan, answers, success
                    # Through the relay the run is the token's: a restarted agent repeats the
                    # call, and the repeat must be matched to the first.
                    figures["agent_restarts"] += 1
                    agent = Agent(agent_command(sdk, python))
                    connected = agent.connect(connect)
                    continue
                elif process_fault == "crash_point":
                    # The point fires if the call reaches it (a target fault may keep it from
                    # getting there); either way the gateway comes back disarmed.
                    if gw.crashed(within=8):
                        figures["crash_points_fired"][crash_point] += 1
                    else:
                        gw.kill(signal.SIGTERM)
                    gw.start()
                    gw.verify(f"after crash point {crash_point} in schedule {index}")
                    check_nothing_lost(gw, told)
            event = agent.expect(lambda e: e["event"] in ("result", "connection_closed") and e.get("tag", tag) == tag, 20)
            if verbose:
                print(f"    attempt {attempt}: {json.dumps(event)[:400]}", flush=True)
            if event is None or event["event"] == "agent_exited":
                break
            if event["event"] == "connection_closed":
                connected = None
                # The call's own result follows: a failure, or an answer that arrived just before
                # the connection ended. An answer the agent received is final for the agent (a
                # repeat after it would be a new intent), so it is taken like any other.
                event = agent.expect(lambda e: e["event"] == "result" and e.get("tag") == tag, 5)
                if verbose:
                    print(f"    after the connection ended: {json.dumps(event)[:400]}", flush=True)
                if event is None or event["event"] == "agent_exited":
                    continue
            if not event["ok"]:
                connected = None
                agent.send(op="drop")
                agent.expect(lambda e: e["event"] == "dropped", 10)
                continue
            s = event.get("structured") or {}
            state = s.get("state")
            answers.append((s.get("execution_id"), state, s.get("result")))
            told.add(s.get("execution_id"))
            if state in SUCCESS and s.get("result") is not None:
                success = True
                break
            if state in FINAL_WITHOUT_SUCCESS:
                break
            time.sleep(0.2 * (attempt + 1))
    finally:
        if agent.proc.poll() is None:
            agent.send(op="exit")
            try:
                agent.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.kill()
    return plan, answers, success


def check_nothing_lost(gw, told):
    with gw.db() as db:
        known = {r[0] for r in db.execute("SELECT id FROM executions")}
    lost = sorted(x for x in told if x and x not in known)
    if lost:
        raise Violation(f"executions an agent was told about are missing from the journal: {lost}")


def check_schedule(gw, ledger, plan, answers, success, effects_file, counter_dir):
    intent = plan["intent"]
    effects = ledger.count(intent) + ssh_effects(effects_file, intent) + upstream_effects(counter_dir, intent)
    with gw.db() as db:
        ids = [r[0] for r in db.execute(f"SELECT id FROM executions WHERE {OF_INTENT} ORDER BY id", intent_params(intent))]
    if effects > 1:
        raise Violation(f"duplicate side effect: the target counted {effects} for one intent", ids)
    if success and effects != 1:
        raise Violation(f"the agent was told of a success but the target counted {effects}", ids)
    for execution_id, state, result in answers:
        if execution_id not in ids:
            raise Violation(f"an answer names {execution_id}, which is not an execution of this intent", ids)
        events = [r["event"] for r in timeline(gw, execution_id)]
        if state not in events:
            raise Violation(f"the agent was told {execution_id} is {state}; its journal says {events}", [execution_id])
        if result is not None:
            with gw.db() as db:
                row = db.execute("SELECT body FROM results WHERE execution_id = ?", (execution_id,)).fetchone()
            if row is None or json.loads(row[0]) != result:
                raise Violation(f"the result the agent received for {execution_id} is not the stored one", [execution_id])
    # 3: nothing left in flight once the schedule settles (an execution of a killed agent may
    # still be finishing; give it the tool's timeout and some).
    deadline = time.monotonic() + 15
    while True:
        with gw.db() as db:
            stuck = [r[0] for r in db.execute(
                f"SELECT id FROM executions WHERE state IN {UNSETTLED} AND {OF_INTENT}", intent_params(intent))]
        if not stuck:
            break
        if time.monotonic() > deadline:
            raise Violation("executions left unsettled", stuck)
        time.sleep(0.2)
    return effects, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postern", required=True)
    ap.add_argument("--schedules", type=int, default=50)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--only", type=int, default=None, help="replay one schedule of the seed")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--verbose", action="store_true", help="print every answer the agent received")
    ap.add_argument("--process-fault", choices=sorted(set(PROCESS_FAULTS)), default=None,
                    help="apply this process fault in every schedule (e.g. crash_point)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"chaos: seed {seed} (replay with --seed {seed})", flush=True)

    ledger, target_port = counting_target.serve()
    workdir = Path(tempfile.mkdtemp(prefix="postern-chaos-"))
    data_dir = workdir / "data"
    data_dir.mkdir(mode=0o700)
    tools = workdir / "tools.toml"
    effects_file = workdir / "ssh_effects"
    tools.write_text(manifest(target_port, effects_file))
    sshd, ssh_port, ssh_key, ssh_host_key = start_sshd(workdir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    gw = Gateway(args.postern, data_dir, tools, http_port)
    add_ssh_host(gw, "chaos", ssh_port, ssh_key, ssh_host_key, workdir / "markers")
    counter_dir = workdir / "upstream"
    counter_dir.mkdir()
    add_upstream(gw, counter_dir)
    gw.start()
    token = gw.cli("agents", "add", "chaos").stdout.strip()
    # `http_request` reaches the target through a bound bearer credential (POST: irreversible).
    HTTP_WIRE_BASE[0] = f"http://127.0.0.1:{target_port}"
    added = subprocess.run([args.postern, "vault", "add", "chaos-api", "--kind", "bearer", "--host",
                            f"127.0.0.1:{target_port}"], env=gw.env, input="chaos-bearer-secret\n",
                           capture_output=True, text=True, timeout=60)
    if added.returncode != 0:
        raise SystemExit(f"vault add failed: {added.stderr}")
    python = sys.executable
    relay, relay_port = start_relay(gw.port)

    figures = {"seed": seed, "schedules": 0, "crashes": 0, "terminations": 0, "duplicates": 0, "violations": 0,
               "rows_lost": 0, "successes": 0, "needs_review": 0, "executions": 0,
               "target_faults": Counter(), "process_faults": Counter(), "transports": Counter(),
               "crash_points": Counter(), "crash_points_fired": Counter(), "sdks": Counter(), "tools": Counter(),
               "paths": Counter(), "protocols": Counter(), "status_routes": Counter(), "rewritten_repeats": 0,
               "agent_restarts": 0}
    told = set()
    indices = [args.only] if args.only is not None else range(args.schedules)
    started = time.monotonic()
    failure = None
    for index in indices:
        plan = {"index": index}
        try:
            plan, answers, success = run_schedule(
                index, seed, gw, target_port, python, token, figures, told, args.verbose, args.process_fault,
                counter_dir, relay_port)
            effects, ids = check_schedule(gw, ledger, plan, answers, success, effects_file, counter_dir)
            figures["schedules"] += 1
            figures["executions"] += len(ids)
            figures["successes"] += int(success)
            figures["needs_review"] += int(any(a[1] == "needs_review" for a in answers))
            print(f"  #{index:4d} {plan['tool']:11} {plan['transport']:5} {plan.get('protocol') or '-':10} "
                  f"{plan['sdk']:17} {plan['path']:20} {plan['target_fault']:12} "
                  f"{plan['process_fault']:12} effects={effects} executions={len(ids)} "
                  f"answer={answers[-1][1] if answers else '-'}" + (f" status_route={plan['status_route']}" if 'status_route' in plan else ""), flush=True)
        except Violation as v:
            figures["violations"] += 1
            if "duplicate" in str(v.args[0]):
                figures["duplicates"] += 1
            if "missing from the journal" in str(v.args[0]):
                figures["rows_lost"] += 1
            failure = (plan, v)
            break
    if failure is None:
        gw.kill(signal.SIGTERM)
        gw.restarts -= 1
        try:
            gw.verify("at the end")
            gw.start()
            check_nothing_lost(gw, told)
            gw.kill(signal.SIGTERM)
        except Violation as v:
            figures["violations"] += 1
            failure = ({"index": "end"}, v)
    elif gw.proc.poll() is None:
        gw.proc.kill()

    sshd.terminate()
    if relay is not None:
        relay.kill()
    # Answers that reached an agent over a resumed stream (Last-Event-ID) instead of a retry.
    with gw.db() as db:
        figures["streams_resumed"] = db.execute("SELECT count(*) FROM journal WHERE event = 'stream_resumed'").fetchone()[0]
    figures["elapsed_s"] = round(time.monotonic() - started, 1)
    figures["target_faults_applied"] = dict(ledger.applied)
    for k in ("target_faults", "process_faults", "transports", "crash_points", "crash_points_fired", "sdks", "tools",
              "paths", "protocols", "status_routes"):
        figures[k] = dict(figures[k])
    print("chaos: " + json.dumps(figures, sort_keys=True), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    if failure is not None:
        plan, v = failure
        print(f"\nchaos: INVARIANT VIOLATED in schedule {plan} (seed {seed}; replay with --seed {seed} "
              f"--only {plan.get('index')})\n  {v.args[0]}", file=sys.stderr)
        for execution_id in (v.args[1] if len(v.args) > 1 else []):
            print(f"  timeline of {execution_id}:", file=sys.stderr)
            for row in timeline(gw, execution_id):
                print(f"    {row['seq']:6} {row['event']:32} {json.dumps(row['detail'])[:160]}", file=sys.stderr)
        print(f"  data directory kept: {data_dir}", file=sys.stderr)
        sys.exit(1)
    print(f"chaos: {figures['schedules']} passed, 0 failed", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
