//! End-to-end rig for the MCP gateway: a real `postern serve` process, a loopback HTTP target
//! that counts what reaches it (and can hold its answer), and agents built on the official MCP
//! SDKs (Python `mcp`, TypeScript `@modelcontextprotocol/sdk`) driven line by line.

use serde_json::{Value, json};
use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

/// The conformance scenarios that apply to Postern (docs/src/guide/agents.md lists why the others do not).
pub const CONFORMANCE_SCENARIOS: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub use postern_testkit::eventually;

// ---------------------------------------------------------------------------------------------
// The target: a loopback payments API that counts what reaches it (postern-testkit).

pub use postern_testkit::target::Target;

// ---------------------------------------------------------------------------------------------
// The gateway

/// A running `postern serve`.
pub struct Gateway {
    pub data_dir: tempfile::TempDir,
    pub child: Child,
    pub http: String,
    pub stderr: Arc<Mutex<String>>,
}

pub fn postern_bin() -> &'static str {
    env!("CARGO_BIN_EXE_postern")
}

impl Gateway {
    pub fn start(manifest: &str) -> Gateway {
        let data_dir = tempfile::tempdir().unwrap();
        Self::start_in(data_dir, manifest)
    }

    pub fn start_in(data_dir: tempfile::TempDir, manifest: &str) -> Gateway {
        Self::start_with(data_dir, manifest, &[])
    }

    /// Starts a gateway with extra environment (e.g. `FAILPOINTS` in fault-test builds).
    pub fn start_with(data_dir: tempfile::TempDir, manifest: &str, env: &[(&str, &str)]) -> Gateway {
        let tools = data_dir.path().join("tools.toml");
        std::fs::write(&tools, manifest).unwrap();
        let tools = tools.to_str().unwrap().to_owned();
        Self::spawn(data_dir, &[env, &[("POSTERN_TOOLS", tools.as_str())]].concat())
    }

    /// `postern serve` as a newcomer runs it: no manifest anywhere (`config_home` is empty), so
    /// the built-in tools.
    pub fn start_without_manifest(data_dir: tempfile::TempDir, config_home: &Path) -> Gateway {
        Self::spawn(data_dir, &[("XDG_CONFIG_HOME", config_home.to_str().unwrap())])
    }

