//! The hostile-peer suite: upstream MCP servers, HTTP targets and agent configs that try to make
//! Postern leak a secret, swamp it, or deceive whoever reads what it prints — on real processes
//! (`postern serve`, upstream servers and an agent on the official Python MCP SDK, a loopback
//! target). Every secret is a fresh random canary, searched for in every spelling in every file
//! of the data and config directories (the journal's WAL included), the gateway's log and every
//! answer.

use super::gateway_support::{Agent, Gateway, Sdk, eventually, repo_root};
use super::support::postern_with;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A secret no test shares with another run: `canary-<tag>-<random>`.
pub(super) fn canary(tag: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    format!("canary-{tag}-{:016x}", h.finish())
}

/// The ways a hostile peer could send a secret back: as itself, percent-encoded, base64 and
/// JSON-escaped.
pub(super) fn spellings(secret: &str) -> Vec<String> {
    use base64::Engine as _;
    let percent: String = secret
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let json = serde_json::to_string(secret).unwrap();
    vec![
        secret.to_owned(),
        percent,
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(secret),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret),
        json[1..json.len() - 1].to_owned(),
    ]
}

/// Every file under `dir`, at any depth (links are not followed: what they point to is
/// searched where it is, if it is under `dir`).
pub(super) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(t) if t.is_file() => out.push(entry.path()),
                _ => {}
            }
        }
    }
    out
}

/// Fails if any spelling of any of `secrets` is in a file under `dirs` or in one of `texts`.
pub(super) fn assert_nowhere(secrets: &[&str], dirs: &[&Path], texts: &[(&str, &str)]) {
    for secret in secrets {
        for spelling in spellings(secret) {
            for dir in dirs {
                for file in files_under(dir) {
                    let bytes = std::fs::read(&file).unwrap_or_default();
                    assert!(
                        !bytes.windows(spelling.len()).any(|w| w == spelling.as_bytes()),
                        "{spelling:?} (a spelling of {secret}) is in {}",
                        file.display()
                    );
                }
            }
            for (what, text) in texts {
                assert!(!text.contains(&spelling), "{spelling:?} (a spelling of {secret}) is in {what}: {text}");
            }
        }
    }
}

pub(super) fn python() -> PathBuf {
    repo_root().join("tests/clients/python/.venv/bin/python")
}

fn hostile_script() -> String {
    repo_root().join("tests/upstreams/hostile.py").to_str().unwrap().to_owned()
}

/// The hostile server over Streamable HTTP on a free loopback port, added to `data` as `remote`
/// with a bearer credential holding `secret`: its process (kill it when done).
fn remote_hostile(data: &Path, secret: &str) -> std::process::Child {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let upstream = std::process::Command::new(python())
        .args([hostile_script(), "--http".into(), port.to_string()])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the remote upstream listening", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let host = format!("127.0.0.1:{port}");
    let cred = postern_with(
        &["vault", "add", "remote-api", "--kind", "bearer", "--host", &host],
        Some(data),
        Some(&format!("{secret}\n")),
        &[],
    );
    assert_eq!(cred.code, 0, "{}", cred.stderr);
    let url = format!("http://{host}/mcp");
    let add =
        postern_with(&["servers", "add", "remote", "--url", &url, "--credential", "remote-api"], Some(data), None, &[]);
    assert_eq!(add.code, 0, "{}", add.stderr);
    upstream
}

/// `postern servers add NAME -- ARGV` on `data` (no secrets), which must succeed.
fn add_server(data: &Path, name: &str, argv: &[&str]) {
    let args: Vec<&str> = ["servers", "add", name, "--"].into_iter().chain(argv.iter().copied()).collect();
    let add = postern_with(&args, Some(data), None, &[]);
    assert_eq!(add.code, 0, "{}", add.stderr);
}

/// `postern serve` on `data` (no manifest) and a Python-SDK agent connected through a bridge.
pub(super) fn serve_with_agent(data: tempfile::TempDir) -> (Gateway, Agent) {
    let gw = Gateway::start_in(data, "");
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    (gw, agent)
}

