//! Test parts: an HTTP target that honours the Idempotency-Key draft and counts side effects, a
//! fault proxy, and an engine wired to a real store and the real keychain.

use axum::{
    Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
};
use postern_core::{Actor, IntentScope, SessionId, Timestamp};
use postern_engine::{Call, Engine, LockOnlyApprover, Manifest};
use postern_store::Store;
use postern_vault::{Binding, Credential, CredentialKind, OsKeychain, Sensitive, Vault};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpListener, net::TcpStream};

pub const SECRET: &str = "CANARY-engine-5c2d9f-credential";

#[derive(Clone)]
enum Keyed {
    InFlight,
    Done { payload: Vec<u8>, body: Value },
}

/// A payments API implementing the IETF Idempotency-Key draft, counting real side effects.
#[derive(Default)]
pub struct Target {
    pub payments: AtomicU64,
    pub irreversible: AtomicU64,
    pub requests: AtomicU64,
    keys: Mutex<HashMap<String, Keyed>>,
    pub seen_keys: Mutex<Vec<String>>,
    pub seen_credentials: Mutex<Vec<String>>,
    pub delay_ms: AtomicU64,
    /// What `/v1/inspect` received: its content type and body bytes.
    pub received: Mutex<Vec<(String, Vec<u8>)>>,
}

async fn payments(State(t): State<Arc<Target>>, headers: HeaderMap, body: axum::body::Bytes) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    if let Some(v) = headers.get("x-api-key") {
        t.seen_credentials.lock().unwrap().push(v.to_str().unwrap_or("").to_owned());
    }
    let key = headers.get("idempotency-key").map(|v| v.to_str().unwrap_or("").to_owned());
    if let Some(key) = &key {
        t.seen_keys.lock().unwrap().push(key.clone());
        let existing = t.keys.lock().unwrap().get(key).cloned();
        match existing {
            Some(Keyed::Done { payload, body: stored }) if payload == body.to_vec() => {
                return (StatusCode::CREATED, [("idempotent-replayed", "true")], axum::Json(stored)).into_response();
            }
            Some(Keyed::Done { .. }) => {
                return (StatusCode::UNPROCESSABLE_ENTITY, "key reused with another payload").into_response();
            }
            Some(Keyed::InFlight) => {
                return (StatusCode::CONFLICT, "request with this key in flight").into_response();
            }
            None => {
                t.keys.lock().unwrap().insert(key.clone(), Keyed::InFlight);
            }
        }
    }
    // The payment is made as soon as the request arrives; only the answer may be slow.
    let n = t.payments.fetch_add(1, Ordering::SeqCst) + 1;
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let created = json!({ "id": format!("pay_{n}"), "amount": request["amount"] });
    if let Some(key) = key {
        t.keys.lock().unwrap().insert(key, Keyed::Done { payload: body.to_vec(), body: created.clone() });
    }
    let delay = t.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    (StatusCode::CREATED, axum::Json(created)).into_response()
}

async fn inspect(State(t): State<Arc<Target>>, headers: HeaderMap, body: axum::body::Bytes) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    t.received.lock().unwrap().push((content_type, body.to_vec()));
    StatusCode::NO_CONTENT
}

async fn irreversible(State(t): State<Arc<Target>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let n = t.irreversible.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, axum::Json(json!({ "ticket": n })))
}

async fn echo(State(t): State<Arc<Target>>, headers: HeaderMap) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    format!("you sent {key}")
}

/// A hostile target: sends the credential it received back in every spelling it can think of —
/// bare (after the scheme, or the decoded basic password), JSON-escaped, percent-encoded, as the
/// base64 it came in, and in a `Location` header.
async fn mirror(State(t): State<Arc<Target>>, headers: HeaderMap) -> impl IntoResponse {
    use base64::Engine as _;
    t.requests.fetch_add(1, Ordering::SeqCst);
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let (secret, encoded) = match auth.split_once(' ') {
        Some(("Basic", b64)) => {
            let pair = base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default();
            let pair = String::from_utf8_lossy(&pair).into_owned();
            (pair.split_once(':').map(|(_, p)| p.to_owned()).unwrap_or_default(), b64.trim_end_matches('=').to_owned())
        }
        Some((_, token)) => (token.to_owned(), String::new()),
        None => (String::new(), String::new()),
    };
    let percent: String = secret
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02x}") })
        .collect();
    let body = json!({ "you_sent": secret, "header": auth, "encoded": encoded, "query": format!("t={percent}") });
    ([("location", format!("/next?token={percent}"))], axum::Json(body))
}

async fn redirect(State(t): State<Arc<Target>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    (StatusCode::FOUND, [("location", "http://127.0.0.2:9/steal")], "moved")
}

async fn large(State(t): State<Arc<Target>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    "x".repeat(100_000)
}

async fn status(State(t): State<Arc<Target>>, Path(key): Path<String>) -> impl IntoResponse {
    match t.keys.lock().unwrap().get(&key) {
        Some(Keyed::Done { body, .. }) => (StatusCode::OK, axum::Json(body.clone())).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A status route that never knows more than "pending", whatever was received.
async fn job(State(t): State<Arc<Target>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    axum::Json(json!({ "state": "pending" }))
}

impl Target {
    /// The target forgets every idempotency key it has seen (its retention passed).
    pub fn forget_keys(&self) {
        self.keys.lock().unwrap().clear();
    }
}

pub async fn serve_target(listener: TcpListener) -> Arc<Target> {
    let target = Arc::new(Target::default());
    let app = Router::new()
        .route("/v1/payments", post(payments))
        .route("/v1/tickets", post(irreversible))
        .route("/v1/inspect", post(inspect))
        .route("/v1/echo", get(echo))
        .route("/v1/mirror", get(mirror))
        .route("/v1/status/{key}", get(status))
        .route("/v1/jobs/{key}", get(job))
        .route("/v1/redirect", get(redirect))
        .route("/v1/large", get(large))
        .with_state(Arc::clone(&target));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    target
}

pub async fn start_target() -> (Arc<Target>, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (serve_target(listener).await, addr)
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

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub host: postern_host::Host,
    pub store: Arc<Store>,
    pub vault: Arc<Vault>,
    pub engine: Arc<Engine>,
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
    let config = postern_host::HostConfig::new(dir.path().to_owned());
    let host = postern_host::Host::open_with(config, Arc::new(keychain), Timestamp::from_millis(1)).unwrap();
    let engine = host.engine(manifest, Arc::new(LockOnlyApprover)).unwrap();
    Rig { store: Arc::clone(&host.store), vault: Arc::clone(&host.vault), dir, host, engine }
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
    }
}

pub use postern_testkit::file_containing;
