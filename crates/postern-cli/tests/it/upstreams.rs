//! Upstream MCP servers behind the gateway, end to end: a counting server built on the official
//! Python SDK runs as Postern's child over stdio, an agent on the Python SDK calls its tools
//! through `postern mcp`, and every effect is counted at the upstream (its own file), not in logs.

use super::gateway_support::{Agent, Gateway, Sdk, repo_root};
use super::support::{file_containing, postern_with};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

pub(super) const CANARY: &str = "canary-upstream-token-5f1c9e2a7d";

/// Overrides the owner makes for the counting server: `charge` honours an idempotency key.
const MANIFEST: &str = r#"
[servers.counter.tools.charge]
idempotency_argument = "idempotencyKey"
"#;

struct Upstream {
    gw: Gateway,
    dir: tempfile::TempDir,
    agent: Agent,
}

fn python() -> PathBuf {
    repo_root().join("tests/clients/python/.venv/bin/python")
}

/// `postern servers add NAME` for the counting server keeping its effects in `dir`, with
/// `stdin` as what the secret prompt reads.
pub(super) fn add_counter(data: &Path, dir: &Path, name: &str, stdin: &str) -> super::support::Run {
    std::fs::write(dir.join("expected_token"), CANARY).unwrap();
    let counter_dir = format!("COUNTER_DIR={}", dir.display());
    let script = repo_root().join("tests/upstreams/counting.py");
    let python = python();
    let args = ["servers", "add", name, "--env", &counter_dir, "--secret-env", "COUNTER_TOKEN", "--"];
    let command = [python.to_str().unwrap(), script.to_str().unwrap()];
    let all: Vec<&str> = args.iter().chain(command.iter()).copied().collect();
    postern_with(&all, Some(data), Some(stdin), &[])
}

/// A data directory with the counting server added (its token through stdin), and a gateway
/// with an agent connected over the stdio bridge.
fn start() -> Upstream {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let add = add_counter(data.path(), dir.path(), "counter", &format!("{CANARY}\n"));
    assert_eq!(add.code, 0, "{}", add.stderr);
    let gw = Gateway::start_in(data, MANIFEST);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    Upstream { gw, dir, agent }
}