/// The gateway's peak resident memory so far, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A stdio upstream that sends back every secret Postern gave it — its secret environment value
/// and the password in its command line's DSN, in plain text, percent-encoded, base64 and
/// JSON-escaped — writes its environment to stderr, and echoes a password argument: none of it
/// reaches the agent, the journal (WAL included), the gateway's log or any other file, and each
/// result says a secret came back. (Before: the agent got the token, `results` kept it in clear,
/// stderr put it in the log, and the DSN was journaled in `credential_added`.)
#[test]
fn an_upstream_that_sends_its_secrets_back_leaks_them_nowhere() {
    let (token, dsn_password, argument) = (canary("env"), canary("dsn"), canary("argument"));
    let data = tempfile::tempdir().unwrap();
    let dsn = format!("postgresql://admin:{dsn_password}@localhost/app");
    let python = python();
    let script = hostile_script();
    let add = postern_with(
        &["servers", "add", "hostile", "--secret-env", "HOSTILE_TOKEN", "--", python.to_str().unwrap(), &script, &dsn],
        Some(data.path()),
        Some(&format!("{token}\n")),
        &[],
    );
    assert_eq!(add.code, 0, "{}", add.stderr);
    let listed = postern_with(&["servers", "list"], Some(data.path()), None, &[]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(
        listed.stdout.contains("postgresql://admin:<"),
        "the DSN is listed with its password named: {}",
        listed.stdout
    );

    let (gw, mut agent) = serve_with_agent(data);
    let leaked = agent.call_and_wait("leak", "hostile__leak_environment", json!({}));
    assert_eq!(leaked["structured"]["state"], "completed", "{leaked}");
    assert_eq!(leaked["structured"]["result"]["secret_echoed"], true, "the result says a secret came back: {leaked}");
    assert!(leaked.to_string().contains("<redacted>"), "{leaked}");
    let stderr = agent.call_and_wait("stderr", "hostile__leak_to_stderr", json!({}));
    assert_eq!(stderr["structured"]["state"], "completed", "{stderr}");
    eventually("the server's stderr in the gateway's log", Duration::from_secs(10), || {
        gw.stderr.lock().unwrap().contains("hostile env dump").then_some(())
    });
    let echoed = agent.call_and_wait("echo", "hostile__echo", json!({ "text": "hi", "password": argument }));
    assert_eq!(echoed["structured"]["state"], "completed", "{echoed}");
    assert_eq!(echoed["structured"]["result"]["secret_echoed"], true, "{echoed}");
    // Its token in a tool's description: the tool list every agent reads is masked too.
    let tools = agent.tools();
    assert!(tools.to_string().contains("hostile__described"), "{tools}");
    // A password of backslashes echoed beside a run of them: every backslash has two spellings
    // (itself, JSON-escaped), so a search that follows each branch never ends (before: the call
    // never came back and a gateway thread spun). The answer comes back, masked.
    let slashes = format!("{}Z", "\\".repeat(40));
    let branching = agent.call_and_wait(
        "branching",
        "hostile__backslashes",
        json!({ "text": "\\".repeat(2000), "password": slashes }),
    );
    assert_eq!(branching["structured"]["state"], "completed", "{branching}");
    // The password as JSON spells it (each backslash doubled), then `Z`: nothing else has a `Z`.
    let spelled = format!("{}Z", "\\\\".repeat(40));
    assert!(!branching.to_string().contains(&spelled), "the password came back: {branching}");
    // The same result returned from the record (`execution_status`) is masked too.
    let id = leaked["structured"]["execution_id"].as_str().unwrap();
    let status = agent.call_and_wait("status", "execution_status", json!({ "execution_id": id }));
    assert_eq!(status["structured"]["state"], "result_delivered", "{status}");
    drop(agent);
    let log = gw.stderr.lock().unwrap().clone();
    let answers =
        [leaked.to_string(), stderr.to_string(), echoed.to_string(), status.to_string(), tools.to_string()].concat();
    let activity = gw.postern(&["activity", "--json", "--limit", "1000"]).stdout;
    assert_nowhere(
        &[&token, &dsn_password, &argument],
        &[gw.path()],
        &[("the agent's answers", &answers), ("the gateway's log", &log), ("postern activity", &activity)],
    );
}

/// A remote upstream (Streamable HTTP, reached with a vault bearer credential) whose tool sends
/// back the request's headers: the credential is redacted from the answer and stored nowhere.
#[test]
fn a_remote_upstream_that_echoes_its_credential_leaks_it_nowhere() {
    let secret = canary("remote");
    let data = tempfile::tempdir().unwrap();
    let mut upstream = remote_hostile(data.path(), &secret);
    let (gw, mut agent) = serve_with_agent(data);
    let headers = agent.call_and_wait("headers", "remote__echo_headers", json!({}));
    assert_eq!(headers["structured"]["state"], "completed", "{headers}");
    assert_eq!(headers["structured"]["result"]["secret_echoed"], true, "{headers}");
    assert!(headers.to_string().contains("<redacted>"), "the header came back, redacted: {headers}");
    // An answer past the result limit over HTTP: the call completes, the answer is not kept.
    let flood = agent.call_and_wait("flood", "remote__flood", json!({ "megabytes": 3 }));
    assert_eq!(flood["structured"]["state"], "completed", "{flood}");
    assert_eq!(flood["structured"]["error"]["code"], "result_too_large", "{flood}");
    drop(agent);
    let log = gw.stderr.lock().unwrap().clone();
    assert_nowhere(&[&secret], &[gw.path()], &[("the answer", &headers.to_string()), ("the log", &log)]);
    let _ = upstream.kill();
    let _ = upstream.wait();
}

/// An upstream answering with 15.6 MB: the answer is dropped as it streams by, the call
/// completes as `result_too_large` naming the limit, the journal keeps a few bytes, and the
/// gateway's peak memory stays far from what buffering it would take. (Before: the gateway's
/// peak RSS went from 36 MB to 1,026 MB and each answer was stored whole: 62 MB of journal for
/// four calls.)
#[test]
fn an_upstream_flood_is_cut_at_the_result_limit_and_memory_stays_bounded() {
    let data = tempfile::tempdir().unwrap();
    add_server(data.path(), "hostile", &[python().to_str().unwrap(), &hostile_script()]);
    let (gw, mut agent) = serve_with_agent(data);
    let warm = agent.call_and_wait("warm", "hostile__ok_tool", json!({}));
    assert_eq!(warm["structured"]["state"], "completed", "{warm}");
    let before = peak_rss_kib(gw.child.id());
    for n in 0..4 {
        let flood = agent.call_and_wait(&format!("flood{n}"), "hostile__flood", json!({ "megabytes": 15.6 }));
        assert_eq!(flood["structured"]["state"], "completed", "the upstream did answer: {flood}");
        assert_eq!(
            flood["structured"]["error"],
            json!({ "code": "result_too_large", "limit": 1_048_576 }),
            "the answer names the limit: {flood}"
        );
        assert!(flood["text"][0].as_str().unwrap().contains("Do not repeat"), "{flood}");
    }
    let after = peak_rss_kib(gw.child.id());
    assert!(after < before + 200 * 1024, "peak RSS went from {before} KiB to {after} KiB");
    let journal: u64 = files_under(gw.path()).iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).sum();
    assert!(journal < 8 * 1024 * 1024, "the data directory holds {journal} bytes after four floods");
}

