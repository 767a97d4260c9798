//! The approval ladder end to end: `postern serve --approver terminal` on a real pseudo-terminal
//! (the test types the reviewer's answers), driven by a real MCP client (the Python SDK).

use super::gateway_support::{Agent, Gateway, Sdk, Target, eventually, kill, postern_bin};
use serde_json::{Value, json};
use std::{
    fs::File,
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

const LONG: Duration = Duration::from_secs(30);

/// A pseudo-terminal the gateway runs on: what it shows, and a keyboard.
struct Terminal {
    master: File,
    screen: Arc<Mutex<String>>,
    /// How much of the screen earlier waits consumed.
    read_to: usize,
}

impl Terminal {
    /// Everything shown since the last [`Terminal::wait_for`], once `text` is among it.
    fn wait_for(&mut self, text: &str) -> String {
        let from = self.read_to;
        let shown = eventually(&format!("{text:?} on the terminal"), LONG, || {
            let screen = self.screen.lock().unwrap();
            screen[from..]
                .find(text)
                .map(|at| (screen[from..from + at + text.len()].to_owned(), from + at + text.len()))
        });
        self.read_to = shown.1;
        shown.0
    }

    fn type_line(&mut self, line: &str) {
        self.master.write_all(format!("{line}\n").as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().clone()
    }
}

/// Starts `postern serve --approver terminal` as the session leader of a new pseudo-terminal
/// (`setsid -c` makes it the controlling terminal, as a login shell's would be).
fn serve_on_terminal(manifest: &str, extra: &[&str]) -> (Gateway, Terminal) {
    serve_on_terminal_in(tempfile::tempdir().unwrap(), manifest, extra)
}

fn serve_on_terminal_in(data_dir: tempfile::TempDir, manifest: &str, extra: &[&str]) -> (Gateway, Terminal) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = File::options()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32)
        .open(name.to_str().unwrap())
        .unwrap();
    let tools = data_dir.path().join("tools.toml");
    std::fs::write(&tools, manifest).unwrap();
    let child = Command::new("setsid")
        .arg("-c")
        .arg(postern_bin())
        .args(["serve", "--approver", "terminal", "--port", "0", "--drain-seconds", "5"])
        .args(extra)
        .env("POSTERN_DATA_DIR", data_dir.path())
        .env("POSTERN_TOOLS", &tools)
        .env("POSTERN_LOG", "info,rmcp=error")
        .env("NO_COLOR", "1")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let master = File::from(master);
    let screen = Arc::new(Mutex::new(String::new()));
    let (mut reader, sink) = (master.try_clone().unwrap(), Arc::clone(&screen));
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // Ends with EIO once the gateway and its terminal are gone.
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut terminal = Terminal { master, screen: Arc::clone(&screen), read_to: 0 };
    terminal.wait_for("postern gateway ready");
    let line = terminal.wait_for("\n");
    let http = line
        .split("http=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no http= in {line:?}"));
    let gateway = Gateway { data_dir, child, http, stderr: screen };
    (gateway, terminal)
}

fn vault_locked(gw: &Gateway) -> bool {
    postern_store::JournalView::open_read_only(&gw.path().join("postern.db")).unwrap().locked().unwrap()
}

fn timeline(gw: &Gateway, id: &str) -> Vec<Value> {
    gw.activity().into_iter().filter(|r| r["execution_id"] == id).collect()
}

fn execution_of(result: &Value) -> String {
    result["structured"]["execution_id"].as_str().unwrap_or_else(|| panic!("no execution id in {result}")).to_owned()
}

/// The agent's interpreter, as the kernel names it (the actor Postern derives).
fn agent_executable(agent: &Agent) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{}/exe", agent.pid)).unwrap()
}

