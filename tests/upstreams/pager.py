"""A hostile upstream MCP server over stdio, written against the wire (standard library only):
what the SDKs will not let a server do.

  pager.py endless      tools/list always answers with a nextCursor: a list that never ends.
  pager.py relist-hang  lists one tool, `poke`; after each call to it, says its tools changed
                        and then never answers tools/list again.
"""

import json
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "endless"
POKE = {"name": "poke", "description": "answers", "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True}}
listed = 0


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "pager", "version": "1"},
        }})
    elif method == "tools/list":
        listed += 1
        if MODE == "endless":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [POKE], "nextCursor": f"page-{listed}"}})
        elif listed == 1:
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [POKE]}})
        # relist-hang: every later list is never answered.
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "poked"}]}})
        if MODE == "relist-hang":
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