/// Fails unless `text` can go to a terminal as it is (no escape sequence, carriage return, bidi
/// override or other control or invisible character but newline and tab).
pub(super) fn assert_terminal_safe(what: &str, text: &str) {
    if let Some(bad) = text.chars().find(|c| !matches!(c, '\n' | '\t') && postern_core::outside::needs_escape(*c)) {
        panic!("{what} printed {bad:?} raw: {text:?}");
    }
}

/// A cloned repository's agent config with the secrets people really put there: a Postgres DSN
/// with its password in the arguments, Supabase's documented `--access-token sbp_…`, a
/// `DATABASE_URL` with a password, and an entry whose name and command carry escape sequences
/// meant to overwrite the plan's lines. The plan counts and names every secret (by length),
/// prints nothing raw, and after the import no journal row, listing or file holds a secret.
/// (Before: the DSN, the token and the URL were "plain", landed in `credential_added` rows that
/// can never be removed, and the plan said "1 plaintext secret".)
/// A loopback HTTP target that answers every request with `answer(request)` as plain text.
fn loopback_target(answer: fn(&str) -> String) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = vec![0u8; 64 * 1024];
            let n = std::io::Read::read(&mut stream, &mut buf).unwrap_or(0);
            let body = answer(&String::from_utf8_lossy(&buf[..n]));
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = std::io::Write::write_all(&mut stream, answer.as_bytes());
        }
    });
    addr
}

/// A loopback target whose every answer carries escape sequences, a carriage return that
/// rewrites the line and bidi overrides.
fn nasty_target() -> std::net::SocketAddr {
    loopback_target(|_| "ok\u{1b}[2J\u{1b}[1;1H\rall good \u{202e}txt.exe\u{9b}31m\n".to_owned())
}

