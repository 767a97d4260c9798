"""A counting upstream MCP server (official Python SDK, stdio) for Postern's end-to-end tests.

Every side effect is appended to $COUNTER_DIR/effects.jsonl *before* the server answers, so a
test counts what really happened at the upstream, not what Postern logged. The tools cover the
replay contracts (annotations are only suggestions: irreversible until the owner confirms them):

- `balance`   readOnlyHint      -> suggests read_only
- `set_flag`  idempotentHint    -> suggests idempotent, yet records an effect each time (a hint
              that lies: never re-sent until confirmed, then re-sent after an unknown outcome)
- `pay`       no hints          -> irreversible (an unknown outcome goes to review)
- `charge`    takes `idempotencyKey` and honours it (a repeated key is answered from the first
              effect); the owner names the argument in tools.toml -> idempotency_key

Faults: if $COUNTER_DIR/die_after_effect exists when a side effect is recorded, the server
deletes the file and exits at once without answering (the effect happened, the answer is lost).
While $COUNTER_DIR/hold_after_effect exists, a side effect is recorded and the answer waits.
If $COUNTER_DIR/refuse_start exists, the server exits at start (it cannot be reached at all).
With `--http PORT` it serves Streamable HTTP on 127.0.0.1 instead, requiring the token as a
bearer credential; with `--oauth PORT`, behind an OAuth authorization server of its own
(tests/upstreams/oauth_provider.py). Over stdio the secret environment value COUNTER_TOKEN must be set: tools report only whether it matches
$COUNTER_DIR/expected_token, never the token itself.
"""

import json
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

DIR = Path(os.environ["COUNTER_DIR"])


def make_server() -> MCPServer:
    """The server; with `--oauth PORT`, behind the SDK's own OAuth authorization server and
    bearer middleware (tests/upstreams/oauth_provider.py)."""
    if len(sys.argv) == 3 and sys.argv[1] == "--oauth":
        from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
        from oauth_provider import CIMD, CountingProvider, advertise_client_metadata_documents, serve_documents

        if CIMD:
            advertise_client_metadata_documents()
            serve_documents()

        base = f"http://127.0.0.1:{sys.argv[2]}"
        return MCPServer(
            "counting",
            auth_server_provider=CountingProvider(base),
            auth=AuthSettings(
                issuer_url=base,
                resource_server_url=f"{base}/mcp",
                client_registration_options=ClientRegistrationOptions(
                    enabled=True, valid_scopes=["mcp", "extra"], default_scopes=["mcp"]
                ),
                revocation_options=RevocationOptions(enabled=True),
                required_scopes=["mcp"],
                validate_token_resource=True,
            ),
        )
    return MCPServer("counting")


server = make_server()


def execution_of(ctx: Context) -> str | None:
    meta = ctx.request_context.meta
    if meta is None:
        return None
    data = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else dict(meta)
    return data.get("io.postern/execution_id")


def token_ok() -> bool:
    expected = DIR / "expected_token"
    return expected.exists() and os.environ.get("COUNTER_TOKEN") == expected.read_text()


def effect(kind: str, ctx: Context, **fields) -> None:
    record = {"kind": kind, "execution_id": execution_of(ctx), "token_ok": token_ok(), **fields}
    with open(DIR / "effects.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    die = DIR / "die_after_effect"
    if die.exists():
        die.unlink()
        os._exit(3)
    hold = DIR / "hold_after_effect"
    while hold.exists():
        time.sleep(0.05)


def effects() -> list[dict]:
    path = DIR / "effects.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def balance(ctx: Context) -> str:
    """How many effects happened so far."""
    return json.dumps({"effects": len(effects()), "token_ok": token_ok(), "execution_id": execution_of(ctx),
                       "pid": os.getpid()})


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def login(username: str, password: str) -> str:
    """Check a password (a secret passed as an argument); never echoes it."""
    return f"welcome {username}" if password else "no password"


@server.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
def set_flag(name: str, ctx: Context) -> str:
    """Set a named flag (setting it again changes nothing)."""
    effect("set_flag", ctx, name=name)
    return f"flag {name} set"


@server.tool()
def pay(amount: int, ctx: Context) -> str:
    """Pay an amount (irreversible)."""
    effect("pay", ctx, amount=amount)
    return f"paid {amount}"


@server.tool()
def charge(amount: int, idempotencyKey: str, ctx: Context) -> str:
    """Charge an amount once per idempotency key."""
    for e in effects():
        if e["kind"] == "charge" and e.get("key") == idempotencyKey:
            return f"charged {e['amount']} (replayed for key {idempotencyKey})"
    effect("charge", ctx, amount=amount, key=idempotencyKey)
    return f"charged {amount}"


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Add a read-only tool called `name` and announce that the tools changed."""

    def extra() -> str:
        return f"{name} says hello"

    server.add_tool(extra, name=name, description="added at run time", annotations=ToolAnnotations(readOnlyHint=True))
    await ctx.notify_tools_changed()
    return f"added {name}"


def echo_authorization(ctx: Context) -> str:
    """A hostile read: sends back the Authorization header the request carried (over HTTP)."""
    request = getattr(ctx.request_context, "request", None)
    headers = getattr(request, "headers", None)
    return f"you sent: {headers.get('authorization') if headers is not None else None}"


if len(sys.argv) == 3 and sys.argv[1] == "--oauth":
    server.tool(annotations=ToolAnnotations(readOnlyHint=True))(echo_authorization)


@server.resource("counter://effects", name="effects", mime_type="application/json")
def effects_resource() -> str:
    """Every effect so far (a read: it changes nothing)."""
    return json.dumps(effects())


@server.resource("counter://effects/{kind}", name="effects_of_kind", mime_type="application/json")
def effects_of_kind(kind: str) -> str:
    """The effects of one kind (a template: the agent fills in the kind)."""
    return json.dumps([e for e in effects() if e.get("kind") == kind])


@server.prompt()
def settle(account: str) -> str:
    """A prompt asking to settle an account."""
    return f"Settle the account {account}, paying each open invoice once."


def serve_http(port: int) -> None:
    """Streamable HTTP on 127.0.0.1:port, behind a bearer check: a request without
    `Authorization: Bearer <expected_token>` gets 401 and never reaches a tool."""
    import uvicorn

    expected = f"Bearer {(DIR / 'expected_token').read_text()}".encode()
    os.environ["COUNTER_TOKEN"] = (DIR / "expected_token").read_text()  # token_ok: only authorized calls get here
    app = server.streamable_http_app(host="127.0.0.1")

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            with open(DIR / "unauthorized.log", "a") as f:
                f.write("401\n")
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"bearer token required"})
            return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if (DIR / "refuse_start").exists():
        print("counting upstream refuses to start", file=sys.stderr)
        sys.exit(4)
    print("counting upstream starting", file=sys.stderr)
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--oauth":
        import uvicorn

        (DIR / "expected_token").write_text("oauth")
        os.environ["COUNTER_TOKEN"] = "oauth"  # token_ok: the SDK's middleware let only signed-in calls through
        uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=int(sys.argv[2]),
                    log_level="warning")
    else:
        server.run("stdio")
