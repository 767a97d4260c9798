"""An OTLP/HTTP receiver for Postern's tests, decoding with the official `opentelemetry-proto`
package (PyPI): what Postern exports, read as an OpenTelemetry Collector would read it.

Usage: receiver.py PORT DIR. It serves POST /v1/traces and /v1/logs (protobuf), answers 200 with
an empty Export*ServiceResponse, and appends to DIR:
  spans.jsonl  one JSON object per span: ids (hex), name, kind, times, status, attributes,
               events (name, time, attributes), the resource's attributes
  logs.jsonl   one JSON object per log record: times, severity, body, event name, attributes,
               trace and span ids, the resource's attributes
  raw.bin      every request body as received (for the canary search)
  requests.log one line per request: path and status
With the file DIR/refuse present it answers 503 (an endpoint that is there but failing); with
DIR/reject present, 400 (a refusal sending again cannot change).
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PORT, DIR = int(sys.argv[1]), sys.argv[2]
LOCK = Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def append(name, rows):
    with LOCK, open(os.path.join(DIR, name), "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with LOCK, open(os.path.join(DIR, "raw.bin"), "ab") as f:
            f.write(body)
        if os.path.exists(os.path.join(DIR, "refuse")):
            self.answer(503, b"")
            return
        if os.path.exists(os.path.join(DIR, "reject")):
            self.answer(400, b"")
            return
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            rows = []
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        rows.append({
                            "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(), "name": s.name, "kind": s.kind,
                            "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                            "status": {"code": s.status.code, "message": s.status.message},
                            "attributes": attributes(s.attributes),
                            "events": [{"name": e.name, "time": e.time_unix_nano, "attributes": attributes(e.attributes)}
                                       for e in s.events],
                            "scope": ss.scope.name, "resource": resource,
                        })
            append("spans.jsonl", rows)
            self.answer(200, ExportTraceServiceResponse().SerializeToString())
        elif self.path == "/v1/logs":
            request = ExportLogsServiceRequest()
            request.ParseFromString(body)
            rows = []
            for rl in request.resource_logs:
                resource = attributes(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        rows.append({
                            "time": r.time_unix_nano, "observed": r.observed_time_unix_nano,
                            "severity_number": r.severity_number, "severity_text": r.severity_text,
                            "body": value(r.body), "event_name": r.event_name,
                            "attributes": attributes(r.attributes),
                            "trace_id": r.trace_id.hex(), "span_id": r.span_id.hex(), "resource": resource,
                        })
            append("logs.jsonl", rows)
            self.answer(200, ExportLogsServiceResponse().SerializeToString())
        else:
            self.answer(404, b"")

    def answer(self, status, body):
        with LOCK, open(os.path.join(DIR, "requests.log"), "a") as f:
            f.write(f"{self.path} {status}\n")
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    print(f"otlp receiver on {PORT}", file=sys.stderr, flush=True)
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