/// Outside text — a client's name from `initialize`, a string JSON-RPC id, a target's answer, a
/// server's command line, a tool manifest's names, an import plan — goes through one escaping
/// type on its way to the terminal: every command's output, text and JSON, holds no raw
/// control or bidi character. (Before: `sessions` printed a client's ESC/CR bytes, `execution
/// show` a JSON-RPC id raw, `servers list` commands raw, `call` a body raw.)
#[test]
fn every_command_prints_outside_text_escaped() {
    use std::io::{BufRead, Write};
    let target = nasty_target();
    let data = tempfile::tempdir().unwrap();
    let weird = postern_with(
        &[
            "servers",
            "add",
            "weird",
            "--start",
            "on-first-use",
            "--",
            "echo\u{1b}]0;owned\u{7}",
            "\u{202e}fdp.exe\r\u{1b}[2K",
        ],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(weird.code, 0, "{}", weird.stderr);
    let gw = Gateway::start_in(data, "");
    // A raw client on the bridge socket: its name and its request id are whatever it says.
    let path = postern_gateway::door::socket::socket_path(gw.path());
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.write_all(&postern_gateway::door::socket::bridge_hello_line()).unwrap();
    let url = format!("http://{target}/page");
    let lines = [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": { "protocolVersion": "2025-11-25",
                "capabilities": {}, "clientInfo": { "name": "agent\u{1b}[2J\r\u{202e}live", "version": "1\u{7}\u{9b}" } } }),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
        json!({ "jsonrpc": "2.0", "id": "req\u{1b}[31m\r\nexecution act_forged completed", "method": "tools/call",
                "params": { "name": "http_request", "arguments": { "method": "POST", "url": url, "body": "x" } } }),
    ];
    for l in &lines {
        writeln!(s, "{l}").unwrap();
    }
    let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
    let mut answer = String::new();
    while !answer.contains("\"execution_id\"") {
        answer.clear();
        reader.read_line(&mut answer).unwrap();
    }
    let id = serde_json::from_str::<serde_json::Value>(&answer).unwrap()["result"]["structuredContent"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let manifest = gw.path().join("cloned-tools.toml");
    // TOML spells control characters as escapes; the names they make are still outside text.
    std::fs::write(
        &manifest,
        "[[tool]]\nname = \"ok\\u001b[2J\\u202e\"\nmethod = \"GET\"\nurl = \"http://127.0.0.1:9/x\"\n",
    )
    .unwrap();
    let manifest = manifest.to_str().unwrap().to_owned();
    let call_args = json!({ "method": "GET", "url": url }).to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["status", "--json"],
        vec!["activity"],
        vec!["activity", "--json"],
        vec!["sessions"],
        vec!["sessions", "--json"],
        vec!["execution", "show", &id],
        vec!["execution", "show", &id, "--json"],
        vec!["servers", "list"],
        vec!["servers", "list", "--json"],
        vec!["vault", "list"],
        vec!["vault", "list", "--json"],
        vec!["agents", "list"],
        vec!["audit", "verify"],
        vec!["doctor"],
        vec!["doctor", "--json"],
        vec!["tools", "check", &manifest],
        vec!["tools", "list"],
        vec!["call", "http_request", "--args", &call_args],
        vec!["call", "http_request", "--args", &call_args, "--json"],
    ];
    let mut seen_escapes = 0;
    for command in &commands {
        let run = gw.postern(command);
        let all = format!("{}{}", run.stdout, run.stderr);
        assert_terminal_safe(&format!("postern {}", command.join(" ")), &all);
        if all.contains("\\u{1b}") || all.contains("\\u001b") {
            seen_escapes += 1;
        } else {
            eprintln!("no escaped value in postern {}: {all}", command.join(" "));
        }
    }
    assert!(seen_escapes >= 10, "the hostile values were shown (escaped), not lost: {seen_escapes} commands");
    drop(s);
    assert_terminal_safe("the gateway's log", &gw.stderr.lock().unwrap());
}