#[test]
fn terminal_session_authorization_shows_the_agent_and_allows_its_run() {
    let target = Target::start();
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &[]);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    agent.call("first", "pay", json!({ "amount": 5 }));

    let shown = term.wait_for("choice (s/d)> ");
    let exe = agent_executable(&agent);
    assert!(shown.contains("authorize an agent run"), "{shown}");
    assert!(shown.contains(&format!("agent        {}", exe.display())), "{shown}");
    assert!(shown.contains(&super::gateway_support::sha256_of(&exe)), "the executable's hash: {shown}");
    assert!(shown.contains(&format!("pid          {}, started 20", agent.pid)), "{shown}");
    assert!(shown.contains("transport    stdio"), "{shown}");
    assert!(shown.contains("client       "), "the MCP client's own name: {shown}");
    assert!(shown.contains("[s] allow this session"), "{shown}");
    // The agent runs as python3: an interpreter runs any script, so "always" is not offered.
    assert!(!shown.contains("[a] always allow this agent"), "{shown}");
    assert!(shown.contains("note         this is an interpreter"), "{shown}");
    assert_eq!(target.posts(), 0, "nothing is sent while the reviewer decides");
    term.type_line("s");

    let first = agent.result("first");
    assert_eq!(first["structured"]["state"], "completed", "{first}");
    assert_eq!(target.posts(), 1);
    // The run is authorized: the next call is not asked about.
    let second = agent.call_and_wait("second", "pay", json!({ "amount": 6 }));
    assert_eq!(second["structured"]["state"], "completed", "{second}");
    assert_eq!(term.screen().matches("authorize an agent run").count(), 1);
    let events: Vec<Value> = timeline(&gw, &execution_of(&first));
    let names: Vec<&str> = events.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(names[..4], ["accepted", "approval_requested", "approval_granted", "authorized"]);
    assert_eq!(events[1]["detail"]["shown"]["agent"]["pid"], agent.pid);
    assert_eq!(events[2]["detail"]["decision"]["by"], "terminal");
    assert_eq!(events[3]["detail"]["rung"], "session_authorization");
}

#[test]
fn terminal_deny_refuses_the_run_and_sends_nothing() {
    let target = Target::start();
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &[]);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    agent.call("first", "pay", json!({ "amount": 5 }));
    term.wait_for("choice (s/d)> ");
    // A typo is asked again, not taken as an answer.
    term.type_line("yes");
    term.wait_for("answer s, d> ");
    term.type_line("d");
    let first = agent.result("first");
    assert_eq!(first["is_error"], true, "{first}");
    assert_eq!(first["structured"]["state"], "denied", "{first}");
    let later = agent.call_and_wait("later", "pay", json!({ "amount": 6 }));
    assert_eq!(later["structured"]["state"], "denied", "the refusal stands for the run: {later}");
    assert_eq!(target.posts(), 0);
    assert_eq!(term.screen().matches("authorize an agent run").count(), 1, "asked once");
    let sessions = gw.sessions();
    assert_eq!(
        (sessions[0]["authorization"].as_str(), sessions[0]["authorized_by"].as_str()),
        (Some("revoked"), Some("terminal")),
        "{sessions:#?}"
    );
}

#[test]
fn terminal_question_nobody_answers_is_denied_when_its_time_runs_out() {
    let target = Target::start();
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &["--approval-timeout", "2"]);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let out = agent.call_and_wait("first", "pay", json!({ "amount": 5 }));
    assert_eq!(out["structured"]["state"], "denied", "{out}");
    assert_eq!(out["structured"]["detail"]["code"], "approval_timed_out", "{out}");
    term.wait_for("nothing was approved");
    assert_eq!(target.posts(), 0);
    let id = execution_of(&out);
    assert_eq!(gw.events_of(&id), ["accepted", "approval_requested", "approval_timed_out", "denied"]);
    // Typing the answer late approves nothing.
    term.type_line("s");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(gw.events_of(&id).last().unwrap(), "denied");
}

/// An approved irreversible `wire` whose answer never reached the agent: the reviewer allows the
/// run, the target executes (held), the agent's bridge is killed, the target answers; returns
/// the execution once it is `completed_result_not_delivered`, with the agent reconnected.
fn undelivered_wire(target: &Target, gw: &Gateway, term: &mut Terminal, agent: &mut Agent, amount: u64) -> String {
    agent.connect(gw.bridge_command());
    let bridge = agent.bridge_pid();
    target.hold();
    agent.call("first", "wire", json!({ "amount": amount }));
    term.wait_for("choice (s/d)> ");
    term.type_line("s");
    eventually("the wire to reach the target", LONG, || (target.posts() == 1).then_some(()));
    kill(bridge);
    assert_eq!(agent.result("first")["ok"], false);
    target.release();
    let id = gw.executions_of("wire").pop().unwrap();
    eventually("the undelivered result on record", LONG, || {
        (gw.events_of(&id).last().map(String::as_str) == Some("completed_result_not_delivered")).then_some(())
    });
    agent.connect(gw.bridge_command());
    id
}