fn effects(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("effects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(super) fn count(dir: &Path, kind: &str) -> usize {
    effects(dir).iter().filter(|e| e["kind"] == kind).count()
}

fn die_after_next_effect(dir: &Path) {
    std::fs::write(dir.join("die_after_effect"), "").unwrap();
}

#[test]
fn upstream_tools_are_offered_namespaced_with_their_contracts_and_each_call_is_an_execution() {
    let Upstream { gw, dir, mut agent } = start();
    let tools = agent.tools();
    let find = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {tools}"))
    };
    // The server's hints are only its claims: until the owner confirms them, a hinted tool is
    // held to irreversible, and the agent is told what the hints suggest.
    for (name, contract, hinted) in [
        ("counter__balance", "irreversible", Some("read_only")),
        ("counter__set_flag", "irreversible", Some("idempotent")),
        ("counter__pay", "irreversible", None),
        ("counter__charge", "idempotency_key", None),
    ] {
        let t = find(name);
        let description = t["description"].as_str().unwrap();
        assert!(description.contains(&format!("Replay contract: {contract}")), "{t}");
        if let Some(hinted) = hinted {
            assert!(description.contains(&format!("hints suggest {hinted}, which its owner has not confirmed")), "{t}");
        }
    }
    assert_eq!(find("counter__balance")["annotations"]["readOnlyHint"], false, "not before the owner confirms it");
    assert_eq!(find("counter__pay")["annotations"]["destructiveHint"], true);
    // An idempotency key does not make a repeat harmless to an agent (a repeat after delivery
    // is a new execution): not advertised as idempotent.
    assert_eq!(find("counter__charge")["annotations"]["idempotentHint"], false);

    let read = agent.call_and_wait("read", "counter__balance", json!({}));
    assert_eq!(read["structured"]["state"], "completed", "{read}");
    let listed = gw.postern(&["servers", "list", "--json"]);
    let listed: Value = serde_json::from_str(&listed.stdout).unwrap_or_else(|e| panic!("{e}: {}", listed.stderr));
    assert_eq!(
        (listed[0]["name"].as_str(), listed[0]["state"].as_str()),
        (Some("counter"), Some("running")),
        "{listed}"
    );
    assert_eq!(listed[0]["tools"], 6, "{listed}");
    let text = read["text"].to_string();
    assert!(text.contains(r#"\"token_ok\": true"#), "the secret reached the server's environment: {read}");

    let paid = agent.call_and_wait("pay", "counter__pay", json!({ "amount": 5 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    assert!(paid["text"].to_string().contains("paid 5"), "{paid}");
    let id = paid["structured"]["execution_id"].as_str().unwrap().to_owned();
    let pays: Vec<Value> = effects(dir.path()).into_iter().filter(|e| e["kind"] == "pay").collect();
    assert_eq!(pays.len(), 1);
    assert_eq!(pays[0]["execution_id"], id.as_str(), "the execution ID travels in _meta");

    // Journaled as an execution on the mcp channel, with its contract.
    let accepted =
        gw.activity().into_iter().find(|r| r["execution_id"] == id.as_str() && r["event"] == "accepted").unwrap();
    assert_eq!(accepted["detail"]["record"]["channel"], "mcp", "{accepted}");
    assert_eq!(accepted["detail"]["record"]["target"], json!({ "server": "counter", "tool": "pay" }));

    // Schema-invalid arguments are refused before anything is sent.
    let bad = agent.call_and_wait("bad", "counter__pay", json!({ "amount": "five" }));
    assert_eq!(bad["is_error"], true, "{bad}");
    assert_eq!(count(dir.path(), "pay"), 1);

    // `servers restart` stops the process (SIGTERM) and starts a new one.
    let pid_of = |read: &Value| -> u32 {
        // The upstream's own content follows Postern's account of the execution.
        let own = read["text"].as_array().unwrap().iter().find_map(|t| serde_json::from_str::<Value>(t.as_str()?).ok());
        own.and_then(|v| v["pid"].as_u64()).unwrap_or_else(|| panic!("no pid in {read}")) as u32
    };
    let before = pid_of(&read);
    let restarted = gw.postern(&["servers", "restart", "counter"]);
    assert_eq!(restarted.code, 0, "{}", restarted.stderr);
    assert!(restarted.stderr.contains("running"), "{}", restarted.stderr);
    let again = agent.call_and_wait("read2", "counter__balance", json!({}));
    assert_ne!(pid_of(&again), before, "{again}");
    super::gateway_support::eventually("the old server gone", std::time::Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{before}")).exists()).then_some(())
    });

    // A secret passed as an argument (named like one) is digested in the record, never stored.
    let password = "canary-argument-password-61fd0c";
    let login = agent.call_and_wait("login", "counter__login", json!({ "username": "ada", "password": password }));
    assert_eq!(login["structured"]["state"], "completed", "{login}");
    let login_id = login["structured"]["execution_id"].as_str().unwrap();
    let record = gw.activity().into_iter().find(|r| r["execution_id"] == login_id && r["event"] == "accepted").unwrap();
    assert!(record["detail"]["record"]["arguments"]["password"]["secret_digest"].is_string(), "{record}");

    // The secrets are in no Postern file (journal, WAL, logs) and not in the gateway's log.
    drop(agent);
    for secret in [CANARY, password] {
        assert_eq!(file_containing(gw.path(), secret), None);
        assert!(!gw.stderr.lock().unwrap().contains(secret));
    }
}

#[test]
fn an_upstream_that_dies_after_the_effect_is_recovered_by_each_tools_contract() {
    let Upstream { gw, dir, mut agent } = start();
    let d = dir.path();

    // Irreversible: unknown, then review; never a second payment.
    die_after_next_effect(d);
    let first = agent.call_and_wait("pay1", "counter__pay", json!({ "amount": 7 }));
    assert_eq!(first["structured"]["state"], "outcome_unknown", "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    let retry = agent.call_and_wait("pay2", "counter__pay", json!({ "amount": 7 }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["state"], "needs_review", "{retry}");
    assert_eq!(count(d, "pay"), 1, "one payment at the upstream");

    // Idempotency key: re-sent with the same key, which the upstream dedupes.
    die_after_next_effect(d);
    let first = agent.call_and_wait("charge1", "counter__charge", json!({ "amount": 9 }));
    assert_eq!(first["structured"]["state"], "outcome_unknown", "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    // While the server cannot even start, the recovery re-send is not sent: still unknown, never
    // "failed before dispatch" (which would let the next call become a second charge).
    std::fs::write(d.join("refuse_start"), "").unwrap();
    let blocked = agent.call_and_wait("charge2", "counter__charge", json!({ "amount": 9 }));
    assert_eq!(blocked["structured"]["execution_id"], id.as_str(), "{blocked}");
    assert_eq!(blocked["structured"]["state"], "outcome_unknown", "{blocked}");
    // `servers list`, beside the running gateway, says why the server is down.
    let listed = gw.postern(&["servers", "list", "--json"]);
    let listed: Value = serde_json::from_str(&listed.stdout).unwrap_or_else(|e| panic!("{e}: {}", listed.stderr));
    assert_eq!(listed[0]["state"], "crashed", "{listed}");
    assert!(listed[0]["last_error"].as_str().unwrap().contains("did not complete MCP initialization"), "{listed}");
    std::fs::remove_file(d.join("refuse_start")).unwrap();
    // A failed start is retried after a back-off (1 s after the first failure).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let retry = agent.call_and_wait("charge3", "counter__charge", json!({ "amount": 9 }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["state"], "completed", "{retry}");
    assert!(retry["text"].to_string().contains("replayed for key"), "the upstream answered from its key: {retry}");
    let charges: Vec<Value> = effects(d).into_iter().filter(|e| e["kind"] == "charge").collect();
    assert_eq!(charges.len(), 1, "one charge at the upstream: {charges:?}");
    assert_eq!(charges[0]["key"], id.as_str(), "the key is the execution ID");

    // Idempotent by the server's hint alone (#27 finding 6): a hint is the server's claim, and
    // `set_flag` records a real effect each time. Until the owner confirms it, the uncertain
    // outcome is never re-sent; before, Postern re-sent it on the hint's word.
    die_after_next_effect(d);
    let first = agent.call_and_wait("flag1", "counter__set_flag", json!({ "name": "deployed" }));
    assert_eq!(first["structured"]["state"], "outcome_unknown", "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    let retry = agent.call_and_wait("flag2", "counter__set_flag", json!({ "name": "deployed" }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["state"], "needs_review", "{retry}");
    assert_eq!(count(d, "set_flag"), 1, "the hint did not send it again");
    assert_eq!(gw.events_of(&id).iter().filter(|e| *e == "dispatched").count(), 1);

    // The owner confirms the hint, beside the running gateway: idempotent now, re-sent as it was.
    let wrong = gw.postern(&["servers", "contract", "counter", "set_flag", "--confirm", "read-only"]);
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("now hints idempotent"), "only what the owner saw is confirmed: {}", wrong.stderr);
    let confirmed = gw.postern(&["servers", "contract", "counter", "set_flag", "--confirm", "idempotent"]);
    assert_eq!(confirmed.code, 0, "{}", confirmed.stderr);
    assert!(confirmed.stderr.contains("hint (idempotent) is confirmed"), "{}", confirmed.stderr);
    let nothing = gw.postern(&["servers", "contract", "counter", "pay", "--confirm", "idempotent"]);
    assert_eq!(nothing.code, 2, "{}", nothing.stderr);
    assert!(nothing.stderr.contains("gives no hint to confirm"), "{}", nothing.stderr);
    die_after_next_effect(d);
    let first = agent.call_and_wait("flag3", "counter__set_flag", json!({ "name": "released" }));
    assert_eq!(first["structured"]["state"], "outcome_unknown", "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    let retry = agent.call_and_wait("flag4", "counter__set_flag", json!({ "name": "released" }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["state"], "completed", "{retry}");
    let released: Vec<Value> = effects(d).into_iter().filter(|e| e["name"] == "released").collect();
    assert!(released.iter().all(|e| e["execution_id"] == id.as_str()), "{released:?}");
    let events = gw.events_of(&id);
    assert!(events.iter().filter(|e| *e == "dispatched").count() == 2, "{events:?}");
}

#[test]
fn a_gateway_killed_mid_upstream_call_recovers_by_the_same_rules_after_restart() {
    let Upstream { gw, dir, mut agent } = start();
    let d = dir.path();
    std::fs::write(d.join("hold_after_effect"), "").unwrap();
    agent.call("pay1", "counter__pay", json!({ "amount": 11 }));
    super::gateway_support::eventually("the payment at the upstream", std::time::Duration::from_secs(20), || {
        (count(d, "pay") == 1).then_some(())
    });
    let gw = gw.crash_and_restart(MANIFEST);
    std::fs::remove_file(d.join("hold_after_effect")).unwrap();
    let ids = gw.executions_of("counter__pay");
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0].clone();
    assert!(gw.events_of(&id).contains(&"outcome_unknown".to_owned()), "{:?}", gw.events_of(&id));
    // The same agent process (the same run) reconnects and repeats the call: irreversible and
    // unknown, so it goes to review and nothing is sent again.
    agent.connect(gw.bridge_command());
    let retry = agent.call_and_wait("pay2", "counter__pay", json!({ "amount": 11 }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["state"], "needs_review", "{retry}");
    assert_eq!(count(d, "pay"), 1, "one payment at the upstream");
}

#[test]
fn servers_are_added_listed_inspected_and_removed_without_their_secret_showing() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let add = |name: &str, stdin: &str| add_counter(data.path(), dir.path(), name, stdin);
    let missing = add("counter", "");
    assert_eq!(missing.code, 2, "no value for the declared secret: {}", missing.stderr);
    assert!(missing.stderr.contains("COUNTER_TOKEN"), "{}", missing.stderr);
    let bad = add("a__b", &format!("{CANARY}\n"));
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("separates the server from the tool"), "{}", bad.stderr);
    assert_eq!(add("counter", &format!("{CANARY}\n")).code, 0);
    assert_eq!(add("counter", &format!("{CANARY}\n")).code, 2, "a second server of that name");

    let list = postern_with(&["servers", "list", "--json"], Some(data.path()), None, &[]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    let servers: Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(servers[0]["name"], "counter");
    assert_eq!(servers[0]["secret_env"], json!(["COUNTER_TOKEN"]));
    assert!(!list.stdout.contains(CANARY));

    let manifest = data.path().join("tools.toml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let tools = postern_with(
        &["servers", "tools", "counter", "--json", "--tools", manifest.to_str().unwrap()],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(tools.code, 0, "{}", tools.stderr);
    let tools: Value = serde_json::from_str(&tools.stdout).unwrap();
    let contract = |name: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| (t["contract"].clone(), t["contract_from"].clone()))
    };
    assert_eq!(contract("counter__balance"), Some((json!("irreversible"), json!("hints_unconfirmed"))));
    assert_eq!(contract("counter__set_flag"), Some((json!("irreversible"), json!("hints_unconfirmed"))));
    let hinted = tools.as_array().unwrap().iter().find(|t| t["name"] == "counter__balance").unwrap()["hinted"].clone();
    assert_eq!(hinted, "read_only");
    assert_eq!(contract("counter__pay"), Some((json!("irreversible"), json!("default"))));
    assert_eq!(contract("counter__charge"), Some((json!("idempotency_key"), json!("tools.toml"))));

    // The owner holds a tool to a contract of their own (the app's Servers view does the same):
    // checked against the tool's schema, refused where tools.toml decides, journaled.
    let manifest_arg = manifest.to_str().unwrap();
    let owner = |args: &[&str]| {
        let all: Vec<&str> = ["servers", "contract", "counter"].iter().chain(args).copied().collect();
        postern_with(&[all.as_slice(), &["--tools", manifest_arg]].concat(), Some(data.path()), None, &[])
    };
    let wrong = owner(&["pay", "--class", "idempotency-key", "--idempotency-argument", "nonce"]);
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("\"nonce\" is not an argument of counter__pay (its arguments: "), "{}", wrong.stderr);
    let decided = owner(&["charge", "--class", "idempotent"]);
    assert_eq!(decided.code, 2, "{}", decided.stderr);
    assert!(decided.stderr.contains("set in tools.toml ([servers.counter.tools.charge])"), "{}", decided.stderr);
    let missing = owner(&["refund", "--class", "idempotent"]);
    assert!(missing.code == 2 && missing.stderr.contains("offers no tool \"refund\""), "{}", missing.stderr);
    let set = owner(&["pay", "--class", "idempotent"]);
    assert_eq!(set.code, 0, "{}", set.stderr);
    let contract_of = |tool: &str| {
        let listed = postern_with(
            &["servers", "tools", "counter", "--json", "--tools", manifest_arg],
            Some(data.path()),
            None,
            &[],
        );
        assert_eq!(listed.code, 0, "{}", listed.stderr);
        let tools: Value = serde_json::from_str(&listed.stdout).unwrap();
        let t = tools.as_array().unwrap().iter().find(|t| t["name"] == tool).unwrap().clone();
        (t["contract"].clone(), t["contract_from"].clone())
    };
    assert_eq!(contract_of("counter__pay"), (json!("idempotent"), json!("owner")));
    let cleared = owner(&["pay", "--clear"]);
    assert_eq!(cleared.code, 0, "{}", cleared.stderr);
    assert_eq!(contract_of("counter__pay"), (json!("irreversible"), json!("default")));
    let journal = postern_with(&["audit", "verify"], Some(data.path()), None, &[]);
    assert_eq!(journal.code, 0, "the journal verifies after the owner's changes: {}", journal.stderr);

    let lazy = postern_with(&["servers", "set", "counter", "--start", "on-first-use"], Some(data.path()), None, &[]);
    assert_eq!(lazy.code, 0, "{}", lazy.stderr);
    let list = postern_with(&["servers", "list", "--json"], Some(data.path()), None, &[]);
    assert_eq!(serde_json::from_str::<Value>(&list.stdout).unwrap()[0]["start"], "on_first_use");

    assert_eq!(file_containing(data.path(), CANARY), None, "the secret is only in the keychain");
    let removed = postern_with(&["servers", "remove", "counter"], Some(data.path()), None, &[]);
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    let gone = postern_with(&["servers", "tools", "counter"], Some(data.path()), None, &[]);
    assert_eq!(gone.code, 2, "{}", gone.stderr);
    assert!(gone.stderr.contains("no MCP server named \"counter\""), "{}", gone.stderr);
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            hits.extend(files_containing(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) {
            hits.push(path);
        }
    }
    hits
}

#[test]
fn import_moves_agent_config_secrets_into_the_keychain_and_undo_restores_the_files() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("expected_token"), CANARY).unwrap();
    let python = python();
    let script = repo_root().join("tests/upstreams/counting.py");
    let server = |token: &str| json!({ "command": python, "args": [script], "env": { "COUNTER_DIR": dir.path(), "COUNTER_TOKEN": token } });
    let claude = serde_json::to_vec_pretty(&json!({
        "numStartups": 3,
        "mcpServers": { "counter": server(CANARY) },
        "projects": { "/src/app": { "allowedTools": [] } },
    }))
    .unwrap();
    let other_canary = "canary-cursor-token-8e3b1a90c4";
    let cursor = serde_json::to_vec_pretty(&json!({ "mcpServers": { "counter": server(other_canary) } })).unwrap();
    std::fs::write(home.path().join(".claude.json"), &claude).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::set_permissions(home.path().join(".claude.json"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(home.path().join(".cursor")).unwrap();
    std::fs::write(home.path().join(".cursor/mcp.json"), &cursor).unwrap();
    let data = tempfile::tempdir().unwrap();
    let home_env = [("HOME", home.path().to_str().unwrap())];
    let import = |extra: &[&str]| {
        let mut args = vec!["servers", "import", "--from", "claude-code", "--from", "cursor"];
        args.extend_from_slice(extra);
        postern_with(&args, Some(data.path()), None, &home_env)
    };

    let plan = import(&["--dry-run"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert!(plan.stdout.contains(&format!("COUNTER_TOKEN ({} characters)", CANARY.len())), "{}", plan.stdout);
    assert!(plan.stdout.contains("2 MCP server(s) with 2 plaintext secret(s)"), "{}", plan.stdout);
    assert!(!plan.stdout.contains(CANARY) && !plan.stderr.contains(CANARY), "the plan never prints a secret");
    assert_eq!(std::fs::read(home.path().join(".claude.json")).unwrap(), claude, "a dry run changes nothing");
    let refused = import(&[]);
    assert_eq!(refused.code, 2, "no terminal and no --yes: {}", refused.stderr);

    let done = import(&["--yes"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    for canary in [CANARY, other_canary] {
        assert_eq!(files_containing(home.path(), canary), Vec::<PathBuf>::new(), "no secret left under HOME");
        assert_eq!(files_containing(data.path(), canary), Vec::<PathBuf>::new(), "none in Postern's files");
    }
    let after: Value = serde_json::from_slice(&std::fs::read(home.path().join(".claude.json")).unwrap()).unwrap();
    assert_eq!(after["mcpServers"]["postern"]["args"], json!(["mcp"]), "{after}");
    assert!(after["mcpServers"]["postern"]["command"].as_str().unwrap().ends_with("postern"));
    assert_eq!(after["numStartups"], 3, "the rest of the file is kept");
    assert_eq!(mode(&home.path().join(".claude.json")), 0o600, "the file keeps its mode");
    let list = postern_with(&["servers", "list", "--json"], Some(data.path()), None, &[]);
    let names: Vec<String> = serde_json::from_str::<Vec<Value>>(&list.stdout)
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["counter", "counter-2"]);

    {
        // The agent's call reaches the upstream, which has its token in its environment.
        let mut gw = Gateway::start_in(data, "");
        let mut agent = Agent::start(Sdk::Python);
        agent.connect(gw.bridge_command());
        let read = agent.call_and_wait("read", "counter__balance", json!({}));
        assert!(read["text"].to_string().contains(r#"\"token_ok\": true"#), "{read}");
        drop(agent);
        let stderr = gw.stderr.lock().unwrap().clone();
        assert!(!stderr.contains(CANARY));
        // Stop the gateway but keep its data directory.
        let data = std::mem::replace(&mut gw.data_dir, tempfile::tempdir().unwrap());
        drop(gw);
        let data_path = data.path().to_owned();
        let undone = postern_with(&["servers", "import", "--undo"], Some(&data_path), None, &home_env);
        assert_eq!(undone.code, 0, "{}", undone.stderr);
        assert_eq!(std::fs::read(home.path().join(".claude.json")).unwrap(), claude, "the original bytes");
        assert_eq!(mode(&home.path().join(".claude.json")), 0o600);
        assert_eq!(std::fs::read(home.path().join(".cursor/mcp.json")).unwrap(), cursor);
        let list = postern_with(&["servers", "list", "--json"], Some(&data_path), None, &[]);
        assert_eq!(list.stdout.trim(), "[]", "the imported servers are removed");
    }
}

/// The official reference servers from npm (pinned in tests/clients/ts/package-lock.json), as a
/// user would add them.
#[test]
fn the_reference_servers_run_behind_postern_with_only_their_own_environment() {
    let data = tempfile::tempdir().unwrap();
    let allowed = tempfile::tempdir().unwrap();
    let modules = repo_root().join("tests/clients/ts/node_modules/@modelcontextprotocol");
    assert!(modules.join("server-everything").exists(), "run the tests through scripts/test.sh (npm ci)");
    let everything = modules.join("server-everything/dist/index.js");
    let filesystem = modules.join("server-filesystem/dist/index.js");
    for (name, args) in [
        ("everything", vec![everything.to_str().unwrap(), "stdio"]),
        ("fs", vec![filesystem.to_str().unwrap(), allowed.path().to_str().unwrap()]),
    ] {
        let mut all = vec!["servers", "add", name, "--env", "MARKER=declared", "--", "node"];
        all.extend(args);
        let add = postern_with(&all, Some(data.path()), None, &[]);
        assert_eq!(add.code, 0, "{}", add.stderr);
    }
    let gw = Gateway::start_with(data, "", &[("POSTERN_TEST_LEAK", "leak-canary-4d2e")]);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let tools = agent.tools();
    let description = |name: &str| {
        tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).map(|t| t["description"].to_string())
    };
    // Their annotations are only suggestions until the owner confirms them.
    assert!(description("everything__echo").unwrap().contains("hints suggest read_only"));
    assert!(description("fs__write_file").unwrap().contains("hints suggest idempotent"));
    assert!(description("fs__move_file").unwrap().contains("Replay contract: irreversible"));

    let echo = agent.call_and_wait("echo", "everything__echo", json!({ "message": "through postern" }));
    assert_eq!(echo["structured"]["state"], "completed", "{echo}");
    assert!(echo["text"].to_string().contains("through postern"), "{echo}");

    // The server sees its declared environment, never the gateway's.
    let env = agent.call_and_wait("env", "everything__get-env", json!({}));
    let env_text = env["text"].to_string();
    assert!(env_text.contains("MARKER") && env_text.contains("declared"), "{env}");
    assert!(!env_text.contains("leak-canary-4d2e") && !env_text.contains("POSTERN_DATA_DIR"), "{env}");

    let target = allowed.path().join("note.txt");
    let wrote = agent.call_and_wait("write", "fs__write_file", json!({ "path": target, "content": "hello" }));
    assert_eq!(wrote["structured"]["state"], "completed", "{wrote}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hello");
    // The server's own refusal is a completed execution whose result is an error.
    let outside = agent.call_and_wait("outside", "fs__read_text_file", json!({ "path": "/etc/hostname" }));
    assert_eq!(outside["structured"]["state"], "completed", "{outside}");
    assert_eq!(outside["is_error"], true, "{outside}");
    let id = wrote["structured"]["execution_id"].as_str().unwrap();
    let accepted = gw.activity().into_iter().find(|r| r["execution_id"] == id && r["event"] == "accepted").unwrap();
    assert_eq!(accepted["detail"]["record"]["target"], json!({ "server": "fs", "tool": "write_file" }), "{accepted}");
}

#[test]
fn a_remote_upstream_gets_its_vault_credential_and_its_calls_are_executions() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("expected_token"), CANARY).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut upstream = std::process::Command::new(python())
        .arg(repo_root().join("tests/upstreams/counting.py"))
        .args(["--http", &port.to_string()])
        .env("COUNTER_DIR", dir.path())
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    super::gateway_support::eventually("the remote upstream listening", std::time::Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let host = format!("127.0.0.1:{port}");
    let url = format!("http://{host}/mcp");
    let cred = postern_with(
        &["vault", "add", "counter-api", "--kind", "bearer", "--host", &host],
        Some(data.path()),
        Some(&format!("{CANARY}\n")),
        &[],
    );
    assert_eq!(cred.code, 0, "{}", cred.stderr);
    let unbound = postern_with(
        &["servers", "add", "remote", "--url", "http://127.0.0.1:1/mcp", "--credential", "counter-api"],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(unbound.code, 2, "a credential is only sent where it is bound: {}", unbound.stderr);
    let add = postern_with(
        &["servers", "add", "remote", "--url", &url, "--credential", "counter-api"],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(add.code, 0, "{}", add.stderr);
    let gw = Gateway::start_in(data, "");
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let paid = agent.call_and_wait("pay", "remote__pay", json!({ "amount": 4 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    let id = paid["structured"]["execution_id"].as_str().unwrap();
    let pays: Vec<Value> = effects(dir.path()).into_iter().filter(|e| e["kind"] == "pay").collect();
    assert_eq!(pays.len(), 1);
    assert_eq!(pays[0]["execution_id"], id, "the execution ID travels in _meta over HTTP too");
    assert!(!dir.path().join("unauthorized.log").exists(), "every request carried the credential");
    drop(agent);
    assert_eq!(file_containing(gw.path(), CANARY), None);
    assert!(!gw.stderr.lock().unwrap().contains(CANARY));
    let _ = upstream.kill();
    let _ = upstream.wait();
}

#[test]
fn upstream_resources_and_prompts_are_offered_namespaced_and_each_read_is_journaled() {
    let Upstream { gw, dir, mut agent } = start();
    let mut read = |command: Value| {
        let mut command = command;
        command["op"] = json!("read");
        agent.send(command);
        agent.expect("a read", |e| e["event"] == "read")
    };
    let resources = read(json!({ "what": "resources" }));
    assert_eq!(
        resources["data"],
        json!([{ "uri": "postern://counter/counter://effects", "name": "counter__effects" }]),
        "{resources}"
    );
    let before = gw.activity().len();
    let effects = read(json!({ "what": "resource", "uri": "postern://counter/counter://effects" }));
    assert_eq!(effects["ok"], true, "{effects}");
    assert_eq!(effects["data"][0]["uri"], "postern://counter/counter://effects");
    assert_eq!(effects["data"][0]["text"], "[]");
    let unknown = read(json!({ "what": "resource", "uri": "counter://effects" }));
    assert_eq!(unknown["ok"], false, "only namespaced URIs: {unknown}");
    let templates = read(json!({ "what": "templates" }));
    assert_eq!(
        templates["data"],
        json!([{ "uri_template": "postern://counter/counter://effects/{kind}", "name": "counter__effects_of_kind" }]),
        "{templates}"
    );
    let expanded = read(json!({ "what": "resource", "uri": "postern://counter/counter://effects/pay" }));
    assert_eq!(expanded["ok"], true, "a URI expanded from a template reads through: {expanded}");
    assert_eq!(expanded["data"][0]["text"], "[]");

    let prompts = read(json!({ "what": "prompts" }));
    assert_eq!(prompts["data"], json!([{ "name": "counter__settle" }]), "{prompts}");
    let prompt = read(json!({ "what": "prompt", "name": "counter__settle", "arguments": { "account": "ACME" } }));
    assert!(prompt["data"][0]["text"].as_str().unwrap().contains("Settle the account ACME"), "{prompt}");

    // Each read is a read-only execution on record.
    let rows = gw.activity();
    let accepted: Vec<&Value> = rows[before..].iter().filter(|r| r["event"] == "accepted").collect();
    let tools: Vec<&str> = accepted.iter().map(|r| r["detail"]["tool"].as_str().unwrap()).collect();
    assert_eq!(tools, ["counter__resources/read", "counter__resources/read", "counter__prompts/get"], "{accepted:?}");
    assert_eq!(count(dir.path(), "pay"), 0);

    // A read is a kind of its own, not a tool name: a server's tool called `resources/read` is
    // that tool, called with tools/call (it was sent as a resource read, and failed).
    let added = agent.call_and_wait("add", "counter__add_tool", json!({ "name": "resources/read" }));
    assert_eq!(added["structured"]["state"], "completed", "{added}");
    super::gateway_support::eventually("the tool in tools/list", std::time::Duration::from_secs(30), || {
        let tools = agent.tools();
        tools["tools"].as_array().unwrap().iter().any(|t| t["name"] == "counter__resources/read").then_some(())
    });
    let called = agent.call_and_wait("the tool", "counter__resources/read", json!({}));
    assert!(called["text"].to_string().contains("resources/read says hello"), "{called}");
}

#[test]
fn an_upstream_tools_change_reaches_a_connected_agent_and_the_new_tool_is_callable() {
    let Upstream { gw, dir: _dir, mut agent } = start();
    agent.tools();
    // Postern's session with the upstream is on protocol 2026-07-28, where a tools change is
    // delivered through subscriptions/listen.
    let log = gw.stderr.lock().unwrap().clone();
    assert!(log.contains("protocol=2026-07-28 tools_list_changed=true"), "{log}");
    agent.send(json!({ "op": "listen" }));
    let listening = agent.expect("listening", |e| e["event"] == "listening" || e["event"] == "listen_failed");
    assert_eq!(listening["event"], "listening", "{listening}");
    let added = agent.call_and_wait("add", "counter__add_tool", json!({ "name": "fresh" }));
    assert_eq!(added["structured"]["state"], "completed", "{added}");
    agent.expect("the tools change", |e| e["event"] == "tools_changed");
    let tools = agent.tools();
    let fresh = tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == "counter__fresh").cloned();
    let fresh = fresh.unwrap_or_else(|| panic!("counter__fresh in {tools}"));
    assert!(fresh["description"].as_str().unwrap().contains("hints suggest read_only"), "{fresh}");
    let hello = agent.call_and_wait("hello", "counter__fresh", json!({}));
    assert!(hello["text"].to_string().contains("fresh says hello"), "{hello}");
}

/// A server set to start on first use stays stopped while the gateway runs, until an agent
/// lists tools; one set to start with the gateway is running before any agent comes.
#[test]
fn a_server_set_to_start_on_first_use_waits_for_an_agent() {
    let data = tempfile::tempdir().unwrap();
    let (eager_dir, lazy_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for (name, dir) in [("eager", &eager_dir), ("lazy", &lazy_dir)] {
        let add = add_counter(data.path(), dir.path(), name, &format!("{CANARY}\n"));
        assert_eq!(add.code, 0, "{}", add.stderr);
    }
    let set = postern_with(&["servers", "set", "lazy", "--start", "on-first-use"], Some(data.path()), None, &[]);
    assert_eq!(set.code, 0, "{}", set.stderr);
    let gw = Gateway::start_in(data, "");
    let states = || {
        let list = gw.postern(&["servers", "list", "--json"]);
        assert_eq!(list.code, 0, "{}", list.stderr);
        let servers: Value = serde_json::from_str(&list.stdout).unwrap();
        let state = |name: &str| {
            servers.as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()["state"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        (state("eager"), state("lazy"))
    };
    // The gateway starts its servers under one lock, in one pass: once the eager one is
    // reported running, that pass is over, and the lazy one was left alone.
    super::gateway_support::eventually("the eager server running", std::time::Duration::from_secs(60), || {
        (states().0 == "running").then_some(())
    });
    assert_eq!(states(), ("running".into(), "stopped".into()));
    let table = gw.postern(&["servers", "list"]);
    assert!(table.stdout.contains("stopped (starts on first use)"), "{}", table.stdout);

    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let tools = agent.tools();
    assert!(tools["tools"].as_array().unwrap().iter().any(|t| t["name"] == "lazy__pay"), "{tools}");
    assert_eq!(states(), ("running".into(), "running".into()));
    let paid = agent.call_and_wait("pay", "lazy__pay", json!({ "amount": 3 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    assert_eq!((count(lazy_dir.path(), "pay"), count(eager_dir.path(), "pay")), (1, 0));
}
