//! The SSH channel against a real OpenSSH server on loopback (`postern_testkit::sshd`): exit status and
//! output, the cap, the timeout, host-key policies, and the marker protocol when the connection
//! is cut after the remote command started.

use crate::support::{call, open_rig};
use postern_core::{ExecutionState, Timestamp};
use postern_engine::{Engine, LockOnlyApprover, Manifest};
use postern_testkit::sshd::Sshd;
use postern_vault::{HostKeyPolicy, Sensitive, SshHost};
use serde_json::json;
use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::net::{TcpListener, TcpStream};

fn manifest() -> Manifest {
    let text = r#"
[[tool]]
name = "append_line"
ssh = { host = "box", command = "echo {line} >> {file}; sleep {pause}" }
timeout = "20s"
input_schema = { type = "object", required = ["line", "file"], properties = { line = { type = "string" }, file = { type = "string" }, pause = { type = "integer" } } }
contract = { class = "ssh_marker", defaults = { pause = 0 } }

[[tool]]
name = "append_line_once"
ssh = { host = "box", command = "echo {line} >> {file}; sleep {pause}" }
timeout = "20s"
input_schema = { type = "object", required = ["line", "file"], properties = { line = { type = "string" }, file = { type = "string" }, pause = { type = "integer" } } }
contract = { class = "irreversible", defaults = { pause = 0 } }

[[tool]]
name = "echo_words"
ssh = { host = "box", command = "printf '%s\\0' {a} {b}" }
input_schema = { type = "object", required = ["a", "b"], properties = { a = { type = "string" }, b = { type = "string" } } }
contract = { class = "ssh_marker" }

[[tool]]
name = "check_token"
ssh = { host = "box", command = "test -n {token} && echo ok" }
input_schema = { type = "object", required = ["token"], properties = { token = { type = "string" } } }
contract = { class = "ssh_marker", secret_fields = ["token"] }
"#;
    Manifest::parse(text, Path::new("ssh-tools.toml")).unwrap()
}

struct SshRig {
    rig: crate::support::Rig,
    engine: Arc<Engine>,
    markers: tempfile::TempDir,
}

fn ssh_rig() -> SshRig {
    let rig = open_rig(tempfile::tempdir().unwrap(), manifest());
    let engine = ssh_engine(&rig);
    SshRig { rig, engine, markers: tempfile::tempdir().unwrap() }
}

/// An engine serving the SSH manifest on `rig`'s journal and vault.
fn ssh_engine(rig: &crate::support::Rig) -> Arc<Engine> {
    rig.engine_for(manifest(), Arc::new(LockOnlyApprover))
}

impl SshRig {
    fn add_host(
        &self,
        name: &str,
        sshd: &Sshd,
        addr: SocketAddr,
        key: &str,
        policy: HostKeyPolicy,
        pin: Option<String>,
    ) {
        let key = sshd.key(key);
        let fingerprint = pin.as_deref().map(|line| postern_engine::channel::ssh::host_key(line).unwrap().1);
        let host = SshHost {
            name: name.into(),
            address: addr.ip().to_string(),
            port: addr.port(),
            account: sshd.account.clone(),
            policy,
            host_key: pin,
            host_key_fingerprint: fingerprint,
            marker_root: self.markers.path().to_str().unwrap().to_owned(),
            approve_every_use: false,
        };
        let passphrase = key.passphrase.map(Sensitive::new);
        self.rig
            .vault
            .add_ssh_host(&host, &Sensitive::new(key.private), passphrase.as_ref(), Timestamp::from_millis(4))
            .unwrap();
    }

    fn marker_dir(&self, id: postern_core::ExecutionId) -> std::path::PathBuf {
        self.markers.path().join(id.to_string())
    }
}