/// The issue's decisive scenario: an irreversible call is approved and dispatched, the
/// connection is cut after dispatch, the agent retries; the reviewer is shown the original
/// record and returns the recorded result. The target counts one.
#[test]
fn terminal_retry_review_shows_the_original_record_and_returns_its_result() {
    let target = Target::start();
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &[]);
    let mut agent = Agent::start(Sdk::Python);
    let id = undelivered_wire(&target, &gw, &mut term, &mut agent, 900);
    agent.call("retry", "wire", json!({ "amount": 900 }));
    let shown = term.wait_for("choice (r/n/d)> ");
    assert!(shown.contains("review a retry"), "{shown}");
    assert!(shown.contains(&format!("original     {id} (tool wire, replay contract irreversible)")), "{shown}");
    assert!(shown.contains(&format!("request      POST http://{}/pay", target.addr)), "{shown}");
    assert!(shown.contains("state        completed_result_not_delivered"), "{shown}");
    assert!(shown.contains("authorized   by terminal"), "{shown}");
    assert!(shown.contains("dispatched   20"), "the first dispatch time: {shown}");
    assert!(shown.contains("outcome      completed with HTTP 201"), "{shown}");
    let completed = shown.lines().find(|l| l.trim_start().starts_with("20") && l.contains(" completed "));
    assert!(completed.is_some_and(|l| l.trim_end().ends_with("HTTP 201")), "the timeline: {shown}");
    assert!(shown.contains("not re-sent  the original completed"), "{shown}");
    assert!(shown.contains("[r] return the recorded result") && shown.contains("[n] dispatch anew"), "{shown}");
    assert!(!shown.contains("[c]"), "no status route for an irreversible tool: {shown}");
    term.type_line("r");

    let retry = agent.result("retry");
    assert_eq!(retry["is_error"], false, "{retry}");
    assert_eq!(execution_of(&retry), id);
    assert_eq!(retry["structured"]["attached"], true);
    assert_eq!(target.posts(), 1, "the wire was sent once");
    let events = timeline(&gw, &id);
    let requested = events.iter().find(|e| e["event"] == "retry_review_requested").unwrap();
    assert_eq!(requested["detail"]["shown"]["execution_id"], id.as_str());
    assert_eq!(requested["detail"]["shown"]["state"], "completed_result_not_delivered");
    let decided = events.iter().find(|e| e["event"] == "retry_review_decided").unwrap();
    assert_eq!(decided["detail"]["decision"], json!({ "choice": "return_recorded_result", "by": "terminal" }));
}

#[test]
fn terminal_dispatch_anew_requires_a_typed_reason_and_journals_it() {
    let target = Target::start();
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &[]);
    let mut agent = Agent::start(Sdk::Python);
    let id = undelivered_wire(&target, &gw, &mut term, &mut agent, 30);
    agent.call("retry", "wire", json!({ "amount": 30 }));
    term.wait_for("choice (r/n/d)> ");
    term.type_line("n");
    term.wait_for("reason for sending it again (journaled)> ");
    term.type_line("   ");
    term.wait_for("a reason is required");
    term.type_line("the bank confirmed the first transfer bounced");
    let retry = agent.result("retry");
    assert_eq!(retry["structured"]["state"], "completed", "{retry}");
    let anew = execution_of(&retry);
    assert_ne!(anew, id, "a new execution");
    assert_eq!(target.posts(), 2, "sent again, because the reviewer said so");
    let accepted = timeline(&gw, &anew).into_iter().find(|e| e["event"] == "accepted").unwrap();
    assert_eq!(
        accepted["detail"]["dispatched_anew"],
        json!({ "prior": id, "by": "terminal", "reason": "the bank confirmed the first transfer bounced" })
    );
}

