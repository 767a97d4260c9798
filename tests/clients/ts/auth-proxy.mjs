// A loopback proxy that adds `Authorization: Bearer <token>` to every request, for tools that
// cannot send one (the MCP conformance suite). Everything else (Host, Origin, bodies, SSE
// streams) passes through unchanged, so Postern's own checks still apply.
// Usage: node auth-proxy.mjs <upstream-url> <token>; prints the listening port on stdout.
import http from "node:http";

const [upstream, token] = process.argv.slice(2);
const target = new URL(upstream);

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${token}` };
  const forward = http.request(
    { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    },
  );
  forward.on("error", (e) => {
    if (!res.headersSent) res.writeHead(502);
    res.end(String(e));
  });
  req.pipe(forward);
  res.on("close", () => forward.destroy());
});
server.listen(0, "127.0.0.1", () => process.stdout.write(`${server.address().port}\n`));