    fn spawn(data_dir: tempfile::TempDir, env: &[(&str, &str)]) -> Gateway {
        let mut child = Command::new(postern_bin())
            .env_remove("POSTERN_TOOLS")
            .envs(env.iter().copied())
            .args(["serve", "--port", "0", "--drain-seconds", "20"])
            .env("POSTERN_DATA_DIR", data_dir.path())
            .env("POSTERN_LOG", "info,rmcp=error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&stderr);
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if line.contains("postern gateway ready") {
                    let _ = tx.send(line.clone());
                }
                let mut all = sink.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        let ready = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!("postern serve did not start:\n{}", stderr.lock().unwrap());
        });
        let http =
            ready.split("http=").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().trim_matches('"').to_owned();
        Gateway { data_dir, child, http, stderr }
    }

    pub fn path(&self) -> &Path {
        self.data_dir.path()
    }

    /// Kills this gateway (SIGKILL: no clean shutdown) and starts a new one on the same data.
    pub fn crash_and_restart(self, manifest: &str) -> Gateway {
        self.crash_and_restart_with(manifest, &[])
    }

    /// [`Gateway::crash_and_restart`], the new one with extra environment.
    pub fn crash_and_restart_with(mut self, manifest: &str, env: &[(&str, &str)]) -> Gateway {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = tempfile::TempDir::new().unwrap();
        let data_dir = std::mem::replace(&mut self.data_dir, dir);
        Gateway::start_with(data_dir, manifest, env)
    }

    /// `postern` with this gateway's data directory.
    pub fn postern(&self, args: &[&str]) -> super::support::Run {
        super::support::postern(args, Some(self.path()))
    }

    /// The command an agent runs to reach this gateway over stdio.
    pub fn bridge_command(&self) -> Value {
        json!({
            "transport": "stdio",
            "command": postern_bin(),
            "args": ["mcp"],
            "env": {
                "POSTERN_DATA_DIR": self.path(),
                "XDG_RUNTIME_DIR": std::env::var("XDG_RUNTIME_DIR").unwrap_or_default(),
            },
        })
    }

    pub fn add_agent(&self, name: &str) -> String {
        let run = self.postern(&["agents", "add", name]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        run.stdout.trim().to_owned()
    }

    pub fn http_command(&self, token: &str) -> Value {
        json!({ "transport": "http", "url": self.http, "token": token })
    }

    /// Every execution in the journal, oldest first (`postern activity --json` reads it while
    /// the gateway runs).
    pub fn executions_of(&self, tool: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .activity()
            .iter()
            .filter(|row| row["event"] == "accepted" && row["detail"]["tool"] == tool)
            .map(|row| row["execution_id"].as_str().unwrap().to_owned())
            .collect();
        ids.dedup();
        ids
    }

    pub fn activity(&self) -> Vec<Value> {
        let run = self.postern(&["activity", "--json", "--limit", "10000"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        serde_json::from_str(&run.stdout).unwrap()
    }

    pub fn events_of(&self, execution: &str) -> Vec<String> {
        self.activity()
            .iter()
            .filter(|r| r["execution_id"] == execution)
            .map(|r| r["event"].as_str().unwrap().to_owned())
            .collect()
    }

    pub fn sessions(&self) -> Vec<Value> {
        let run = self.postern(&["sessions", "--json"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        serde_json::from_str(&run.stdout).unwrap()
    }

    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status().unwrap();
        assert!(ok.success());
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The agents

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sdk {
    /// The Python SDK (`mcp`, as pinned in tests/clients/python).
    Python,
    /// The 2025-era TypeScript SDK, `@modelcontextprotocol/sdk` 1.x (2025-11-25).
    TypeScript,
    /// The current TypeScript client, `@modelcontextprotocol/client` 2.x (2026-07-28).
    TypeScriptClient,
    /// The Python SDK negotiating as its `Client(mode="auto")` does: `server/discover`, so
    /// 2026-07-28 (sessionless) with Postern.
    PythonDiscover,
}

/// One agent process built on an official MCP SDK.
pub struct Agent {
    pub child: Child,
    stdin: ChildStdin,
    events: mpsc::Receiver<Value>,
    backlog: Vec<Value>,
    pub pid: u32,
}

fn python() -> PathBuf {
    let venv = repo_root().join("tests/clients/python/.venv/bin/python");
    assert!(venv.exists(), "the Python MCP SDK is not installed: run the tests through scripts/test.sh");
    venv
}

fn node_script() -> PathBuf {
    let modules = repo_root().join("tests/clients/ts/node_modules/@modelcontextprotocol/sdk");
    assert!(modules.exists(), "the TypeScript MCP SDK is not installed: run the tests through scripts/test.sh");
    repo_root().join("tests/clients/ts/agent.mjs")
}

impl Agent {
    pub fn start(sdk: Sdk) -> Agent {
        let mut cmd = match sdk {
            Sdk::Python => {
                let mut c = Command::new(python());
                c.arg(repo_root().join("tests/clients/python/agent.py"));
                c
            }
            Sdk::PythonDiscover => {
                let mut c = Command::new(python());
                c.arg(repo_root().join("tests/clients/python/agent.py")).env("POSTERN_PY_NEGOTIATE", "auto");
                c
            }
            Sdk::TypeScript => {
                let mut c = Command::new("node");
                c.arg(node_script());
                c
            }
            Sdk::TypeScriptClient => {
                let mut c = Command::new("node");
                c.arg(node_script()).env("POSTERN_TS_SDK", "client");
                c
            }
        };
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                    Err(_) => panic!("the agent wrote a line that is not JSON: {line}"),
                }
            }
        });
        let pid = child.id();
        let mut agent = Agent { child, stdin, events, backlog: Vec::new(), pid };
        agent.expect("ready", |e| e["event"] == "ready");
        agent
    }

    pub fn send(&mut self, command: Value) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the first event (past or future) matching `pred`, and consumes it.
    pub fn expect(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return self.backlog.remove(i);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self
                .events
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the agent never reported {what}; saw {:?}", self.backlog));
            if pred(&event) {
                return event;
            }
            self.backlog.push(event);
        }
    }

    pub fn connect(&mut self, command: Value) -> Value {
        let mut command = command;
        command["op"] = json!("connect");
        self.send(command);
        self.expect("connected", |e| {
            e["event"] == "connected"
                || e["event"] == "connect_failed"
                || (e["event"] == "error" && e["op"] == "connect")
        })
    }

    /// Starts a call; its answer is collected with [`Agent::result`].
    pub fn call(&mut self, tag: &str, tool: &str, arguments: Value) {
        self.send(json!({ "op": "call", "tag": tag, "tool": tool, "arguments": arguments }));
    }

    /// A call with a request `_meta` (a W3C `traceparent`, say).
    pub fn call_with_meta(&mut self, tag: &str, tool: &str, arguments: Value, meta: Value) {
        self.send(json!({ "op": "call", "tag": tag, "tool": tool, "arguments": arguments, "meta": meta }));
    }

    pub fn result(&mut self, tag: &str) -> Value {
        self.expect(&format!("the result of {tag}"), |e| e["event"] == "result" && e["tag"] == tag)
    }

    pub fn call_and_wait(&mut self, tag: &str, tool: &str, arguments: Value) -> Value {
        self.call(tag, tool, arguments);
        self.result(tag)
    }

    /// Runs `postern ARGS` as a child of the agent's own process (as an agent's shell tool would),
    /// on `gateway`'s data directory; the `ran` event (code, stdout, stderr).
    pub fn run_postern(&mut self, tag: &str, gateway: &Gateway, args: &[&str]) -> Value {
        self.run_postern_via(tag, gateway, &[], args)
    }

    /// [`Agent::run_postern`] through `wrapper` (`setsid`: in a session of its own, as Node's
    /// `detached: true` or Python's `start_new_session` would start it).
    pub fn run_postern_via(&mut self, tag: &str, gateway: &Gateway, wrapper: &[&str], args: &[&str]) -> Value {
        let argv: Vec<&str> =
            wrapper.iter().copied().chain(std::iter::once(postern_bin())).chain(args.iter().copied()).collect();
        self.send(json!({ "op": "run", "tag": tag, "argv": argv, "env": {
            "POSTERN_DATA_DIR": gateway.path(),
            "XDG_RUNTIME_DIR": std::env::var("XDG_RUNTIME_DIR").unwrap_or_default(),
        } }));
        self.expect("the command to end", |e| e["event"] == "ran" && e["tag"] == tag)
    }

    pub fn drop_connection(&mut self) {
        self.send(json!({ "op": "drop" }));
        self.expect("dropped", |e| e["event"] == "dropped");
    }

    pub fn tools(&mut self) -> Value {
        self.send(json!({ "op": "tools" }));
        self.expect("tools", |e| e["event"] == "tools")
    }

    /// The `postern mcp` bridge this agent started (its child process).
    pub fn bridge_pid(&self) -> u32 {
        eventually("the bridge process", Duration::from_secs(10), || children_of(self.pid).into_iter().next())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes whose parent is `pid` and that run the `postern` binary.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let ppid: Option<u32> = after.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        let exe = std::fs::read_link(format!("/proc/{child}/exe")).ok();
        if ppid == Some(pid) && exe.is_some_and(|e| e.file_name().is_some_and(|n| n == "postern")) {
            out.push(child);
        }
    }
    out
}