/// A tool manifest (a `tools.toml` from a cloned repository, say) whose SSH templates would turn
/// an argument into code on the host: every one is refused at load, each with its file and line,
/// and a legitimate template beside them still loads. (Before: only the word right before the
/// placeholder was looked at, and all fourteen loaded; the five the second review added loaded
/// after the first fix.)
#[test]
fn ssh_templates_that_would_run_an_argument_as_code_are_refused_at_load() {
    let forms = [
        "bash -lc {x}",
        "bash --login -c {x}",
        "sh -e -c {x}",
        "sudo -u deploy {x}",
        "env LANG=C {x}",
        "timeout 30 {x}",
        "nice -n 10 {x}",
        "if {x}; then echo ok; fi",
        "while {x}; do sleep 1; done",
        "xargs -0 {x}",
        "su deploy -c {x}",
        "perl -E {x}",
        "python3 -Ic {x}",
        "find . -exec {x} +",
        // Found in the second review.
        "psql -Atc {x}",
        "mysql -Ne {x}",
        "sqlite3 app.db {x}",
        "cat >/tmp/m <<EOF\nhi\n\tEOF\nlogger {x}",
        "printf $'%s\\n' {x}",
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tools.toml");
    let schema = "input_schema = { type = \"object\", properties = { x = { type = \"string\" } } }\n\
                  contract = { class = \"ssh_marker\" }\n";
    let mut text = String::new();
    let mut lines = Vec::new();
    for (i, form) in forms.iter().enumerate() {
        lines.push(text.lines().count() + 1);
        text.push_str(&format!(
            "[[tool]]\nname = \"t{i}\"\nssh = {{ host = \"box\", command = {} }}\n{schema}\n",
            serde_json::to_string(form).unwrap()
        ));
    }
    text.push_str(&format!(
        "[[tool]]\nname = \"append\"\nssh = {{ host = \"box\", command = \"printf %s {{x}} >> f\" }}\n{schema}"
    ));
    std::fs::write(&file, &text).unwrap();
    let run = postern_with(&["tools", "check", file.to_str().unwrap()], None, None, &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains(&format!("{} problem(s)", forms.len())), "only these: {}", run.stderr);
    for (form, line) in forms.iter().zip(lines) {
        let at = format!("{}:{line}:", file.display());
        let problem = run
            .stderr
            .lines()
            .find(|l| l.starts_with(&at))
            .unwrap_or_else(|| panic!("{at} for {form:?}: {}", run.stderr));
        assert!(problem.contains("ssh.command placeholder {x}"), "{form:?}: {problem}");
    }
}

/// The journal's rows of one event, read from the file (vault-stream rows are not in
/// `postern activity`).
fn journal_rows(data: &Path, event: &str) -> Vec<serde_json::Value> {
    let conn =
        rusqlite::Connection::open_with_flags(data.join("postern.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn.prepare("SELECT body FROM journal WHERE event = ?1 ORDER BY seq").unwrap();
    let rows = stmt.query_map([event], |r| r.get::<_, String>(0)).unwrap();
    rows.map(|b| serde_json::from_str::<serde_json::Value>(&b.unwrap()).unwrap()["payload"].clone()).collect()
}

/// An agent runs the owner's commands: `postern servers contract counter pay --clear` (undoing
/// the owner's `irreversible --approve-every-use`), `servers remove`, `servers add`, `vault
/// remove`. Each reaches the control socket exactly as the owner's would, and each is refused
/// because the asking process descends from the agent's run; the refusal is journaled with the
/// ancestry naming the agent, and nothing changed. (Before: each was carried out and journaled
/// like the owner's command, except for the pid.)
#[test]
fn an_agent_cannot_weaken_what_postern_holds_it_to_through_the_control_socket() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let add = super::upstreams::add_counter(data.path(), dir.path(), "counter", &format!("{}\n", canary("c")));
    assert_eq!(add.code, 0, "{}", add.stderr);
    let gw = Gateway::start_in(data, "");
    let owner =
        gw.postern(&["servers", "contract", "counter", "pay", "--class", "irreversible", "--approve-every-use"]);
    assert_eq!(owner.code, 0, "the owner's own command: {}", owner.stderr);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let read = agent.call_and_wait("read", "counter__balance", json!({}));
    assert_eq!(read["structured"]["state"], "completed", "{read}");
    let attempts: [&[&str]; 4] = [
        &["servers", "contract", "counter", "pay", "--clear"],
        &["servers", "remove", "counter"],
        &["servers", "add", "evil", "--", "true"],
        &["vault", "remove", "counter"],
    ];
    for (n, args) in attempts.iter().enumerate() {
        let ran = agent.run_postern(&format!("run{n}"), &gw, args);
        assert_eq!(ran["code"], 1, "{args:?}: {ran}");
        assert!(ran["stderr"].as_str().unwrap().contains("inside agent run"), "{args:?}: {ran}");
    }
    // Found in the second review: a process in a session of its own (`setsid`) is still the
    // agent's child, and minting a new agent token gets round a revocation.
    let detached =
        agent.run_postern_via("setsid", &gw, &["setsid"], &["servers", "contract", "counter", "pay", "--clear"]);
    let token = agent.run_postern("token", &gw, &["agents", "add", "another"]);
    for ran in [&detached, &token] {
        assert_eq!(ran["code"], 1, "{ran}");
        assert!(ran["stderr"].as_str().unwrap().contains("inside agent run"), "{ran}");
    }
    let tools = gw.postern(&["servers", "tools", "counter", "--json"]);
    let tools: serde_json::Value =
        serde_json::from_str(&tools.stdout).unwrap_or_else(|e| panic!("{e}: {}", tools.stderr));
    let pay = tools.as_array().unwrap().iter().find(|t| t["name"] == "counter__pay").unwrap().clone();
    assert_eq!(
        (pay["contract"].clone(), pay["approve_every_use"].clone()),
        (json!("irreversible"), json!(true)),
        "{pay}"
    );
    let listed = gw.postern(&["servers", "list", "--json"]).stdout;
    assert!(listed.contains("\"counter\"") && !listed.contains("evil"), "{listed}");
    let agents = gw.postern(&["agents", "list"]).stdout;
    assert!(!agents.contains("another"), "no token was minted: {agents}");
    let run = gw.sessions().iter().find(|s| s["pid"] == agent.pid).map(|s| s["id"].clone()).expect("the agent's run");
    let refused: Vec<serde_json::Value> = journal_rows(gw.path(), "request_refused")
        .into_iter()
        .filter(|d| d["decided"] == "refused_from_agent_run")
        .collect();
    assert_eq!(refused.len(), attempts.len() + 2, "{refused:?}");
    for d in &refused {
        assert_eq!(d["peer"]["agent_run"], run, "{d}");
        let ancestry = d["peer"]["ancestry"].as_array().unwrap();
        assert!(ancestry.iter().any(|a| a["pid"] == agent.pid), "the agent is in the ancestry: {d}");
        assert!(ancestry[0]["executable"].as_str().unwrap().ends_with("postern"), "{d}");
    }
    // With the server unable to start (the agent locked the vault first), the contract cannot
    // be compared with what holds: that counts as weaker, not as "not weakening".
    let lock = agent.run_postern("lock", &gw, &["vault", "lock"]);
    assert_eq!(lock["code"], 0, "locking is never refused: {lock}");
    let locked = agent.run_postern("locked", &gw, &["servers", "contract", "counter", "pay", "--clear"]);
    assert_eq!(locked["code"], 1, "{locked}");
    assert!(locked["stderr"].as_str().unwrap().contains("inside agent run"), "{locked}");
}

/// Another process of the user edits the `executions` row of an irreversible payment the gateway
/// holds as completed (its answer not confirmed delivered), writing `result_delivered` so that
/// the next identical call would be a new intent. The retry is decided from the chain, not the
/// row: nothing is sent again; the gateway raises its alarm and grants nothing more; `doctor`
/// and `audit verify` name the row. (Before: the running gateway did not notice, the call
/// dispatched a second payment, and `doctor` said the journal "verifies".)
#[test]
fn an_executions_row_edited_behind_the_gateway_grants_no_second_dispatch() {
    let target = super::gateway_support::Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let first = agent.call_and_wait("wire1", "wire", json!({ "amount": 7 }));
    assert_eq!(first["structured"]["state"], "completed", "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(target.posts(), 1);
    let conn = rusqlite::Connection::open(gw.path().join("postern.db")).unwrap();
    let edited = conn.execute("UPDATE executions SET state = 'result_delivered' WHERE id = ?1", [&id]).unwrap();
    assert_eq!(edited, 1);
    drop(conn);
    let again = agent.call_and_wait("wire2", "wire", json!({ "amount": 7 }));
    assert_eq!(target.posts(), 1, "no second payment: {again}");
    assert_eq!(again["structured"]["error"]["code"], "authority_tampered", "{again}");
    let other = agent.call_and_wait("balance", "balance", json!({}));
    assert_eq!(other["structured"]["error"]["code"], "authority_tampered", "nothing is granted any more: {other}");
    let alarms = journal_rows(gw.path(), "authority_tampered");
    assert_eq!(alarms.len(), 1, "{alarms:?}");
    assert!(alarms[0].to_string().contains(&id), "the alarm names the row: {alarms:?}");
    let doctor = gw.postern(&["doctor"]);
    assert_eq!(doctor.code, 1, "{}", doctor.stdout);
    assert!(doctor.stdout.contains("TAMPERING FOUND") && doctor.stdout.contains(&id), "{}", doctor.stdout);
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 1, "{}", verify.stdout);
}

/// An MCP session belongs to the agent token that opened it: another agent's token presenting
/// its `Mcp-Session-Id` is answered 404 and journaled, and the owner carries on in it. (Before:
/// any valid token could call on any session — and so, for one, mark the first agent's
/// undelivered result delivered.)
#[test]
fn an_mcp_session_answers_only_the_token_that_opened_it() {
    use super::gateway::{post_initialize, post_mcp};
    let gw = Gateway::start("");
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let (alice, mallory) = (gw.add_agent("alice"), gw.add_agent("mallory"));
    let (status, answer) = post_initialize(&addr, &format!("Authorization: Bearer {alice}\r\n"));
    assert_eq!(status, 200, "{answer}");
    let session = answer
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: ").or_else(|| l.strip_prefix("Mcp-Session-Id: ")))
        .unwrap_or_else(|| panic!("no session in {answer}"))
        .trim()
        .to_owned();
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let as_token = |token: &str| {
        let headers = format!(
            "Authorization: Bearer {token}\r\nMcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"
        );
        post_mcp(&addr, &headers, list)
    };
    let (stolen, body) = as_token(&mallory);
    assert_eq!(stolen, 404, "{body}");
    assert!(body.contains("session_not_found"), "{body}");
    let (own, body) = as_token(&alice);
    assert_eq!(own, 200, "the owner carries on: {body}");
    assert!(body.contains("execution_status"), "{body}");
    let refused = journal_rows(gw.path(), "request_refused");
    assert!(refused.iter().any(|d| d["attempted"] == "MCP session of agent \"alice\""), "{refused:?}");
}

/// `servers list --json` beside the gateway, by server name.
fn server_states(gw: &Gateway) -> std::collections::BTreeMap<String, serde_json::Value> {
    let run = gw.postern(&["servers", "list", "--json"]);
    let all: Vec<serde_json::Value> =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stderr));
    all.into_iter().map(|s| (s["name"].as_str().unwrap().to_owned(), s)).collect()
}

