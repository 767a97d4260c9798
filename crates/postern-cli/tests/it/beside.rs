//! Every command of the book's "Commands at a glance" list, run while `postern serve` holds the journal —
//! as a user who keeps the gateway (or the desktop app) running all day does. Reads work on the
//! journal read-only; changes and calls go through the gateway (its control socket, its MCP
//! socket) and say the same as when run alone; only what grants authority is refused, with
//! where to do it instead.

use super::gateway_support::{Gateway, Target};
use super::support::{Run, postern_with};
use super::upstreams::{CANARY, add_counter, count};
use serde_json::{Value, json};
use std::path::Path;

const SECRET: &str = "beside-the-gateway-secret-41ac";

fn ok(run: &Run, what: &str) {
    assert_eq!(run.code, 0, "{what}: {}{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("in use by another"), "{what}: {}", run.stderr);
}

#[test]
fn every_command_works_beside_a_running_gateway() {
    let target = Target::start();
    let data = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let gw = Gateway::start_without_manifest(data, config.path());
    let env = [("XDG_CONFIG_HOME", config.path().to_str().unwrap())];
    let run = |args: &[&str], stdin: Option<&str>| postern_with(args, Some(gw.path()), stdin, &env);

    // status: the journal read beside the gateway, and the gateway's own account.
    let status = run(&["status"], None);
    ok(&status, "status");
    assert!(status.stdout.contains("gateway     running: pid "), "{}", status.stdout);
    assert!(status.stdout.contains("approver none"), "{}", status.stdout);
    let status: Value = serde_json::from_str(&run(&["status", "--json"], None).stdout).unwrap();
    assert_eq!(status["gateway"]["pid"], gw.child.id(), "{status}");

    // The vault: a credential and an SSH host added through the gateway, listed, removed.
    let host = format!("127.0.0.1:{}", target.addr.port());
    ok(&run(&["vault", "add", "bank", "--kind", "bearer", "--host", &host], Some(&format!("{SECRET}\n"))), "vault add");
    let key = work.path().join("id_ed25519");
    let keygen = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", key.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(keygen.success());
    let add_ssh = [
        "vault",
        "add-ssh",
        "box",
        "--address",
        "127.0.0.1",
        "--user",
        "me",
        "--key-file",
        key.to_str().unwrap(),
        "--host-key-policy",
        "accept-new",
    ];
    ok(&run(&add_ssh, None), "vault add-ssh");
    let listed = run(&["vault", "list"], None);
    ok(&listed, "vault list");
    assert!(listed.stdout.contains("bank") && listed.stdout.contains("me@127.0.0.1:22"), "{}", listed.stdout);
    ok(&run(&["vault", "remove", "box"], None), "vault remove");
    assert!(!run(&["vault", "list"], None).stdout.contains("me@127.0.0.1"));

    // tools, and a call through the gateway (the credential reaches the target).
    let tools = run(&["tools", "list"], None);
    ok(&tools, "tools list");
    assert!(tools.stdout.contains("http_request"), "{}", tools.stdout);
    ok(&run(&["tools", "check"], None), "tools check");
    let args = json!({ "method": "POST", "url": format!("http://{host}/pay"), "body": { "amount": 7 } }).to_string();
    let called = run(&["call", "http_request", "--args", &args, "--json"], None);
    ok(&called, "call");
    let outcome: Value = serde_json::from_str(&called.stdout).unwrap();
    assert_eq!(outcome["state"], "completed", "{outcome}");
    assert_eq!(outcome["result"]["status"], 201, "{outcome}");
    assert_eq!(target.payments(), 1);
    let execution = outcome["execution_id"].as_str().unwrap().to_owned();
    // The call belongs to the run of the process that ran it (here this test, as a terminal
    // would be): the same call again is a retry, answered from the first execution.
    let human = run(&["call", "http_request", "--args", &args], None);
    ok(&human, "call (human)");
    assert!(human.stdout.contains(&format!("execution  {execution}")), "{}", human.stdout);
    assert!(
        human.stdout.contains("(return_stored_result)") && human.stdout.contains("status     201"),
        "{}",
        human.stdout
    );
    assert_eq!(target.payments(), 1, "a repeat from the same run is never a second payment");
    let scoped = run(&["call", "http_request", "--args", &args, "--scope", "s"], None);
    assert_eq!(scoped.code, 2, "{}", scoped.stderr);
    assert!(scoped.stderr.contains("--scope names an intent scope"), "{}", scoped.stderr);
    let unknown = run(&["call", "nope"], None);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert_eq!(target.payments(), 1);

    // The journals.
    ok(&run(&["activity"], None), "activity");
    let shown = run(&["execution", "show", &execution], None);
    ok(&shown, "execution show");
    assert!(shown.stdout.contains("completed"), "{}", shown.stdout);

    // Agents.
    let token = run(&["agents", "add", "ci"], None);
    ok(&token, "agents add");
    assert!(run(&["agents", "list"], None).stdout.contains("ci"));
    ok(&run(&["agents", "revoke", "ci"], None), "agents revoke");

    // An upstream MCP server: added (started by the gateway), inspected, held to a contract,
    // set to start on first use, restarted and removed — all beside the gateway.
    let counter = tempfile::tempdir().unwrap();
    ok(&add_counter(gw.path(), counter.path(), "counter", &format!("{CANARY}\n")), "servers add");
    let servers: Value = serde_json::from_str(&run(&["servers", "list", "--json"], None).stdout).unwrap();
    assert_eq!(servers[0]["state"], "running", "{servers}");
    let server_tools = run(&["servers", "tools", "counter", "--json"], None);
    ok(&server_tools, "servers tools");
    assert!(server_tools.stdout.contains("counter__pay"), "{}", server_tools.stdout);
    ok(&run(&["servers", "contract", "counter", "pay", "--class", "idempotent"], None), "servers contract");
    let server_tools: Value =
        serde_json::from_str(&run(&["servers", "tools", "counter", "--json"], None).stdout).unwrap();
    let pay = server_tools.as_array().unwrap().iter().find(|t| t["tool"] == "pay").unwrap().clone();
    assert_eq!((pay["contract"].clone(), pay["contract_from"].clone()), (json!("idempotent"), json!("owner")));
    let paid = run(&["call", "counter__pay", "--args", r#"{"amount": 2}"#, "--json"], None);
    ok(&paid, "call an upstream tool");
    assert_eq!(count(counter.path(), "pay"), 1);
    ok(&run(&["servers", "set", "counter", "--start", "on-first-use"], None), "servers set");
    ok(&run(&["servers", "restart", "counter"], None), "servers restart");
    ok(&run(&["servers", "remove", "counter"], None), "servers remove");
    assert_eq!(serde_json::from_str::<Value>(&run(&["servers", "list", "--json"], None).stdout).unwrap(), json!([]));

    // An agent config's server moves in through the gateway, and back out with --undo.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".cursor")).unwrap();
    let canary = "canary-beside-import-77b0e1f4c2";
    let cursor = serde_json::to_vec_pretty(&json!({ "mcpServers": { "notes": {
        "command": "notes-mcp", "args": [], "env": { "NOTES_TOKEN": canary } } } }))
    .unwrap();
    std::fs::write(home.path().join(".cursor/mcp.json"), &cursor).unwrap();
    let home_env = [("HOME", home.path().to_str().unwrap()), env[0]];
    let import = |extra: &[&str]| {
        let args: Vec<&str> = ["servers", "import", "--from", "cursor"].iter().chain(extra).copied().collect();
        postern_with(&args, Some(gw.path()), None, &home_env)
    };
    ok(&import(&["--yes"]), "servers import");
    assert!(!String::from_utf8_lossy(&std::fs::read(home.path().join(".cursor/mcp.json")).unwrap()).contains(canary));
    let servers: Value = serde_json::from_str(&run(&["servers", "list", "--json"], None).stdout).unwrap();
    assert_eq!(servers[0]["name"], "notes", "{servers}");
    assert_eq!(servers[0]["secret_env"], json!(["NOTES_TOKEN"]), "{servers}");
    ok(&postern_with(&["servers", "import", "--undo"], Some(gw.path()), None, &home_env), "servers import --undo");
    assert_eq!(std::fs::read(home.path().join(".cursor/mcp.json")).unwrap(), cursor, "the original bytes");
    assert_eq!(serde_json::from_str::<Value>(&run(&["servers", "list", "--json"], None).stdout).unwrap(), json!([]));
    assert_eq!(super::support::file_containing(gw.path(), canary), None);

    // The audit trail: a checkpoint signed by the gateway, its key, and an offline verification.
    let checkpoint = work.path().join("head.json");
    ok(&run(&["audit", "checkpoint", "--out", checkpoint.to_str().unwrap()], None), "audit checkpoint");
    let pubkey = run(&["audit", "pubkey"], None);
    ok(&pubkey, "audit pubkey");
    let pubfile = work.path().join("journal.pub");
    std::fs::write(&pubfile, pubkey.stdout.trim()).unwrap();
    let pubarg = format!("@{}", pubfile.display());
    let verify = run(&["audit", "verify", "--checkpoint", checkpoint.to_str().unwrap(), "--pubkey", &pubarg], None);
    ok(&verify, "audit verify");
    // A witness's request: the gateway signs a new checkpoint, the proof comes from the journal.
    let proved = run(&["audit", "prove", "--from", checkpoint.to_str().unwrap(), "--pubkey", &pubarg], None);
    ok(&proved, "audit prove --from");
    let (old_size, proof, new) = postern_testkit::tlog::read_witness_request(&proved.stdout).unwrap();
    let old = postern_testkit::tlog::parse_note(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    let (_, size, old_root) = postern_testkit::tlog::read_checkpoint(&old).unwrap();
    let (_, new_size, new_root) = postern_testkit::tlog::read_checkpoint(&new).unwrap();
    assert_eq!(old_size, size);
    assert!(postern_testkit::tlog::consistency_holds(size as usize, new_size as usize, &old_root, &new_root, &proof));

    // Revoking the run (this test's, as a terminal's would be) denies its calls from now on.
    let sessions: Value = serde_json::from_str(&run(&["sessions", "--json"], None).stdout).unwrap();
    let session = sessions.as_array().unwrap().last().unwrap()["id"].as_str().unwrap().to_owned();
    ok(&run(&["sessions", "revoke", &session], None), "sessions revoke");
    let other = json!({ "method": "POST", "url": format!("http://{host}/pay"), "body": { "amount": 8 } }).to_string();
    let denied = run(&["call", "http_request", "--args", &other, "--json"], None);
    assert_eq!(serde_json::from_str::<Value>(&denied.stdout).unwrap()["state"], "denied", "{}", denied.stdout);
    assert_eq!(target.payments(), 1);

    // The one command that needs the journal to itself says so.
    let rederive = run(&["audit", "rederive"], None);
    assert_eq!(rederive.code, 1, "{}", rederive.stderr);
    assert!(rederive.stderr.contains("stop the running gateway"), "{}", rederive.stderr);

    // Locking works from anywhere; unlocking only in the approver, and the refusal says where.
    ok(&run(&["vault", "lock"], None), "vault lock");
    let unlock = run(&["vault", "unlock"], None);
    assert_eq!(unlock.code, 1, "{}", unlock.stderr);
    assert!(unlock.stderr.contains("this gateway has no approver: stop it"), "{}", unlock.stderr);

    // Every change that came over the control socket is on record with the process that asked.
    let applied: Vec<Value> =
        journal_rows(gw.path()).into_iter().filter(|r| r["event"] == "control_request_applied").collect();
    let ops: Vec<&str> = applied.iter().map(|r| r["detail"]["op"].as_str().unwrap()).collect();
    for op in ["vault.add", "vault.add_ssh", "vault.remove", "servers.add", "servers.contract", "audit.checkpoint"] {
        assert!(ops.contains(&op), "{op} in {ops:?}");
    }
    assert!(applied.iter().all(|r| r["detail"]["peer"]["pid"].is_u64()), "{applied:?}");
    assert_eq!(super::support::file_containing(gw.path(), SECRET), None, "the secret went to the keychain only");
    let log = gw.stderr.lock().unwrap().clone();
    assert!(!log.contains(SECRET) && !log.contains(CANARY), "no secret carried over the socket is logged");
}

/// The journal's vault rows, read as `postern audit` would (read-only, beside the gateway).
fn journal_rows(data: &Path) -> Vec<Value> {
    let db = data.join("postern.db");
    let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut stmt = conn.prepare("SELECT body FROM journal WHERE stream = 'vault' ORDER BY seq").unwrap();
    let rows: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    rows.iter()
        .map(|b| {
            let body: Value = serde_json::from_str(b).unwrap();
            json!({ "event": body["head"]["event"], "detail": body["payload"] })
        })
        .collect()
}
