//! Test parts: the shared HTTP target (postern-testkit), a fault proxy, and an engine wired to a
//! real store and the real keychain.

use postern_core::{Actor, IntentScope, SessionId, Timestamp};
use postern_engine::{Approver, Call, Engine, LockOnlyApprover, Manifest, channel::upstream::Upstreams};
use postern_store::Store;
use postern_vault::{Binding, Credential, CredentialKind, OsKeychain, Sensitive, Vault};
use serde_json::{Value, json};
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    time::Duration,
};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpListener, net::TcpStream};

pub const SECRET: &str = "CANARY-engine-5c2d9f-credential";

pub use postern_testkit::target::Target;

pub async fn start_target() -> (Target, SocketAddr) {
    let target = Target::start();
    let addr = target.addr;
    (target, addr)
}

/// What the proxy does to the next connection (then it goes back to passing traffic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    Pass = 0,
    /// Forward the request, wait for the target to start answering, then cut both sides: the
    /// target executed, the client sees a dropped connection.
    CutAfterForward = 1,
    /// Accept, then close before forwarding anything.
    ResetBeforeForward = 2,
    /// Accept and never answer.
    Stall = 3,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    next: Arc<AtomicU8>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let next = Arc::new(AtomicU8::new(Fault::Pass as u8));
        let mode = Arc::clone(&next);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                let fault = mode.swap(Fault::Pass as u8, Ordering::SeqCst);
                tokio::spawn(async move {
                    if fault == Fault::ResetBeforeForward as u8 {
                        drop(client);
                        return;
                    }
                    if fault == Fault::Stall as u8 {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        drop(client);
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
                    if fault == Fault::Pass as u8 {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                    // CutAfterForward: relay the request, wait for the first response byte.
                    let (mut cr, _cw) = client.split();
                    let (mut sr, mut sw) = server.split();
                    let mut buf = vec![0u8; 64 * 1024];
                    let forward = async {
                        loop {
                            let n = cr.read(&mut buf).await.unwrap_or(0);
                            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let mut first = [0u8; 1];
                    tokio::select! {
                        _ = forward => {}
                        _ = sr.read(&mut first) => {}
                    }
                });
            }
        });
        FaultProxy { addr, next }
    }

    pub fn next(&self, fault: Fault) {
        self.next.store(fault as u8, Ordering::SeqCst);
    }
}

/// A journal and a vault on the real keychain, and an engine over them, wired as the host wires
/// them (the host is a crate above this one, so the rig builds the parts itself).
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub vault: Arc<Vault>,
    pub engine: Arc<Engine>,
    /// What the next [`Rig::engine_for`] is built with.
    pub approval_timeout: Duration,
    pub max_result_bytes: usize,
}

impl Rig {
    /// An engine serving `manifest` on this rig's journal and vault, asking `approver`.
    pub fn engine_for(&self, manifest: Manifest, approver: Arc<dyn Approver>) -> Arc<Engine> {
        engine_over(&self.store, &self.vault, manifest, approver, self.approval_timeout, self.max_result_bytes)
    }
}

fn engine_over(
    store: &Arc<Store>,
    vault: &Arc<Vault>,
    manifest: Manifest,
    approver: Arc<dyn Approver>,
    approval_timeout: Duration,
    max_result_bytes: usize,
) -> Arc<Engine> {
    let upstreams =
        Upstreams::new(Arc::clone(vault), manifest.server_overrides().clone(), postern_engine::engine::system_clock())
            .with_max_result_bytes(max_result_bytes);
    let engine = Engine::new(
        Arc::clone(store),
        Arc::clone(vault),
        Arc::new(manifest),
        approver,
        postern_engine::engine::system_clock(),
    )
    .unwrap()
    .with_approval_timeout(approval_timeout)
    .with_max_result_bytes(max_result_bytes)
    .with_upstreams(Arc::new(upstreams));
    Arc::new(engine)
}

