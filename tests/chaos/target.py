"""The chaos campaign's target: a loopback HTTP server that counts side effects per intent.

It implements the IETF Idempotency-Key semantics the `pay` tool's contract relies on (a repeat with
a key already completed replays the stored answer without a second effect; a repeat while the
first is still being processed gets 409), and an irreversible `/wire` endpoint that counts every
request. A fault planned for an intent is applied to that intent's first request only:

  none          answer normally (after a short processing delay)
  slow          answer after a long delay, still inside the tool's timeout
  stall         perform the effect, then hold the answer beyond the tool's timeout
  cut_before    close the connection without reading the request (nothing executed)
  reset_after   perform the effect, then reset the connection (RST) without answering
  mid_response  perform the effect, then send half of the answer and close

`/pay_brief` honours Idempotency-Key like `/pay` but forgets a completed key BRIEF_MEMORY_S after
it answered (as a target with a short key retention does): a same-key request after that is a new
payment. The status route answers as the current schedule's plan says (`status`): truthfully, or
as a target that cannot or will not tell (503, 410, a 200 that is not the route's JSON, a 409
that never ends), whatever it received.

The counts are the ground truth the campaign's invariants are checked against: they are side
effects observed at the target, not log lines.
"""

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROCESSING_S = 0.15
SLOW_S = 0.8
STALL_S = 3.5  # beyond the chaos manifest's 2 s timeout
BRIEF_MEMORY_S = 1.5  # the chaos manifest declares `key_retention = "1s"`, a little less


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.effects = {}  # intent -> count of side effects
        self.by_key = {}  # idempotency key -> ("in_flight", None) | ("done", (status, body), answered at)
        self.status = "truthful"  # how the status route answers during the current schedule
        self.faults = {}  # intent -> fault for its first request
        self.seen = set()  # intents that have had their first request
        self.applied = {}  # fault -> count actually applied

    def plan(self, intent, fault, status="truthful"):
        with self.lock:
            self.faults[intent] = fault
            self.status = status

    def first_fault(self, intent):
        with self.lock:
            if intent in self.seen:
                return "none"
            self.seen.add(intent)
            fault = self.faults.get(intent, "none")
            self.applied[fault] = self.applied.get(fault, 0) + 1
            return fault

    def count(self, intent):
        with self.lock:
            return self.effects.get(intent, 0)

    def effect(self, intent):
        with self.lock:
            n = self.effects.get(intent, 0) + 1
            self.effects[intent] = n
            return n


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    ledger: Ledger = None  # set by serve()

    def log_message(self, *args):
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reset(self):
        # SO_LINGER 0: close sends RST instead of FIN.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def do_GET(self):
        if self.path.startswith("/count/"):
            self._send(200, {"count": self.ledger.count(self.path.rsplit("/", 1)[1])})
        elif self.path == "/balance":
            self._send(200, {"balance": 100})
        elif self.path.startswith("/status/"):
            # What happened to the request with this Idempotency-Key: done (its answer), still
            # being processed (409: cannot tell yet), or never received (404).
            with self.ledger.lock:
                known = self.ledger.by_key.get(self.path.rsplit("/", 1)[1])
                status = self.ledger.status
            if status == "unavailable":
                self._send(503, {"error": "status service unavailable"})
            elif status == "gone":
                self._send(410, {"error": "gone"})
            elif status == "garbage":
                data = b"<html><body>Status</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif status == "always_in_flight":
                self._send(409, {"error": "still being processed"})
            elif known is None:
                self._send(404, {"error": "no request with this key was received"})
            elif known[0] == "in_flight":
                self._send(409, {"error": "still being processed"})
            else:
                self._send(200, dict(known[1][1], status_query=True))
        else:
            self._send(404, {"error": "no such path"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path == "/_plan":
            plan = json.loads(raw)
            self.ledger.plan(str(plan["intent"]), plan["fault"], plan.get("status", "truthful"))
            return self._send(200, {"ok": True})
        if self.path not in ("/pay", "/wire", "/pay_checked", "/pay_brief"):
            return self._send(404, {"error": "no such path"})
        intent = str(json.loads(raw or b"{}").get("amount"))
        fault = self.ledger.first_fault(intent)
        if fault == "cut_before":
            return self._reset()
        key = self.headers.get("Idempotency-Key") if self.path in ("/pay", "/pay_checked", "/pay_brief") else None
        if key is not None:
            with self.ledger.lock:
                known = self.ledger.by_key.get(key)
                if (known is not None and known[0] == "done" and self.path == "/pay_brief"
                        and time.monotonic() - known[2] > BRIEF_MEMORY_S):
                    known = None  # forgotten: this request is a new payment
                if known is None:
                    self.ledger.by_key[key] = ("in_flight", None)
            if known is not None:
                if known[0] == "in_flight":
                    return self._send(409, {"error": "a request with this key is still being processed"})
                status, body = known[1]
                return self._send(status, dict(body, replayed=True))
        n = self.ledger.effect(intent)
        time.sleep({"slow": SLOW_S, "stall": STALL_S}.get(fault, PROCESSING_S))
        body = {"intent": intent, "effect": n}
        if key is not None:
            with self.ledger.lock:
                self.ledger.by_key[key] = ("done", (201, body), time.monotonic())
        if fault == "reset_after":
            return self._reset()
        if fault == "mid_response":
            data = json.dumps(body).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self._reset()
        self._send(201, body)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client gone mid-answer (the gateway timed out or was killed) is part of the plan


def serve():
    """Starts the target on a free loopback port; returns (ledger, port)."""
    ledger = Ledger()
    handler = type("BoundHandler", (Handler,), {"ledger": ledger})
    server = QuietServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return ledger, server.server_address[1]