#[test]
fn locking_the_vault_denies_an_open_question_at_once_and_the_terminal_can_unlock() {
    let target = Target::start();
    // The agent's interpreter starts first: the idle lock counts from the gateway's start.
    let mut agent = Agent::start(Sdk::Python);
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &["--idle-lock", "3"]);
    agent.connect(gw.bridge_command());
    agent.call("first", "pay", json!({ "amount": 5 }));
    term.wait_for("choice (s/d)> ");
    // `postern vault lock` from another terminal (through the gateway's control socket).
    let lock = gw.postern(&["vault", "lock"]);
    assert_eq!(lock.code, 0, "{}", lock.stderr);
    let first = agent.result("first");
    assert_eq!(first["structured"]["state"], "denied", "{first}");
    assert_eq!(first["structured"]["detail"]["rung"], "vault_locked", "{first}");
    term.wait_for("withdrawn");
    assert_eq!(gw.events_of(&execution_of(&first))[2], "approval_withdrawn");

    // Only the approver's own channel unlocks.
    term.type_line("unlock");
    term.wait_for("postern: vault unlocked");
    assert!(!vault_locked(&gw));
    // Idle for the configured period: locked again, by itself.
    eventually("the idle lock", LONG, || vault_locked(&gw).then_some(()));
    let denied = agent.call_and_wait("second", "pay", json!({ "amount": 6 }));
    assert_eq!(denied["structured"]["detail"]["rung"], "vault_locked", "{denied}");
    assert_eq!(target.posts(), 0);
    // The journal says who locked and unlocked, in order.
    let by: Vec<(String, String)> = journal_rows(&gw, "vault_")
        .iter()
        .map(|v| (v["head"]["event"].as_str().unwrap().to_owned(), v["payload"]["by"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        by,
        [
            ("vault_locked".to_owned(), "cli".to_owned()),
            ("vault_unlocked".to_owned(), "terminal".to_owned()),
            ("vault_locked".to_owned(), "idle-lock: 3 s without activity".to_owned()),
        ]
    );
}

/// Every journal row (all streams) whose event starts with `prefix`, oldest first, as stored.
pub(crate) fn journal_rows(gw: &Gateway, prefix: &str) -> Vec<Value> {
    let db = rusqlite::Connection::open(gw.path().join("postern.db")).unwrap();
    let bodies: Vec<String> = db
        .prepare("SELECT body FROM journal ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    bodies
        .iter()
        .map(|b| serde_json::from_str::<Value>(b).unwrap())
        .filter(|v| v["head"]["event"].as_str().is_some_and(|e| e.starts_with(prefix)))
        .collect()
}

/// Speaks raw MCP (newline-delimited JSON-RPC) on the gateway's socket, as any local process
/// of this user could, and returns the answer to `request` after the handshake.
fn raw_mcp(gw: &Gateway, request: Value) -> Value {
    use std::io::BufRead;
    let socket =
        std::os::unix::net::UnixStream::connect(postern_gateway::door::socket::socket_path(gw.path())).unwrap();
    let mut reader = std::io::BufReader::new(socket.try_clone().unwrap());
    let mut writer = socket;
    let mut send = |v: Value| writeln!(writer, "{v}").unwrap();
    send(json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "raw", "version": "0" } } }));
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
    send(request);
    line.clear();
    reader.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// A raw HTTP request to the gateway's port with the agent's token.