/// Freezes a process (SIGSTOP): it holds whatever it has read and writes nothing.
pub fn freeze(pid: u32) {
    let ok = Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    assert!(ok.success());
}

pub fn kill(pid: u32) {
    let ok = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(ok.success());
}

pub fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// A small real filesystem (tmpfs) for a data directory, so a test can run the disk full and
/// free it again. Needs the right to mount (root, as CI runs).
pub struct SmallDisk {
    mount: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(bytes: u64) -> SmallDisk {
        let mount = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(mount.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a {bytes}-byte tmpfs needs root (CI runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { mount }
    }

    pub fn data_dir(&self) -> tempfile::TempDir {
        tempfile::tempdir_in(self.mount.path()).unwrap()
    }

    fn filler(&self) -> PathBuf {
        self.mount.path().join("filler")
    }

    /// Writes a file until the filesystem says it is full.
    pub fn fill(&self) {
        let mut f = std::fs::File::create(self.filler()).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }

    pub fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.mount.path()).status();
    }
}

/// A TCP relay between agents and a gateway's HTTP endpoint that can cut every connection it
/// carries: the network dropping under a client, which (unlike the client closing) leaves the
/// client free to reconnect. New connections wait (up to 30 s) for the gateway to be reachable,
/// so a restarted gateway can be put behind the same address with [`CutProxy::point_at`].
pub struct CutProxy {
    addr: std::net::SocketAddr,
    upstream: Arc<Mutex<std::net::SocketAddr>>,
    open: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl CutProxy {
    pub fn start(gateway: &Gateway) -> CutProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let proxy = CutProxy {
            addr,
            upstream: Arc::new(Mutex::new(Self::endpoint(gateway))),
            open: Arc::new(Mutex::new(Vec::new())),
        };
        let (upstream, open) = (Arc::clone(&proxy.upstream), Arc::clone(&proxy.open));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let (upstream, open) = (Arc::clone(&upstream), Arc::clone(&open));
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let server = loop {
                        let to = *upstream.lock().unwrap();
                        match std::net::TcpStream::connect(to) {
                            Ok(s) => break s,
                            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                            Err(_) => return,
                        }
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    {
                        let mut open = open.lock().unwrap();
                        open.push(client.try_clone().unwrap());
                        open.push(server.try_clone().unwrap());
                    }
                    let relay = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Both);
                            let _ = from.shutdown(std::net::Shutdown::Both);
                        })
                    };
                    relay(client.try_clone().unwrap(), server.try_clone().unwrap());
                    relay(server, client);
                });
            }
        });
        proxy
    }

    fn endpoint(gateway: &Gateway) -> std::net::SocketAddr {
        let authority = gateway.http.trim_start_matches("http://").split('/').next().unwrap();
        authority.parse().unwrap()
    }

    /// The URL agents use instead of the gateway's own.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Cuts every connection open now (both directions, both sides).
    pub fn cut(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// New connections go to `gateway` from now on.
    pub fn point_at(&self, gateway: &Gateway) {
        *self.upstream.lock().unwrap() = Self::endpoint(gateway);
    }
}
