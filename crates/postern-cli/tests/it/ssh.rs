//! `postern vault add-ssh`, `postern call ssh_exec` and `postern ssh gc` against a real OpenSSH
//! server on loopback (the harness is shared with the gateway's tests).

use super::support::{postern, postern_with};
use postern_testkit::sshd::Sshd;
use serde_json::Value;

struct Setup {
    sshd: Sshd,
    data: tempfile::TempDir,
    markers: tempfile::TempDir,
    tools: std::path::PathBuf,
}

fn setup() -> Setup {
    let sshd = Sshd::start();
    let data = tempfile::tempdir().unwrap();
    let tools = data.path().join("tools.toml");
    std::fs::write(&tools, "").unwrap();
    Setup { sshd, data, markers: tempfile::tempdir().unwrap(), tools }
}

impl Setup {
    fn add(&self, name: &str, key: &str, host_key_file: &std::path::Path, stdin: Option<&str>) -> super::support::Run {
        let port = self.sshd.port.to_string();
        let key_file = self.sshd.dir.path().join(key);
        let mut args = vec![
            "vault",
            "add-ssh",
            name,
            "--address",
            "127.0.0.1",
            "--port",
            &port,
            "--user",
            &self.sshd.account,
            "--key-file",
            key_file.to_str().unwrap(),
            "--host-key-file",
            host_key_file.to_str().unwrap(),
            "--marker-dir",
            self.markers.path().to_str().unwrap(),
        ];
        if stdin.is_some() {
            args.push("--passphrase");
        }
        postern_with(&args, Some(self.data.path()), stdin, &[])
    }

    fn exec(&self, host: &str, command: &str) -> (i32, Value) {
        let arguments = serde_json::json!({ "host": host, "command": command }).to_string();
        let tools = self.tools.to_str().unwrap();
        let run =
            postern(&["call", "ssh_exec", "--args", &arguments, "--tools", tools, "--json"], Some(self.data.path()));
        (run.code, serde_json::from_str(&run.stdout).unwrap_or_else(|_| panic!("{}{}", run.stdout, run.stderr)))
    }
}

#[test]
fn add_ssh_pins_the_host_key_imports_an_encrypted_key_and_runs_a_command() {
    let s = setup();
    let host_pub = s.sshd.dir.path().join("host_ed25519.pub");
    // A wrong passphrase is refused when the host is added, and nothing is stored.
    let wrong = s.add("box", "id_locked", &host_pub, Some("not the passphrase\n"));
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("cannot be used"), "{}", wrong.stderr);
    assert!(!wrong.stderr.contains("not the passphrase"));

    let added = s.add("box", "id_locked", &host_pub, Some("correct horse battery\n"));
    assert_eq!(added.code, 0, "{}", added.stderr);
    let keygen = std::process::Command::new("ssh-keygen").arg("-lf").arg(&host_pub).output().unwrap();
    let fingerprint = String::from_utf8(keygen.stdout).unwrap().split_whitespace().nth(1).unwrap().to_owned();
    assert!(added.stderr.contains(&fingerprint), "the pinned key is shown as {fingerprint}: {}", added.stderr);
    let list = postern(&["vault", "list"], Some(s.data.path()));
    assert!(list.stdout.contains(&fingerprint) && list.stdout.contains("strict"), "{}", list.stdout);

    let (code, out) = s.exec("box", "echo hi; exit 0");
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["result"]["stdout"], "hi\n");
    assert_eq!(out["state"], "completed");
    // The encrypted key and its passphrase are in the keychain only.
    let key_body = std::fs::read_to_string(s.sshd.dir.path().join("id_locked")).unwrap();
    let body_line = key_body.lines().nth(1).unwrap();
    for needle in [body_line, "correct horse battery"] {
        assert!(super::support::file_containing(s.data.path(), needle).is_none(), "{needle} on disk");
    }
}

#[test]
fn a_host_key_mismatch_is_refused_with_both_fingerprints_and_gc_removes_old_markers() {
    let s = setup();
    let other = tempfile::tempdir().unwrap();
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(other.path().join("k"))
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(s.add("wrong", "id_ed25519", &other.path().join("k.pub"), None).code, 0);
    let (code, out) = s.exec("wrong", "touch should-not-exist");
    assert_eq!(code, 1);
    assert_eq!(out["state"], "failed_before_dispatch");
    assert!(out["detail"]["reason"].as_str().unwrap().starts_with("HOST KEY MISMATCH"), "{out}");

    assert_eq!(s.add("box", "id_ed25519", &s.sshd.dir.path().join("host_ed25519.pub"), None).code, 0);
    let (_, first) = s.exec("box", "true");
    let (_, second) = s.exec("box", "true");
    let old = s.markers.path().join(first["execution_id"].as_str().unwrap());
    assert!(std::process::Command::new("touch").args(["-d", "40 days ago"]).arg(&old).status().unwrap().success());
    let gc = postern(&["ssh", "gc", "box", "--older-than-days", "30"], Some(s.data.path()));
    assert_eq!(gc.code, 0, "{}", gc.stderr);
    assert!(gc.stderr.contains("removed 1 marker directory"), "{}", gc.stderr);
    assert!(!old.exists());
    assert!(s.markers.path().join(second["execution_id"].as_str().unwrap()).exists(), "a recent marker stays");
}