fn raw_http(gw: &Gateway, token: &str, method: &str, path: &str) -> String {
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: \
         application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// An agent cannot approve its own request: not over the control socket, not with an MCP method
/// or tool, not over HTTP, not with the CLI. Each attempt fails, the question stays open for the
/// person at the terminal, and every attempt is journaled.
#[test]
fn self_approval_through_every_interface_an_agent_reaches_fails_and_is_journaled() {
    let target = Target::start();
    let (gw, mut term) = serve_on_terminal(&target.manifest(), &[]);
    // A new agent token widens who can call: the person at the terminal confirms it.
    let adding = {
        let data = gw.path().to_owned();
        std::thread::spawn(move || super::support::postern(&["agents", "add", "intruder"], Some(&data)))
    };
    let shown = term.wait_for("choice (c/r)> ");
    assert!(shown.contains("add agent \"intruder\""), "{shown}");
    term.type_line("c");
    let added = adding.join().unwrap();
    assert_eq!(added.code, 0, "{}", added.stderr);
    let token = added.stdout.trim().to_owned();
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    agent.call("pending", "pay", json!({ "amount": 77 }));
    term.wait_for("choice (s/d)> ");
    let pending = gw.executions_of("pay").pop().unwrap();
    let run = gw.sessions()[0]["id"].as_str().unwrap().to_owned();

    // The control socket (what `postern` talks to while the gateway runs).
    let control = |line: Value| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime
            .block_on(postern_gateway::door::control::request_line(gw.path(), serde_json::to_vec(&line).unwrap()))
            .unwrap()
    };
    for attempt in [
        json!({ "op": "approvals.grant", "execution_id": pending }),
        json!({ "op": "sessions.authorize", "id": run }),
        json!({ "op": "allowlist.add", "actor": "process:/usr/bin/python3" }),
    ] {
        let reply = control(attempt.clone());
        assert!(
            matches!(
                reply,
                postern_gateway::door::control::ControlReply::Refused {
                    code: postern_gateway::door::control::ControlCode::NotOffered,
                    ..
                }
            ),
            "{attempt}: {reply:?}"
        );
    }
    // The CLI, run by the agent: unlocking is refused the same way.
    let unlock = gw.postern(&["vault", "unlock"]);
    assert_eq!(unlock.code, 1);
    assert!(unlock.stderr.contains("unlocking is not offered over its control socket"), "{}", unlock.stderr);
    // MCP: no method and no tool approves.
    let method = raw_mcp(
        &gw,
        json!({ "jsonrpc": "2.0", "id": 2, "method": "postern/approve",
                                      "params": { "execution_id": pending } }),
    );
    assert_eq!(method["error"]["code"], -32601, "{method}");
    assert_eq!(method["error"]["data"]["code"], "not_offered", "{method}");
    let tool = raw_mcp(
        &gw,
        json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                    "params": { "name": "approve_execution", "arguments": { "execution_id": pending } } }),
    );
    assert_eq!(tool["error"]["data"]["code"], "unknown_tool", "{tool}");
    // HTTP, with a valid agent token: there is no endpoint but /mcp.
    let http = raw_http(&gw, &token, "POST", &format!("/approvals/{pending}"));
    assert!(http.starts_with("HTTP/1.1 404"), "{http}");
    assert!(http.contains("not_offered"), "{http}");

    // Nothing was approved: the question is still open, the target untouched.
    assert_eq!(gw.events_of(&pending), ["accepted", "approval_requested"]);
    assert_eq!(target.posts(), 0);
    term.type_line("d");
    assert_eq!(agent.result("pending")["structured"]["state"], "denied");

    let refused: Vec<(String, String)> = journal_rows(&gw, "request_refused")
        .iter()
        .map(|v| {
            assert_eq!(v["payload"]["approval_shaped"], true, "{v}");
            (
                v["payload"]["interface"].as_str().unwrap().to_owned(),
                v["payload"]["attempted"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("control_socket", "approvals.grant".to_owned()),
        ("control_socket", "sessions.authorize".to_owned()),
        ("control_socket", "allowlist.add".to_owned()),
        ("control_socket", "vault.unlock".to_owned()),
        ("mcp:stdio", "postern/approve".to_owned()),
        ("mcp:stdio", "tools/call approve_execution".to_owned()),
        ("http", format!("POST /approvals/{pending}")),
    ];
    let expected: Vec<(String, String)> = expected.into_iter().map(|(i, a)| (i.to_owned(), a)).collect();
    assert_eq!(refused, expected);
    // Who tried is on record: the CLI's process, as the kernel names it.
    let cli = &journal_rows(&gw, "request_refused")[3];
    assert!(cli["payload"]["peer"]["executable"].as_str().unwrap().ends_with("/postern"), "{cli}");
}

const BANK_SECRET: &str = "CANARY-bank-7c41e0-secret";

/// Per-use approval on the terminal: it shows the exact call (never the secret), approves that
/// execution only, and a retry of it while the question is open joins the question.
#[test]
fn per_use_approval_covers_one_call_and_its_retry_joins_the_open_question() {
    let target = Target::start();
    let data_dir = tempfile::tempdir().unwrap();
    let add = ["vault", "add", "bank", "--kind", "bearer", "--host", "127.0.0.1", "--approve-every-use"];
    let added = super::support::postern_with(&add, Some(data_dir.path()), Some(&format!("{BANK_SECRET}\n")), &[]);
    assert_eq!(added.code, 0, "{}", added.stderr);
    let manifest = format!(
        "{}\n[[tool]]\nname = \"pay_each\"\nmethod = \"POST\"\nurl = \"http://{}/pay\"\ncredential = \"bank\"\n\
         input_schema = {{ type = \"object\", properties = {{ amount = {{ type = \"integer\" }} }} }}\n\
         contract = {{ class = \"irreversible\" }}\n",
        target.manifest(),
        target.addr
    );
    let (gw, mut term) = serve_on_terminal_in(data_dir, &manifest, &[]);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    agent.call("x", "pay_each", json!({ "amount": 5 }));
    // Per-use comes before the run's authorization in the ladder: this call is asked about as itself.
    let shown = term.wait_for("choice (y/d)> ");
    assert!(!shown.contains("authorize an agent run"), "{shown}");
    assert!(shown.contains("approve this call"), "{shown}");
    assert!(shown.contains(&format!("request      POST http://{}/pay", target.addr)), "{shown}");
    assert!(shown.contains("credential   bank"), "{shown}");
    assert!(shown.contains(r#"body         {"amount":5}"#), "{shown}");
    // While X waits: its retry (same arguments, same run) and a different call Y.
    agent.call("x-again", "pay_each", json!({ "amount": 5 }));
    agent.call("y", "pay_each", json!({ "amount": 6 }));
    let x_id = gw.executions_of("pay_each")[0].clone();
    eventually("X's retry and Y to arrive", LONG, || {
        (gw.events_of(&x_id).contains(&"retry_received".to_owned()) && gw.executions_of("pay_each").len() == 2)
            .then_some(())
    });
    term.type_line("y");
    let x = agent.result("x");
    let again = agent.result("x-again");
    assert_eq!(x["structured"]["state"], "completed", "{x}");
    assert_eq!(execution_of(&again), execution_of(&x), "the retry joined X: {again}");
    // Y is its own question: approving X did not approve it.
    let y_shown = term.wait_for("choice (y/d)> ");
    assert!(y_shown.contains(r#"body         {"amount":6}"#), "{y_shown}");
    term.type_line("d");
    let y = agent.result("y");
    assert_eq!(y["structured"]["state"], "denied", "{y}");
    assert_eq!(target.posts(), 1, "only X was sent");
    assert_eq!(term.screen().matches("== Postern: approve this call ==").count(), 2, "X (with its retry) and Y");
    let events = gw.events_of(&execution_of(&x));
    assert_eq!(events.iter().filter(|e| *e == "approval_requested").count(), 1, "{events:?}");
    // The secret was sent to the target, and shown or journaled nowhere.
    assert!(!term.screen().contains(BANK_SECRET));
    assert!(super::support::file_containing(gw.path(), BANK_SECRET).is_none());
}

/// A change that weakens safety asked for from outside any agent run (here, the owner's own
/// terminal) is put to the reviewer at the approver's terminal first: refused, nothing changes
/// and the refusal is journaled; confirmed, it is made.
#[test]
fn a_change_that_weakens_safety_waits_for_the_reviewers_confirmation() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let add = super::upstreams::add_counter(data.path(), dir.path(), "counter", "token-for-the-counter\n");
    assert_eq!(add.code, 0, "{}", add.stderr);
    let (gw, mut term) = serve_on_terminal_in(data, "", &[]);
    let contract = |args: &[&str]| {
        let args: Vec<String> = ["servers", "contract", "counter"].iter().chain(args).map(|s| s.to_string()).collect();
        let data = gw.path().to_owned();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            super::support::postern(&args, Some(&data))
        })
    };
    // No weaker than before (set_flag is held to irreversible until its hint is confirmed): no question.
    let stronger = contract(&["set_flag", "--class", "irreversible"]).join().unwrap();
    assert_eq!(stronger.code, 0, "{}", stronger.stderr);
    // Confirming what the hint says is weaker: asked, and refused.
    let weaker = contract(&["set_flag", "--confirm", "idempotent"]);
    let shown = term.wait_for("choice (c/r)> ");
    assert!(shown.contains("confirm a change"), "{shown}");
    assert!(shown.contains("counter__set_flag"), "{shown}");
    assert!(shown.contains("an uncertain outcome would be idempotent instead of irreversible"), "{shown}");
    assert!(shown.contains("asked by     pid "), "the asking process is shown: {shown}");
    // While it waits, a second weakening is not put to the person (one dialog per request
    // otherwise): refused at once, and journaled.
    let second = contract(&["set_flag", "--confirm", "idempotent"]).join().unwrap();
    assert_eq!(second.code, 1, "{}", second.stderr);
    assert!(second.stderr.contains("already waiting for the approver's person"), "{}", second.stderr);
    let rows = journal_rows(&gw, "request_refused");
    assert!(rows.iter().any(|r| r["payload"]["decided"] == "not_asked_another_waiting"), "{rows:?}");
    term.type_line("r");
    let refused = weaker.join().unwrap();
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("did not confirm"), "{}", refused.stderr);
    let listed = |gw: &Gateway| {
        let run = gw.postern(&["servers", "tools", "counter", "--json"]);
        let tools: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stderr));
        tools.as_array().unwrap().iter().find(|t| t["name"] == "counter__set_flag").unwrap()["contract"].clone()
    };
    assert_eq!(listed(&gw), json!("irreversible"), "nothing changed");
    // Asked again, and confirmed.
    let weaker = contract(&["set_flag", "--confirm", "idempotent"]);
    term.wait_for("choice (c/r)> ");
    term.type_line("c");
    let confirmed = weaker.join().unwrap();
    assert_eq!(confirmed.code, 0, "{}", confirmed.stderr);
    assert_eq!(listed(&gw), json!("idempotent"));
}

