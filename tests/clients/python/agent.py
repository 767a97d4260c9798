"""A scriptable MCP agent built on the official Python SDK (`mcp` on PyPI).

Postern's end-to-end tests drive it through stdin, one JSON command per line, and read one JSON
event per line from stdout. The agent process stays alive across connections, which is the
point: its connection can break (bridge killed, HTTP connection cut) and the same process
reconnects and retries.

Commands:
  {"op": "connect", "transport": "stdio", "command": "...", "args": [...], "env": {...}}
  {"op": "connect", "transport": "http", "url": "...", "token": "..."}
  {"op": "call", "tag": "t1", "tool": "...", "arguments": {...}, "meta": {...}}   (answered later, by tag;
                          "meta", optional, is the request's `_meta`, e.g. a W3C "traceparent")
  {"op": "drop"}          close the connection (cancels calls in flight)
  {"op": "tools"}         list tools
  {"op": "run", "tag": "r1", "argv": [...], "env": {...}}   run a command as a child of the agent
                          (as an agent's shell tool would); answers {"event": "ran", "code", "stdout", "stderr"}
  {"op": "exit"}
Events: {"event": "...", ...}; a call answers {"event": "result", "tag": ..., "ok": bool, ...}.

With POSTERN_PY_NEGOTIATE=auto it negotiates as the SDK's `Client(mode="auto")` does
(`server/discover`, so 2026-07-28 where the server speaks it); otherwise it performs the
2025-11-25 initialize handshake.
"""

import json
import os
import sys
from contextlib import AsyncExitStack

