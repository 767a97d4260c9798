// A scriptable MCP agent built on the official TypeScript SDK, in either generation: the
// 2025-era @modelcontextprotocol/sdk (1.x), or with POSTERN_TS_SDK=client the current
// @modelcontextprotocol/client (2.x, which speaks 2026-07-28). Same line protocol as
// ../python/agent.py: JSON commands on stdin, JSON events on stdout. The process stays alive
// across connections, so a test can break its connection and watch the same agent process
// reconnect and retry.
import { createInterface } from "node:readline";

const current = process.env.POSTERN_TS_SDK === "client";
const { Client, StreamableHTTPClientTransport } = current
  ? await import("@modelcontextprotocol/client")
  : {
      ...(await import("@modelcontextprotocol/sdk/client/index.js")),
      ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
    };
const { StdioClientTransport } = current
  ? await import("@modelcontextprotocol/client/stdio")
  : await import("@modelcontextprotocol/sdk/client/stdio.js");
const sdk = current ? "@modelcontextprotocol/client" : "@modelcontextprotocol/sdk";

const emit = (event) => process.stdout.write(JSON.stringify(event) + "\n");

let client = null;
let transport = null;

async function connect(cmd) {
  await drop();
  if (cmd.transport === "stdio") {
    transport = new StdioClientTransport({ command: cmd.command, args: cmd.args ?? [], env: cmd.env, stderr: "inherit" });
  } else {
    transport = new StreamableHTTPClientTransport(new URL(cmd.url), {
      requestInit: { headers: { Authorization: `Bearer ${cmd.token}` } },
    });
  }
  // The current client negotiates the protocol as a new agent does: `server/discover`, then
  // 2026-07-28 (the 1.x SDK has only the 2025 `initialize` handshake).
  const options = current ? { versionNegotiation: { mode: "auto" } } : undefined;
  client = new Client({ name: "postern-ts-agent", version: "1.0.0" }, options);
  transport.onclose = () => emit({ event: "connection_closed" });
  await client.connect(transport);
  const protocol = transport.protocolVersion ?? client.getNegotiatedProtocolVersion?.() ?? null;
  emit({ event: "connected", protocol, sdk, server: client.getServerVersion()?.name, pid: process.pid });
}

async function drop() {
  const c = client;
  client = null;
  transport = null;
  if (c) {
    try {
      await c.close();
    } catch (e) {
      emit({ event: "drop_error", error: String(e) });
    }
  }
}

async function call(cmd) {
  try {
    if (!client) throw new Error("not connected");
    const params = { name: cmd.tool, arguments: cmd.arguments ?? {} };
    // 1.x takes a result schema before the options; 2.x takes the options.
    const result = current
      ? await client.callTool(params, { timeout: 60000 })
      : await client.callTool(params, undefined, { timeout: 60000 });
    emit({
      event: "result",
      tag: cmd.tag,
      ok: true,
      is_error: Boolean(result.isError),
      structured: result.structuredContent ?? null,
      text: (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text),
    });
  } catch (e) {
    emit({ event: "result", tag: cmd.tag, ok: false, error: `${e?.name}: ${e?.message}` });
  }
}

async function tools() {
  const listed = await client.listTools();
  emit({
    event: "tools",
    tools: listed.tools.map((t) => ({ name: t.name, description: t.description, annotations: t.annotations ?? null })),
  });
}

emit({ event: "ready", pid: process.pid });
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const cmd = JSON.parse(line);
  try {
    if (cmd.op === "connect") await connect(cmd);
    else if (cmd.op === "call") call(cmd);
    else if (cmd.op === "drop") {
      await drop();
      emit({ event: "dropped" });
    } else if (cmd.op === "tools") await tools();
    else if (cmd.op === "exit") break;
  } catch (e) {
    emit({ event: "error", op: cmd.op, error: `${e?.name}: ${e?.message}` });
  }
}
await drop();
process.exit(0);