/// A sessionless (2026-07-28) `wire` of `amount` whose client closed its stream while the
/// reviewer's question was open, the gateway given time to notice.
struct StreamClosedAtQuestion {
    target: Target,
    gw: Gateway,
    term: Terminal,
    addr: String,
    token: String,
    id: String,
}

fn stream_closed_at_the_question(amount: u64) -> StreamClosedAtQuestion {
    use std::io::Write as _;
    let target = Target::start();
    // The token is made before the reviewer's gateway runs (beside it, a new token waits for
    // the reviewer's confirmation).
    let data_dir = tempfile::tempdir().unwrap();
    let added = super::support::postern(&["agents", "add", "closer"], Some(data_dir.path()));
    assert_eq!(added.code, 0, "{}", added.stderr);
    let token = added.stdout.trim().to_owned();
    let (gw, mut term) = serve_on_terminal_in(data_dir, &target.manifest(), &[]);
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let request = super::gateway::sessionless_call_request(&addr, &token, 1, "wire", json!({ "amount": amount }));
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    term.wait_for("authorize an agent run");
    term.wait_for("> ");
    drop(stream);
    let id = eventually("the execution on record", LONG, || gw.executions_of("wire").pop());
    // The gateway notices the closed connection.
    std::thread::sleep(Duration::from_millis(500));
    StreamClosedAtQuestion { target, gw, term, addr, token, id }
}