/// A server that never answers `initialize` (here, `sleep`) starting beside a working one: the
/// working server's tools are listed and its calls answered while the other is still starting.
/// (Before: one lock for all servers; the hung start held every other server's calls for the 30 s
/// start timeout.)
#[test]
fn a_server_that_never_answers_delays_no_other_server() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let add = super::upstreams::add_counter(data.path(), dir.path(), "counter", &format!("{}\n", canary("t")));
    assert_eq!(add.code, 0, "{}", add.stderr);
    let hang = postern_with(&["servers", "add", "hang", "--", "sleep", "3600"], Some(data.path()), None, &[]);
    assert_eq!(hang.code, 0, "{}", hang.stderr);
    let (gw, mut agent) = serve_with_agent(data);
    let tools = agent.tools();
    assert!(tools.to_string().contains("counter__pay"), "{tools}");
    let paid = agent.call_and_wait("pay", "counter__pay", json!({ "amount": 3 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    assert_eq!(super::upstreams::count(dir.path(), "pay"), 1);
    let states = server_states(&gw);
    assert_eq!(
        states["hang"]["state"], "starting",
        "the call was answered while the other server was still starting: {states:?}"
    );
    assert_eq!(states["counter"]["state"], "running", "{states:?}");
}

/// Found in the second review: a server whose tool list never ends (every page has a
/// `nextCursor`) is refused at start with a message saying so, instead of being followed until
/// memory runs out; and a server that says its tools changed and then never answers `tools/list`
/// again keeps its earlier list and answers its calls, instead of holding its start lock (and
/// every call, restart and removal behind it) for ever.
#[test]
fn an_endless_or_stalled_tool_list_holds_nothing_up() {
    let data = tempfile::tempdir().unwrap();
    let pager = repo_root().join("tests/upstreams/pager.py");
    for (name, mode) in [("endless", "endless"), ("stalls", "relist-hang")] {
        add_server(data.path(), name, &[python().to_str().unwrap(), pager.to_str().unwrap(), mode]);
    }
    let (gw, mut agent) = serve_with_agent(data);
    let first = agent.call_and_wait("first", "stalls__poke", json!({}));
    assert_eq!(first["structured"]["state"], "completed", "{first}");
    // It said its tools changed: the next call lists them again, waits a few seconds for an
    // answer that never comes, keeps the list it had and goes on.
    let second = agent.call_and_wait("second", "stalls__poke", json!({}));
    assert_eq!(second["structured"]["state"], "completed", "{second}");
    let states = eventually("the endless list refused", Duration::from_secs(30), || {
        let states = server_states(&gw);
        states["endless"]["last_error"].as_str().is_some_and(|e| e.contains("more pages")).then_some(states)
    });
    assert_ne!(states["endless"]["state"], "running", "{states:?}");
    assert_eq!(states["stalls"]["state"], "running", "{states:?}");
}

/// `vault lock`: within the gateway's next upkeep every server holding a secret Postern gave it
/// is stopped — a stdio server with a secret environment value (its process ends), a remote one
/// reached with a credential (its session closed) — the secrets kept in memory are dropped, and a
/// server holding none runs on. (Before: kept secrets stayed in memory, remote sessions stayed
/// connected and stdio servers kept running with their secret environment.)
#[test]
fn a_vault_lock_stops_the_servers_that_hold_secrets_and_drops_the_kept_ones() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let add = super::upstreams::add_counter(data.path(), dir.path(), "counter", &format!("{}\n", canary("t")));
    assert_eq!(add.code, 0, "{}", add.stderr);
    let python = python();
    let plain = postern_with(
        &["servers", "add", "plain", "--", python.to_str().unwrap(), &hostile_script()],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let mut remote = remote_hostile(data.path(), &canary("r"));
    let (gw, mut agent) = serve_with_agent(data);
    for tool in ["counter__balance", "remote__ok_tool", "plain__ok_tool"] {
        let r = agent.call_and_wait(tool, tool, json!({}));
        assert_eq!(r["structured"]["state"], "completed", "{r}");
    }
    let before = server_states(&gw);
    let counter_pid = before["counter"]["pid"].as_u64().unwrap();
    assert!(["counter", "remote", "plain"].iter().all(|s| before[*s]["state"] == "running"), "{before:?}");
    let kept = |gw: &Gateway| {
        let status = gw.postern(&["status"]).stdout;
        status.lines().find(|l| l.starts_with("secrets")).unwrap_or_default().to_owned()
    };
    assert!(!kept(&gw).starts_with("secrets     0 "), "the remote server's credential is kept: {}", kept(&gw));
    let lock = gw.postern(&["vault", "lock"]);
    assert_eq!(lock.code, 0, "{}", lock.stderr);
    eventually("the servers holding secrets to stop", Duration::from_secs(15), || {
        let now = server_states(&gw);
        (now["counter"]["state"] == "stopped" && now["remote"]["state"] == "stopped").then_some(())
    });
    eventually("the counter's process to end", Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{counter_pid}")).exists()).then_some(())
    });
    assert!(kept(&gw).starts_with("secrets     0 "), "{}", kept(&gw));
    assert_eq!(server_states(&gw)["plain"]["state"], "running", "a server holding no secret runs on");
    let _ = remote.kill();
    let _ = remote.wait();
}

/// A loopback target that answers every request with the request itself (its request line and
/// headers), as a careless API echoes what it was sent.
fn echo_target() -> std::net::SocketAddr {
    loopback_target(|request| format!("you sent:\n{request}"))
}

/// A manifest tool whose contract marks `code` secret puts it in the URL (`?code={code}`), and
/// the target echoes the request: the secret is masked in the answer and in the stored result,
/// not only in the `dispatched` row. (Before: masked in the journal's rows, stored in clear in
/// `results` and sent to the agent.)
#[test]
fn a_secret_argument_a_target_echoes_is_masked_in_the_result_too() {
    let code = canary("code");
    let target = echo_target();
    let manifest = format!(
        "[[tool]]\nname = \"redeem\"\ndescription = \"Redeem a one-time code.\"\nmethod = \"POST\"\n\
         url = \"http://{target}/redeem?code={{code}}\"\n\
         input_schema = {{ type = \"object\", properties = {{ code = {{ type = \"string\" }} }}, required = [\"code\"] }}\n\
         contract = {{ class = \"irreversible\", secret_fields = [\"code\"] }}\n"
    );
    let gw = Gateway::start(&manifest);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let redeemed = agent.call_and_wait("redeem", "redeem", json!({ "code": code }));
    assert_eq!(redeemed["structured"]["state"], "completed", "{redeemed}");
    assert_eq!(redeemed["structured"]["result"]["secret_echoed"], true, "{redeemed}");
    assert!(redeemed.to_string().contains("code=SECRET(code:"), "the echo shows the masked value: {redeemed}");
    let id = redeemed["structured"]["execution_id"].as_str().unwrap();
    let status = agent.call_and_wait("status", "execution_status", json!({ "execution_id": id }));
    drop(agent);
    let log = gw.stderr.lock().unwrap().clone();
    assert_nowhere(
        &[&code],
        &[gw.path()],
        &[("the answer", &redeemed.to_string()), ("execution_status", &status.to_string()), ("the log", &log)],
    );
}
