// A scriptable MCP agent built on the official TypeScript SDK (@modelcontextprotocol/sdk).
// Same line protocol as ../python/agent.py: JSON commands on stdin, JSON events on stdout. The
// process stays alive across connections, so a test can break its connection and watch the same
// agent process reconnect and retry.
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

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
  client = new Client({ name: "postern-ts-agent", version: "1.0.0" });
  transport.onclose = () => emit({ event: "connection_closed" });
  await client.connect(transport);
  emit({ event: "connected", protocol: transport.protocolVersion ?? null, server: client.getServerVersion()?.name, pid: process.pid });
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
    const result = await client.callTool({ name: cmd.tool, arguments: cmd.arguments ?? {} }, undefined, { timeout: 60000 });
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
