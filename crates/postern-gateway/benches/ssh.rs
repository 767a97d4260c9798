//! `ssh_exec` of `true` through Postern against OpenSSH's own `ssh` client (a new connection per
//! call, and with a kept `ControlMaster` connection), to the same loopback `sshd`, in one run:
//! p50 per call each way, and the marker protocol's extra cost (a marker
//! tool against the same command as an `irreversible` tool, which skips the marker).
//!
//! `cargo bench -p postern-gateway --bench ssh` (needs openssh-server and openssh-client).

mod common;

use postern_core::{Actor, IntentScope, SessionId, Timestamp};
use postern_engine::{Call, LockOnlyApprover, Manifest};
use postern_testkit::sshd;
use postern_vault::{HostKeyPolicy, Sensitive, SshHost};
use serde_json::json;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

const CALLS: usize = 60;

fn main() {
    let sshd = sshd::Sshd::start();
    let markers = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir().expect("tempdir");
    let postern = common::host(postern_host::HostConfig::new(dir.path().to_owned()));
    let vault = Arc::clone(&postern.vault);
    let (_, fingerprint) = postern_engine::channel::ssh::host_key(&sshd.host_key()).expect("host key");
    let host = SshHost {
        name: "box".into(),
        address: "127.0.0.1".into(),
        port: sshd.port,
        account: sshd.account.clone(),
        policy: HostKeyPolicy::Strict,
        host_key: Some(sshd.host_key()),
        host_key_fingerprint: Some(fingerprint),
        marker_root: markers.path().to_str().expect("utf-8").to_owned(),
        approve_every_use: false,
    };
    let key = sshd.key("id_ed25519");
    vault.add_ssh_host(&host, &Sensitive::new(key.private), None, Timestamp::from_millis(3)).expect("add host");
    let manifest = Manifest::parse(
        "[[tool]]\nname = \"true_plain\"\nssh = { host = \"box\", command = \"true\" }\ncontract = { class = \"irreversible\" }\n",
        std::path::Path::new("bench.toml"),
    )
    .expect("manifest");
    let engine = postern.engine(manifest, Arc::new(LockOnlyApprover)).expect("engine");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");

    // OpenSSH's client: a new connection per call, and with a kept master connection
    // (ControlMaster/ControlPersist), the anchor for Postern's kept connections.
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(&known_hosts, format!("[127.0.0.1]:{} {}\n", sshd.port, sshd.host_key())).expect("known_hosts");
    let ssh = |master: Option<&std::path::Path>| {
        let mut command = std::process::Command::new("ssh");
        command
            .args(["-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
            .arg("-i")
            .arg(sshd.dir.path().join("id_ed25519"));
        if let Some(path) = master {
            command.args(["-o", "ControlMaster=auto", "-o", "ControlPersist=60", "-o"]);
            command.arg(format!("ControlPath={}", path.display()));
        }
        let status = command
            .args(["-p", &sshd.port.to_string()])
            .arg(format!("{}@127.0.0.1", sshd.account))
            .arg("true")
            .status()
            .expect("ssh");
        assert!(status.success());
    };
    let openssh = time(CALLS, || ssh(None));
    let master = dir.path().join("cm");
    let openssh_master = time(CALLS, || ssh(Some(&master)));
    let _ = std::process::Command::new("ssh")
        .args(["-q", "-O", "exit", "-o"])
        .arg(format!("ControlPath={}", master.display()))
        .arg("127.0.0.1")
        .status();

    let mut n = 0u128;
    let mut call = |tool: &str, arguments: serde_json::Value| {
        n += 1;
        let session = SessionId::from_parts(Timestamp::from_millis(5), n);
        let call = Call {
            tool: tool.into(),
            arguments,
            actor: Actor::process("/usr/bin/bench", "00"),
            intent_scope: IntentScope::agent_run(session),
            session: None,
            correlation: json!({}),
            cancel: Default::default(),
            bound: Default::default(),
            resolved: None,
            opening: Default::default(),
        };
        let out = runtime.block_on(engine.call(call)).expect("call");
        assert_eq!(out.ssh().and_then(|s| s.exit_status), Some(0), "{:?}", out.detail);
    };
    let marker = time(CALLS, || call("ssh_exec", json!({ "host": "box", "command": "true" })));
    let plain = time(CALLS, || call("true_plain", json!({})));

    println!("ssh `true` to a loopback OpenSSH sshd, {CALLS} calls each (Postern keeps its connection):");
    println!("  OpenSSH client (ssh), new connection      p50 {:>7.2} ms", common::ms(openssh));
    println!("  OpenSSH client, ControlMaster kept        p50 {:>7.2} ms", common::ms(openssh_master));
    println!("  Postern ssh_exec (marker protocol)        p50 {:>7.2} ms", common::ms(marker));
    println!("  Postern SSH tool, irreversible (no marker) p50 {:>7.2} ms", common::ms(plain));
    println!("  marker protocol's extra cost              p50 {:>+7.2} ms", common::ms(marker) - common::ms(plain));
}

/// The p50 of `calls` runs of `f`.
fn time(calls: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut latencies = Vec::with_capacity(calls);
    let started = Instant::now();
    for _ in 0..calls {
        let t = Instant::now();
        f();
        latencies.push(t.elapsed());
    }
    common::figures(latencies, started.elapsed()).p50
}