/// #27, 2026-07-28 ("closing a response stream MUST be treated as cancellation"): a sessionless
/// client that closes its connection while the reviewer is still deciding has withdrawn the
/// call. The reviewer's later "allow" sends nothing: the execution ends
/// `failed_before_dispatch` (cancelled), and the target never hears of it.
#[test]
fn a_stream_closed_before_dispatch_sends_nothing() {
    let StreamClosedAtQuestion { target, gw, mut term, id, .. } = stream_closed_at_the_question(41);
    term.type_line("s");
    let events = eventually("the execution to end", LONG, || {
        let events = gw.events_of(&id);
        events.contains(&"failed_before_dispatch".to_owned()).then_some(events)
    });
    assert!(!events.contains(&"dispatched".to_owned()), "{events:?}");
    let last = timeline(&gw, &id).pop().unwrap();
    assert_eq!(last["detail"]["reason"], "cancelled", "{last}");
    assert_eq!(target.posts(), 0, "nothing reached the target");
}

/// #27, 2026-07-28: "a broken response stream loses the in-flight request; clients MUST re-issue
/// it as a new request". A client whose stream broke while the reviewer decided re-issues the
/// call on a new connection; the re-issue joins the open question, so the execution is still
/// wanted: the reviewer's "allow" sends it once and the re-issue gets its result. (Before, the
/// first call's cancellation ended the shared execution `failed_before_dispatch` and the
/// re-issue was told so: the agent had to repeat it and the reviewer was asked again.)
#[test]
fn a_call_re_issued_after_its_stream_broke_keeps_the_execution_wanted() {
    let StreamClosedAtQuestion { target, gw, mut term, addr, token, id } = stream_closed_at_the_question(43);
    let reissued = {
        let (addr, token) = (addr.clone(), token.clone());
        std::thread::spawn(move || {
            super::gateway::post_sessionless_call(&addr, &token, 2, "wire", json!({ "amount": 43 }))
        })
    };
    // The re-issue reaches the gateway and joins the question still open (nothing on record
    // says so until the question is answered).
    std::thread::sleep(Duration::from_millis(1500));
    term.type_line("s");
    let (status, body) = reissued.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&id.to_string()), "the re-issue is answered by the first execution: {body}");
    assert!(body.contains("\"completed\""), "{body}");
    assert_eq!(target.posts(), 1, "sent once");
    assert_eq!(gw.executions_of("wire"), vec![id.clone()], "no second execution");
    let events = gw.events_of(&id);
    assert!(!events.contains(&"failed_before_dispatch".to_owned()), "{events:?}");
}