import anyio
import httpx2
from mcp.client._probe import negotiate_auto
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Agent:
    """Each connection lives in its own task, which enters and leaves the SDK's context managers
    (anyio requires both in one task); `drop` asks that task to close and waits for it."""

    def __init__(self, tg):
        self.tg = tg
        self.listening = False
        self.session = None
        self.close = None
        self.closed = None

    async def _hold(self, cmd, ready):
        self.close, self.closed = anyio.Event(), anyio.Event()
        close, closed = self.close, self.closed
        try:
            async with AsyncExitStack() as stack:
                if cmd["transport"] == "stdio":
                    params = StdioServerParameters(command=cmd["command"], args=cmd.get("args", []), env=cmd.get("env"))
                    read, write = await stack.enter_async_context(stdio_client(params))
                else:
                    headers = {"Authorization": f"Bearer {cmd['token']}"}
                    client = await stack.enter_async_context(
                        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60))
                    )
                    read, write = await stack.enter_async_context(streamable_http_client(cmd["url"], http_client=client))
                session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._on_message))
                if os.environ.get("POSTERN_PY_NEGOTIATE") == "auto":
                    # The SDK's own `mode="auto"`: `server/discover` at the newest revision
                    # (2026-07-28, sessionless), the initialize handshake only where refused.
                    await negotiate_auto(session)
                else:
                    await session.initialize()
                protocol = session.protocol_version
                self.session = session
                server = session.server_info.name if session.server_info else None
                emit(event="connected", protocol=str(protocol), server=server, pid=os.getpid())
                ready.set()
                await close.wait()  # then the stack unwinds, in this task
        except BaseException as e:
            emit(event="connection_closed" if ready.is_set() else "connect_failed", error=f"{type(e).__name__}: {e!r}")
            if not isinstance(e, Exception):
                raise
        finally:
            self.session = None
            ready.set()
            closed.set()

    async def connect(self, cmd):
        await self.drop()
        ready = anyio.Event()
        self.tg.start_soon(self._hold, cmd, ready)
        await ready.wait()

    async def drop(self):
        if self.close is not None:
            self.close.set()
            await self.closed.wait()
            self.close = self.closed = None

    async def call(self, cmd):
        session = self.session
        try:
            if session is None:
                raise RuntimeError("not connected")
            result = await session.call_tool(
                cmd["tool"], cmd.get("arguments", {}), read_timeout_seconds=60, meta=cmd.get("meta")
            )
            emit(
                event="result",
                tag=cmd.get("tag"),
                ok=True,
                is_error=bool(result.is_error),
                structured=result.structured_content,
                text=[c.text for c in result.content if getattr(c, "type", "") == "text"],
            )
        except BaseException as e:
            emit(event="result", tag=cmd.get("tag"), ok=False, error=f"{type(e).__name__}: {e}")
            if not isinstance(e, Exception):
                raise

    async def read(self, cmd):
        """Resources and prompts: list them, read one resource, get one prompt."""
        session, what = self.session, cmd["what"]
        try:
            if what == "resources":
                listed = await session.list_resources()
                data = [{"uri": str(r.uri), "name": r.name} for r in listed.resources]
            elif what == "templates":
                listed = await session.list_resource_templates()
                data = [{"uri_template": t.uri_template, "name": t.name} for t in listed.resource_templates]
            elif what == "resource":
                read = await session.read_resource(cmd["uri"])
                data = [{"uri": str(c.uri), "text": getattr(c, "text", None)} for c in read.contents]
            elif what == "prompts":
                listed = await session.list_prompts()
                data = [{"name": p.name} for p in listed.prompts]
            else:
                got = await session.get_prompt(cmd["name"], cmd.get("arguments"))
                data = [{"role": m.role, "text": getattr(m.content, "text", None)} for m in got.messages]
            emit(event="read", what=what, ok=True, data=data)
        except Exception as e:
            emit(event="read", what=what, ok=False, error=f"{type(e).__name__}: {e}")

    async def _on_message(self, message):
        """Server notifications on protocols before 2026-07-28 (unscoped)."""
        root = getattr(message, "root", message)
        if self.listening and getattr(root, "method", None) == "notifications/tools/list_changed":
            emit(event="tools_changed")

    async def listen(self):
        """Listens for tool-list changes (subscriptions/listen on 2026-07-28, else the unscoped
        notification through the session's message handler) and reports each one."""
        session = self.session
        if str(session.protocol_version) != "2026-07-28":
            self.listening = True
            emit(event="listening", how="notification")
            return

        async def run():
            try:
                from mcp.client.subscriptions import listen

                async with listen(session, tools_list_changed=True) as subscription:
                    emit(event="listening", how="subscriptions/listen")
                    async for _event in subscription:
                        emit(event="tools_changed")
            except Exception as e:
                emit(event="listen_failed", error=f"{type(e).__name__}: {e}")

        self.tg.start_soon(run)

    async def tools(self):
        listed = await self.session.list_tools()
        emit(
            event="tools",
            tools=[
                {
                    "name": t.name,
                    "description": t.description,
                    "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else None,
                }
                for t in listed.tools
            ],
        )


async def main():
    async with anyio.create_task_group() as tg:
        agent = Agent(tg)
        stdin = anyio.wrap_file(sys.stdin)
        emit(event="ready", pid=os.getpid())
        async for line in stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd["op"]
            try:
                if op == "connect":
                    await agent.connect(cmd)
                elif op == "call":
                    tg.start_soon(agent.call, cmd)
                elif op == "drop":
                    await agent.drop()
                    emit(event="dropped")
                elif op == "tools":
                    await agent.tools()
                elif op == "read":
                    await agent.read(cmd)
                elif op == "listen":
                    await agent.listen()
                elif op == "run":
                    env = {**os.environ, **cmd.get("env", {})}
                    done = await anyio.run_process(cmd["argv"], env=env, check=False)
                    emit(event="ran", tag=cmd.get("tag"), code=done.returncode,
                         stdout=done.stdout.decode(errors="replace"), stderr=done.stderr.decode(errors="replace"))
                elif op == "exit":
                    break
            except Exception as e:
                emit(event="error", op=op, error=f"{type(e).__name__}: {e}")
        await agent.drop()
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