pub fn manifest(base: &str, status_base: &str) -> Manifest {
    let text = format!(
        r#"
[[tool]]
name = "create_payment"
method = "POST"
url = "{base}/v1/payments"
credential = "pay"
timeout = "3s"
input_schema = {{ type = "object", required = ["amount"], properties = {{ amount = {{ type = "integer" }} }} }}
contract = {{ class = "idempotency_key", idempotency_header = "Idempotency-Key", attach_window = "10m" }}

[[tool]]
name = "open_ticket"
method = "POST"
url = "{base}/v1/tickets"
timeout = "3s"
contract = {{ class = "irreversible", attach_window = "10m" }}

[[tool]]
name = "slow_payment"
method = "POST"
url = "{base}/v1/payments"
credential = "pay"
timeout = "300ms"
contract = {{ class = "idempotency_key", idempotency_header = "Idempotency-Key" }}

[[tool]]
name = "echo"
method = "GET"
url = "{base}/v1/echo"
credential = "pay"

[[tool]]
name = "create_payment_checked"
method = "POST"
url = "{base}/v1/payments"
credential = "pay"
timeout = "3s"
input_schema = {{ type = "object", required = ["amount"], properties = {{ amount = {{ type = "integer" }} }} }}
contract = {{ class = "status_query", idempotency_header = "Idempotency-Key", status_query = {{ method = "GET", url_template = "{status_base}/v1/status/{{execution_id}}", done = [200], never_received = [404] }} }}

[[tool]]
name = "create_payment_briefly_checked"
method = "POST"
url = "{base}/v1/payments"
credential = "pay"
timeout = "3s"
contract = {{ class = "status_query", idempotency_header = "Idempotency-Key", key_retention = "1s", status_query = {{ method = "GET", url_template = "{status_base}/v1/status/{{execution_id}}", done = [200], never_received = [404] }} }}
"#
    );
    Manifest::parse(&text, std::path::Path::new("test-tools.toml")).unwrap()
}

pub fn rig(manifest: Manifest) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let rig = open_rig(dir, manifest);
    let credential = Credential {
        name: "pay".into(),
        kind: CredentialKind::Header { name: "X-Api-Key".into() },
        bindings: vec![Binding::new("127.0.0.1", None).unwrap()],
        approve_every_use: false,
        idempotency_header: None,
        reads_have_effects: false,
    };
    rig.vault.add_credential(&credential, &Sensitive::new(SECRET.into()), Timestamp::from_millis(3)).unwrap();
    rig
}

/// Opens (or reopens, running crash recovery) the store in `dir` with the real keychain.
/// (The test keyring is a throwaway one per test run, so credentials are not cleaned up.)
pub fn open_rig(dir: tempfile::TempDir, manifest: Manifest) -> Rig {
    let keychain = OsKeychain::connect().unwrap_or_else(|e| panic!("run through scripts/test.sh: {e}"));
    let now = Timestamp::from_millis(1);
    let (store, _recovery) = Store::open(&dir.path().join("postern.db"), now).unwrap();
    let store = Arc::new(store);
    let vault = Arc::new(Vault::open(Arc::clone(&store), Arc::new(keychain), now).unwrap());
    let (approval_timeout, max_result_bytes) =
        (postern_engine::engine::DEFAULT_APPROVAL_TIMEOUT, postern_engine::channel::http::DEFAULT_MAX_RESULT_BYTES);
    let engine = engine_over(&store, &vault, manifest, Arc::new(LockOnlyApprover), approval_timeout, max_result_bytes);
    Rig { dir, store, vault, engine, approval_timeout, max_result_bytes }
}

pub fn call(tool: &str, arguments: Value, session: u128, jsonrpc_id: u64) -> Call {
    let session = SessionId::from_parts(Timestamp::from_millis(5), session);
    Call {
        tool: tool.into(),
        arguments,
        actor: Actor::process("/usr/bin/test-agent", "abcd"),
        intent_scope: IntentScope::agent_run(session),
        // No agent run: the ladder treats the call as the operator's (agent runs are the gateway tests' business).
        session: None,
        correlation: json!({ "jsonrpc_id": jsonrpc_id }),
        cancel: Default::default(),
        bound: Default::default(),
        resolved: None,
        opening: Default::default(),
    }
}

pub use postern_testkit::file_containing;