/// The README's quick-start commands, in order (each shell block's lines, comments dropped).
fn quick_start_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(super::gateway_support::repo_root().join("README.md")).unwrap();
    let start = readme.find("## Quick start").expect("a Quick start section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    let mut commands = Vec::new();
    let mut in_sh = false;
    for line in section.lines().map(str::trim) {
        match line {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            _ if in_sh && !line.is_empty() => {
                commands.push(line.split(" #").next().unwrap_or(line).trim().to_owned());
            }
            _ => {}
        }
    }
    commands
}

/// A newcomer's quick start, as the README writes it: the gateway on the terminal, a credential
/// from stdin, the agent on `postern mcp`, the run allowed on the terminal, the call in
/// `postern activity` and `postern execution show`, and the README's `tools.toml` checked. Two
/// things differ, and only them: the agent is the Python SDK (Claude Code is not on CI
/// machines) started with the same `postern mcp` command, and it asks `http_request` for a
/// loopback target instead of GitHub (CI has no internet).
#[test]
fn the_readme_quick_start_works_as_written() {
    let commands = quick_start_commands();
    assert_eq!(
        commands,
        [
            "postern serve --approver terminal",
            "postern vault add github --kind bearer --host api.github.com",
            "claude mcp add postern -- postern mcp",
            "postern activity --limit 5",
            "postern execution show act_…",
        ],
        "the README's quick start changed: make this test run what it says now"
    );
    let words = |i: usize| -> Vec<String> { commands[i].split_whitespace().skip(1).map(str::to_owned).collect() };
    let target = Target::start();
    let serve = words(0);
    assert_eq!(serve, ["serve", "--approver", "terminal"]);
    let (gw, mut term) = serve_on_terminal("", &[]);

    let add = words(1);
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    let added = super::support::postern_with(&add, Some(gw.path()), Some("a-token-from-github\n"), &[]);
    assert_eq!(added.code, 0, "{}", added.stderr);
    let listed = gw.postern(&["vault", "list"]);
    assert!(listed.stdout.contains("github") && listed.stdout.contains("api.github.com"), "{}", listed.stdout);
    assert!(!listed.stdout.contains("a-token-from-github"), "{}", listed.stdout);

    // What Claude Code runs after `claude mcp add postern -- …`: the words after `--`.
    let mcp: Vec<String> = commands[2].split(" -- ").nth(1).unwrap().split_whitespace().map(str::to_owned).collect();
    assert_eq!(mcp, ["postern", "mcp"]);
    let bridge = gw.bridge_command();
    assert_eq!(bridge["args"], json!(mcp[1..]), "the bridge the agent starts is `postern mcp`");
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(bridge);
    let url = format!("http://{}/balance", target.addr);
    agent.call("first", "http_request", json!({ "method": "GET", "url": url }));
    let shown = term.wait_for("choice (s/d)> ");
    assert!(shown.contains("authorize an agent run"), "the first call of the run asks: {shown}");
    term.type_line("s");
    let first = agent.result("first");
    assert_eq!(first["structured"]["state"], "completed", "{first}");
    assert_eq!(target.gets(), 1);
    let id = execution_of(&first);

    let activity = words(3);
    let activity: Vec<&str> = activity.iter().map(String::as_str).collect();
    let listed = gw.postern(&activity);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(listed.stdout.contains(&id) && listed.stdout.contains("completed"), "{}", listed.stdout);
    let show = words(4);
    assert_eq!(show, ["execution", "show", "act_…"]);
    let shown = gw.postern(&["execution", "show", &id]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(shown.stdout.contains(&id) && shown.stdout.contains("completed"), "{}", shown.stdout);

    // Step 5: the README's tools.toml, checked as it says.
    let readme = std::fs::read_to_string(super::gateway_support::repo_root().join("README.md")).unwrap();
    let toml_start = readme.find("```toml\n").unwrap() + "```toml\n".len();
    let toml: String = readme[toml_start..readme[toml_start..].find("```").unwrap() + toml_start]
        .lines()
        .map(|l| l.strip_prefix("   ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    // Where the README puts it: ~/.config/postern/tools.toml.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".config/postern")).unwrap();
    std::fs::write(home.path().join(".config/postern/tools.toml"), toml).unwrap();
    let env = [("HOME", home.path().to_str().unwrap()), ("XDG_CONFIG_HOME", "")];
    let checked = super::support::postern_with(&["tools", "check"], Some(gw.path()), None, &env);
    assert_eq!(checked.code, 0, "{}{}", checked.stdout, checked.stderr);
    assert!(checked.stdout.contains("create_issue") && checked.stdout.contains("irreversible"), "{}", checked.stdout);
}