fn exec(host: &str, command: &str) -> postern_engine::Call {
    call("ssh_exec", json!({ "host": host, "command": command }), 0, 1)
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

async fn eventually(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP relay to sshd that the test can cut (every open connection at once) or make refuse
/// new connections.
struct CutProxy {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<u64>,
    refuse: Arc<AtomicBool>,
    /// TCP connections relayed to sshd so far.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl CutProxy {
    async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let refuse = Arc::new(AtomicBool::new(false));
        let refusing = Arc::clone(&refuse);
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                if refusing.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let mut cuts = cuts.clone();
                cuts.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        CutProxy { addr, cut, refuse, accepted }
    }

    fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

/// Commands to one host share an authenticated connection (one TCP connection, one login at the
/// host for three commands); a lock and unlock, or a connection that died while kept, makes the
/// next command connect (and check the host key) again — and every command ran exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reuse_one_authenticated_connection_until_something_changes() {
    let sshd = Sshd::start();
    let proxy = CutProxy::start(sshd.addr()).await;
    let r = ssh_rig();
    r.add_host("box", &sshd, proxy.addr, "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let file = r.markers.path().join("ledger");
    let append = |line: &str| call("append_line", json!({ "line": line, "file": file.to_str().unwrap() }), 0, 1);
    let connections = || proxy.accepted.load(Ordering::SeqCst);
    for line in ["a", "b", "c"] {
        assert_eq!(r.engine.call(append(line)).await.unwrap().state, ExecutionState::Completed);
    }
    assert_eq!((lines(&file), connections()), (3, 1), "three commands, one connection");

    assert_eq!(r.engine.kept_ssh_connections(), 1);
    // A lock through the store alone (as the control socket does): the sweep drops the kept
    // connection at once, not at its next use.
    r.rig.store.set_locked(true, json!({ "by": "control" }), Timestamp::from_millis(10)).unwrap();
    r.engine.sweep();
    assert_eq!(r.engine.kept_ssh_connections(), 0, "nothing kept across a lock");
    r.rig.vault.unlock("test", Timestamp::from_millis(11)).unwrap();
    assert_eq!(r.engine.call(append("d")).await.unwrap().state, ExecutionState::Completed);
    assert_eq!((lines(&file), connections()), (4, 2), "a lock ends the kept connection");

    proxy.cut();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.engine.call(append("e")).await.unwrap().state, ExecutionState::Completed);
    assert_eq!((lines(&file), connections()), (5, 3), "a dead kept connection: sent once, on a new one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_and_output_with_every_key_type() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    for key in ["id_ed25519", "id_ecdsa", "id_rsa", "id_locked"] {
        let name = format!("box-{key}");
        r.add_host(&name, &sshd, sshd.addr(), key, HostKeyPolicy::Strict, Some(sshd.host_key()));
        let out = r.engine.call(exec(&name, "echo out; echo err >&2; exit 3")).await.unwrap();
        assert_eq!(out.state, ExecutionState::Completed, "{key}: {:?}", out.detail);
        let ssh = out.ssh().cloned().unwrap();
        assert_eq!((ssh.exit_status, ssh.stdout.as_str(), ssh.stderr.as_str()), (Some(3), "out\n", "err\n"), "{key}");
        assert!(!ssh.truncated);
        // The marker on the host recorded the same exit status.
        let finished = std::fs::read_to_string(r.marker_dir(out.execution_id).join("finished")).unwrap();
        assert!(finished.starts_with("3 "), "{finished}");
    }
    // The canonical record names the pinned key, never the address.
    let hosts = r.rig.vault.ssh_hosts().unwrap();
    let pinned = hosts[0].host_key_fingerprint.clone().unwrap();
    let keygen = std::process::Command::new("ssh-keygen").arg("-lf").arg(sshd.host_key_file()).output().unwrap();
    assert!(String::from_utf8_lossy(&keygen.stdout).contains(&pinned), "ssh-keygen agrees on {pinned}");
    let accepted =
        &r.rig.store.view().activity(&postern_store::ActivityFilter { limit: 1000, ..Default::default() }).unwrap();
    let record = accepted.iter().find(|e| e.row.event == "accepted").unwrap();
    assert_eq!(record.row.detail["record"]["target"]["host_key"], pinned.as_str());
    assert_eq!(record.row.detail["channel"], "ssh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_result_limit_is_not_kept_and_the_exit_status_is() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let out = r.engine.call(exec("box", "head -c 2000000 /dev/zero | tr '\\0' x; echo tail >&2")).await.unwrap();
    let ssh = out.ssh().cloned().unwrap();
    let limit = postern_engine::channel::http::DEFAULT_MAX_RESULT_BYTES as u64;
    assert_eq!((ssh.result_too_large, ssh.stdout.as_str(), ssh.stderr.as_str()), (Some(limit), "", ""), "{ssh:?}");
    assert_eq!(ssh.exit_status, Some(0), "what is known of the command is kept");
    assert_eq!(out.state, postern_core::ExecutionState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_terminates_the_remote_command_and_says_so() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let witness = r.markers.path().join("late");
    let command = format!("sleep 5; echo late > {}", witness.display());
    let mut c = exec("box", &command);
    c.arguments["timeout_s"] = json!(1);
    let out = r.engine.call(c).await.unwrap();
    assert_eq!(out.state, ExecutionState::Completed, "{:?}", out.detail);
    let ssh = out.ssh().cloned().unwrap();
    assert!(ssh.timed_out.as_deref().unwrap().contains("TERM"), "{ssh:?}");
    assert_eq!(ssh.exit_status, Some(143), "the command ended by TERM (128+15): {ssh:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!witness.exists(), "the remote command was killed, not just the local channel");
}

/// A command that ignores TERM outlives the timeout and its grace: no exit status ever arrives,
/// so nothing was observed — the execution is `outcome_unknown` (the marker decides later),
/// never `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_without_an_exit_status_is_an_unknown_outcome_not_completed() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let mut c = exec("box", "trap '' TERM; sleep 6");
    c.arguments["timeout_s"] = json!(1);
    let out = r.engine.call(c).await.unwrap();
    assert_eq!(out.state, ExecutionState::OutcomeUnknown, "{:?}", out.detail);
    assert_eq!(out.why().reason.as_deref(), Some("ssh_timed_out"), "{:?}", out.detail);
    assert!(out.ssh().is_none(), "no result is claimed for an unobserved outcome");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_host_key_is_refused_naming_both_fingerprints() {
    let sshd = Sshd::start();
    let other = tempfile::tempdir().unwrap();
    let stranger = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(other.path().join("k"))
        .status()
        .unwrap();
    assert!(stranger.success());
    let wrong = std::fs::read_to_string(other.path().join("k.pub")).unwrap();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(wrong.clone()));
    let witness = r.markers.path().join("ran");
    let out = r.engine.call(exec("box", &format!("touch {}", witness.display()))).await.unwrap();
    assert_eq!(out.state, ExecutionState::FailedBeforeDispatch);
    assert_eq!(out.why().code.as_deref(), Some("host_key_mismatch"));
    let reason = out.why().reason.clone().unwrap();
    let pinned = postern_engine::channel::ssh::host_key(&wrong).unwrap().1;
    let presented = postern_engine::channel::ssh::host_key(&sshd.host_key()).unwrap().1;
    assert!(reason.contains(&pinned) && reason.contains(&presented), "{reason}");
    assert!(!witness.exists() && !r.marker_dir(out.execution_id).exists(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_new_pins_the_first_key_only_after_authentication() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    // A key the server does not accept: authentication fails, nothing is pinned.
    let stranger = tempfile::tempdir().unwrap();
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(stranger.path().join("k"))
            .status()
            .unwrap()
            .success()
    );
    let host = |name: &str| SshHost {
        name: name.into(),
        address: "127.0.0.1".into(),
        port: sshd.port,
        account: sshd.account.clone(),
        policy: HostKeyPolicy::AcceptNew,
        host_key: None,
        host_key_fingerprint: None,
        marker_root: r.markers.path().to_str().unwrap().to_owned(),
        approve_every_use: false,
    };
    let refused_key = std::fs::read_to_string(stranger.path().join("k")).unwrap();
    r.rig.vault.add_ssh_host(&host("refused"), &Sensitive::new(refused_key), None, Timestamp::from_millis(4)).unwrap();
    let err = r.engine.call(exec("refused", "true")).await.unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&err), "ssh_auth_failed", "{err}");
    assert_eq!(r.rig.vault.ssh_host("refused").unwrap().host_key, None, "not pinned after a failed login");

    // Through a relay, so the re-installation below can also end the connections of the old
    // installation (its sessions would otherwise outlive the killed daemon here).
    let proxy = CutProxy::start(sshd.addr()).await;
    r.add_host("box", &sshd, proxy.addr, "id_ed25519", HostKeyPolicy::AcceptNew, None);
    let out = r.engine.call(exec("box", "echo hi")).await.unwrap();
    assert_eq!(out.ssh().cloned().unwrap().stdout, "hi\n");
    let pinned = r.rig.vault.ssh_host("box").unwrap();
    assert_eq!(pinned.host_key_fingerprint, Some(postern_engine::channel::ssh::host_key(&sshd.host_key()).unwrap().1));
    // The host is re-installed (a new host key on the same address): refused from now on.
    let port = sshd.port;
    drop(sshd);
    let reinstalled = Sshd::start_on(port);
    proxy.cut();
    let out = r.engine.call(exec("box", "echo again")).await.unwrap();
    assert_eq!(
        (out.state, out.why().code.as_deref()),
        (ExecutionState::FailedBeforeDispatch, Some("host_key_mismatch"))
    );
    drop(reinstalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_unreachable_hosts_are_specific_errors() {
    let r = ssh_rig();
    let err = r.engine.call(exec("nope", "true")).await.unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&err), "unknown_ssh_host");
    assert!(err.to_string().contains("postern vault add-ssh"), "{err}");
    // A vault host nobody listens on (strict: pinned key, so the call becomes an execution).
    let sshd = Sshd::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    r.add_host("down", &sshd, closed, "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let out = r.engine.call(exec("down", "true")).await.unwrap();
    assert_eq!(out.state, ExecutionState::FailedBeforeDispatch);
    assert_eq!(out.why().code.as_deref(), Some("ssh_unreachable"));
}

/// Runs `tool` (append a line, then pause 2 s) through a cuttable proxy and cuts the TCP
/// connection once the line is in the file (the command is running on the host). Returns the
/// rig, the proxy (keep it: a dropped proxy cuts every later connection), the file, the
/// arguments and the first call's outcome.
async fn cut_while_running(
    sshd: &Sshd,
    tool: &'static str,
) -> (SshRig, CutProxy, std::path::PathBuf, serde_json::Value, postern_engine::CallOutcome) {
    let proxy = CutProxy::start(sshd.addr()).await;
    let r = ssh_rig();
    r.add_host("box", sshd, proxy.addr, "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let file = r.markers.path().join("ledger");
    let args = json!({ "line": "paid", "file": file.to_str().unwrap(), "pause": 2 });
    let running = {
        let engine = Arc::clone(&r.engine);
        let args = args.clone();
        tokio::spawn(async move { engine.call(call(tool, args, 0, 1)).await.unwrap() })
    };
    eventually("the command to start on the host", Duration::from_secs(10), || lines(&file) == 1).await;
    proxy.cut();
    let first = running.await.unwrap();
    (r, proxy, file, args, first)
}

/// The decisive scenario: a marker-protected command that appends a line is dispatched, the TCP
/// connection is cut after the command started, the agent retries: Postern reads the marker and
/// returns the real outcome; the file has exactly one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_after_the_command_started_is_recovered_through_the_marker() {
    let sshd = Sshd::start();
    let (r, _proxy, file, args, first) = cut_while_running(&sshd, "append_line").await;
    assert_eq!(first.state, ExecutionState::OutcomeUnknown, "{:?}", first.detail);

    // Retried at once: the marker says it is still running; nothing is run again.
    let early = r.engine.call(call("append_line", args.clone(), 0, 2)).await.unwrap();
    assert_eq!((early.execution_id, early.state), (first.execution_id, ExecutionState::OutcomeUnknown));
    assert!(early.why().reason.clone().unwrap().contains("still running"), "{:?}", early.detail);

    let finished = r.marker_dir(first.execution_id).join("finished");
    eventually("the command to finish", Duration::from_secs(10), || finished.exists()).await;
    let retry = r.engine.call(call("append_line", args, 0, 3)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    let ssh = retry.ssh().cloned().unwrap();
    assert_eq!((ssh.exit_status, ssh.from_marker), (Some(0), true));
    assert_eq!(lines(&file), 1, "the line was appended exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_fails_before_the_exec_request_runs_the_retry_once() {
    let sshd = Sshd::start();
    let proxy = CutProxy::start(sshd.addr()).await;
    let r = ssh_rig();
    r.add_host("box", &sshd, proxy.addr, "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let file = r.markers.path().join("ledger");
    let args = json!({ "line": "paid", "file": file.to_str().unwrap() });
    proxy.refuse.store(true, Ordering::SeqCst);
    let first = r.engine.call(call("append_line", args.clone(), 0, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::FailedBeforeDispatch, "{:?}", first.detail);
    assert_eq!(lines(&file), 0);
    proxy.refuse.store(false, Ordering::SeqCst);
    let retry = r.engine.call(call("append_line", args, 0, 2)).await.unwrap();
    assert_eq!(retry.state, ExecutionState::Completed, "{:?}", retry.detail);
    assert_eq!(lines(&file), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_irreversible_command_cut_after_dispatch_needs_review_and_ran_at_most_once() {
    let sshd = Sshd::start();
    let (r, _proxy, file, args, first) = cut_while_running(&sshd, "append_line_once").await;
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = r.engine.call(call("append_line_once", args, 0, 2)).await.unwrap();
    assert_eq!(retry.state, ExecutionState::NeedsReview);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(lines(&file), 1, "ran once, never twice");
}

/// The gateway dies while a marker-protected command runs; after a restart the retry is
/// answered from the marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_dispatched_recovers_through_the_marker() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let file = r.markers.path().join("ledger");
    let args = json!({ "line": "deployed", "file": file.to_str().unwrap(), "pause": 2 });
    let running = {
        let engine = Arc::clone(&r.engine);
        let args = args.clone();
        tokio::spawn(async move { engine.call(call("append_line", args, 0, 1)).await })
    };
    eventually("the command to start on the host", Duration::from_secs(10), || lines(&file) == 1).await;
    running.abort();
    let _ = running.await;
    let SshRig { rig, engine, markers } = r;
    drop(engine);
    let dir = rig.dir;
    drop(rig.engine);
    drop(rig.vault);
    drop(rig.store);

    let restarted = open_rig(dir, manifest());
    let engine = ssh_engine(&restarted);
    let id = restarted
        .store
        .view()
        .activity(&postern_store::ActivityFilter { limit: 1000, ..Default::default() })
        .unwrap()
        .iter()
        .find_map(|e| e.row.execution_id)
        .unwrap();
    assert_eq!(
        restarted.store.view().execution(id).unwrap().unwrap().state,
        postern_core::ExecutionState::OutcomeUnknown
    );
    eventually("the command to finish", Duration::from_secs(10), || {
        markers.path().join(id.to_string()).join("finished").exists()
    })
    .await;
    let retry = engine.call(call("append_line", args, 0, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (id, ExecutionState::Completed));
    assert_eq!(lines(&file), 1);
}

/// The private key and its passphrase appear nowhere but the keychain: not in the database, not
/// in errors, not in Debug output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_private_key_and_passphrase_never_leak() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_locked", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let out = r.engine.call(exec("box", "echo fine")).await.unwrap();
    assert_eq!(out.state, ExecutionState::Completed);
    let key = sshd.key("id_locked");
    let body_line = key.private.lines().nth(1).unwrap().to_owned();
    let passphrase = key.passphrase.unwrap();
    for canary in [&body_line, &passphrase] {
        assert!(crate::support::file_containing(r.rig.dir.path(), canary).is_none(), "{canary} on disk");
        assert!(!format!("{out:?}").contains(canary.as_str()));
    }
    // A wrong passphrase is an error that names the problem, not the secret.
    let wrong = postern_engine::channel::ssh::decode_key(&key.private, Some("not it")).unwrap_err();
    assert!(!wrong.contains(&passphrase) && !wrong.contains(&body_line), "{wrong}");
    let host = format!("{:?}", r.rig.vault.ssh_host("box").unwrap());
    assert!(!host.contains(&body_line));
}

/// An SSH host marked "approve every use" is on the ladder's per-use rung: with no reviewer the
/// command is denied and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approve_every_use_host_needs_a_reviewer_for_each_command() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    let key = sshd.key("id_ed25519");
    let (_, fingerprint) = postern_engine::channel::ssh::host_key(&sshd.host_key()).unwrap();
    let host = SshHost {
        name: "guarded".into(),
        address: "127.0.0.1".into(),
        port: sshd.port,
        account: sshd.account.clone(),
        policy: HostKeyPolicy::Strict,
        host_key: Some(sshd.host_key()),
        host_key_fingerprint: Some(fingerprint),
        marker_root: r.markers.path().to_str().unwrap().to_owned(),
        approve_every_use: true,
    };
    r.rig.vault.add_ssh_host(&host, &Sensitive::new(key.private), None, Timestamp::from_millis(4)).unwrap();
    let witness = r.markers.path().join("ran");
    let out = r.engine.call(exec("guarded", &format!("touch {}", witness.display()))).await.unwrap();
    assert_eq!(out.state, ExecutionState::Denied);
    assert_eq!(out.why().rung.as_deref(), Some("approve_every_use"));
    assert!(!witness.exists());
}

/// A manifest tool's arguments reach the host as exactly the words they are: an argument that
/// names another placeholder is not expanded again, and quotes, `$( )`, backquotes, newlines
/// and globs stay text. (Before templates were rendered in one pass, `a = "{b}"` put `b`
/// between two empty quotes, unquoted, and its `$(touch …)` ran on the host.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_reaches_the_host_as_exactly_one_word() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let witness = tempfile::tempdir().unwrap();
    let pwned = witness.path().join("pwned");
    let hostile = [
        ("{b}".to_owned(), format!("$(touch {})", pwned.display())),
        ("x' ; touch {b}; '".to_owned(), format!("`touch {}`", pwned.display())),
        ("\"$(id)\" \n; * ~ $HOME".to_owned(), "{a}{a}' \\ ${IFS}".to_owned()),
    ];
    for (n, (a, b)) in hostile.iter().enumerate() {
        let out = r.engine.call(call("echo_words", json!({ "a": a, "b": b }), 0, n as u64)).await.unwrap();
        assert_eq!(out.state, ExecutionState::Completed, "{:?}", out.detail);
        let ssh = out.ssh().cloned().unwrap();
        let words: Vec<&str> = ssh.stdout.split('\0').filter(|w| !w.is_empty()).collect();
        assert_eq!(words, [a.as_str(), b.as_str()], "{a:?} {b:?}");
    }
    assert!(!pwned.exists(), "an argument ran as code on the host");
}

/// A secret argument in an SSH command runs on the host but is written nowhere by Postern: the
/// record and the journal show `SECRET(token:digest)`, and no file of the data directory holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_argument_in_an_ssh_command_is_journaled_nowhere() {
    const TOKEN: &str = "CANARY-ssh-token-7d21'quoted";
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::Strict, Some(sshd.host_key()));
    let out = r.engine.call(call("check_token", json!({ "token": TOKEN }), 0, 1)).await.unwrap();
    assert_eq!(out.state, ExecutionState::Completed, "{:?}", out.detail);
    assert_eq!(out.ssh().cloned().unwrap().stdout, "ok\n");
    let record = r.rig.store.view().execution(out.execution_id).unwrap().unwrap().record;
    assert!(record["target"]["command"].as_str().unwrap().starts_with("test -n 'SECRET(token:"), "{record}");
    r.rig.store.flush().unwrap();
    for entry in std::fs::read_dir(r.rig.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(!bytes.windows(20).any(|w| w == &TOKEN.as_bytes()[..20]), "the token in {}", path.display());
    }
}

/// The first contact with an `accept-new` host logs in to pin its key: the rungs that need no
/// person are decided before that login (a locked vault contacts nobody), and a host that needs
/// a reviewer for every use is never logged into before one approves (its key must be pinned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpinned_host_is_not_contacted_before_the_ladder_allows_it() {
    let sshd = Sshd::start();
    let r = ssh_rig();
    r.add_host("box", &sshd, sshd.addr(), "id_ed25519", HostKeyPolicy::AcceptNew, None);
    r.rig.vault.lock("test", Timestamp::from_millis(5)).unwrap();
    let err = r.engine.call(exec("box", "echo hi")).await.unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&err), "first_contact_refused", "{err}");
    assert!(err.to_string().contains("vault_locked"), "{err}");
    assert_eq!(r.rig.vault.ssh_host("box").unwrap().host_key, None, "not logged into, not pinned");
    r.rig.vault.unlock("test", Timestamp::from_millis(6)).unwrap();
    r.rig.vault.set_approve_every_use("box", true, Timestamp::from_millis(7)).unwrap();
    let err = r.engine.call(exec("box", "echo hi")).await.unwrap_err();
    assert!(err.to_string().contains("approve_every_use_needs_a_pinned_key"), "{err}");
    assert_eq!(r.rig.vault.ssh_host("box").unwrap().host_key, None);
    r.rig.vault.set_approve_every_use("box", false, Timestamp::from_millis(8)).unwrap();
    let out = r.engine.call(exec("box", "echo hi")).await.unwrap();
    assert_eq!(out.ssh().cloned().unwrap().stdout, "hi\n", "with nothing in the way, the first contact pins and runs");
    assert!(r.rig.vault.ssh_host("box").unwrap().host_key.is_some());
}