/// End to end with a real MCP client: a marker-protected SSH command is running when the gateway
/// process is killed; after a restart the same agent process reconnects and repeats the call →
/// Postern reads the marker on the host and answers with the command's exit status; the command
/// ran once.
#[test]
fn a_gateway_crash_while_an_ssh_command_runs_is_recovered_through_the_marker() {
    use super::gateway_support::{Agent, Gateway, Sdk, eventually};
    let s = setup();
    assert_eq!(s.add("box", "id_ed25519", &s.sshd.dir.path().join("host_ed25519.pub"), None).code, 0);
    let manifest = "[[tool]]\nname = \"append\"\nssh = { host = \"box\", command = \"echo {line} >> {file}; sleep 2\" }\n\
                    input_schema = { type = \"object\", required = [\"line\", \"file\"], properties = { line = { type = \"string\" }, file = { type = \"string\" } } }\n\
                    contract = { class = \"ssh_marker\" }\n";
    let key_line =
        std::fs::read_to_string(s.sshd.dir.path().join("id_ed25519")).unwrap().lines().nth(1).unwrap().to_owned();
    let Setup { sshd: _sshd, data, markers, .. } = s;
    let ledger = markers.path().join("ledger");
    let args = serde_json::json!({ "line": "deployed", "file": ledger.to_str().unwrap() });
    let gw = Gateway::start_in(data, manifest);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    agent.call("first", "append", args.clone());
    let lines = || std::fs::read_to_string(&ledger).map_or(0, |t| t.lines().count());
    eventually("the command to run on the host", std::time::Duration::from_secs(30), || (lines() == 1).then_some(()));
    let gw = gw.crash_and_restart(manifest);
    assert_eq!(agent.result("first")["ok"], false, "the first call's connection died with the gateway");
    let id = gw.executions_of("append").pop().unwrap();
    eventually("the command to finish on the host", std::time::Duration::from_secs(30), || {
        markers.path().join(&id).join("finished").exists().then_some(())
    });

    agent.connect(gw.bridge_command());
    let retry = agent.call_and_wait("retry", "append", args);
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["state"], "completed", "{retry}");
    assert_eq!(retry["structured"]["result"]["exit_status"], 0, "{retry}");
    assert_eq!(retry["structured"]["result"]["from_marker"], true, "{retry}");
    let text = retry["text"][0].as_str().unwrap();
    assert!(text.contains("exit status 0") && text.contains("marker"), "{text}");
    assert_eq!(lines(), 1, "ran exactly once");
    let events = gw.events_of(&id);
    assert!(events.contains(&"outcome_unknown".to_owned()) && events.contains(&"completed".to_owned()), "{events:?}");
    // The private key is in no log line and no file of the data directory.
    assert!(!gw.stderr.lock().unwrap().contains(&key_line));
    assert!(super::support::file_containing(gw.path(), &key_line).is_none());
}

/// `ssh gc` removes a marker only when the journal shows its execution settled: the marker of an
/// execution still uncertain (left dispatched, now outcome_unknown) is kept however old it is,
/// and so is one this journal does not know. (Before: every marker older than the threshold went,
/// and a recovery of the uncertain command would then read "absent" and run it again.)
#[test]
fn gc_keeps_the_markers_of_unsettled_executions_whatever_their_age() {
    let journal = super::support::journal(1);
    let sshd = Sshd::start();
    let markers = tempfile::tempdir().unwrap();
    let s = Setup { sshd, data: journal.dir, markers, tools: std::path::PathBuf::new() };
    assert_eq!(s.add("box", "id_ed25519", &s.sshd.dir.path().join("host_ed25519.pub"), None).code, 0);
    let settled = super::support::exec(1).to_string();
    let uncertain = super::support::exec(999).to_string();
    let unknown = "act_01M8RZZZZZZZZZZZZZZZZZZZZZ".to_owned();
    for id in [&settled, &uncertain, &unknown] {
        let dir = s.markers.path().join(id);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("started"), "1 1\n").unwrap();
        assert!(std::process::Command::new("touch").args(["-d", "40 days ago"]).arg(&dir).status().unwrap().success());
    }
    let gc = postern(&["ssh", "gc", "box", "--older-than-days", "30"], Some(s.data.path()));
    assert_eq!(gc.code, 0, "{}", gc.stderr);
    assert!(gc.stderr.contains("removed 1 marker directory"), "{}", gc.stderr);
    assert!(
        gc.stderr.contains("kept 1 of an execution not settled yet")
            && gc.stderr.contains("1 of an execution this journal does not know"),
        "{}",
        gc.stderr
    );
    assert!(!s.markers.path().join(&settled).exists(), "the settled execution's marker is removed");
    assert!(s.markers.path().join(&uncertain).exists(), "the uncertain execution's marker is kept");
    assert!(s.markers.path().join(&unknown).exists());
}
