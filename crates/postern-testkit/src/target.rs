//! The HTTP target every crate's tests send real requests to: a loopback payments API that
//! honours the IETF Idempotency-Key draft and counts the side effects it makes, with the routes
//! hostile and awkward targets need (a mirror of the credential, a redirect, a large answer, a
//! status route, a route that never answers). A fault test counts payments here, never log lines.
//!
//! It runs on a runtime of its own, on its own thread, so a synchronous test and a `tokio::test`
//! use it alike; dropping it stops the server.

use axum::{
    Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

#[derive(Clone, Debug)]
enum Keyed {
    InFlight,
    Done { payload: Vec<u8>, body: Value },
}

#[derive(Debug, Default)]
struct Counts {
    /// Every request, on any route.
    requests: AtomicU64,
    /// POSTs to a payments route, repeats of a seen key included.
    posts: AtomicU64,
    /// Payments made: a POST whose `Idempotency-Key` was seen before makes none.
    payments: AtomicU64,
    irreversible: AtomicU64,
    /// Reads of the balance.
    gets: AtomicU64,
    /// Requests the vanishing route took without answering.
    vanished: AtomicU64,
    keys: Mutex<HashMap<String, Keyed>>,
    seen_keys: Mutex<Vec<String>>,
    seen_credentials: Mutex<Vec<String>>,
    /// What `/v1/inspect` received: its content type and body bytes.
    received: Mutex<Vec<(String, Vec<u8>)>>,
    delay_ms: AtomicU64,
    hold: Mutex<bool>,
    released: tokio::sync::Notify,
    arrivals: Arrivals,
}

/// What looks at each request as it arrives, before any route handles it.
#[derive(Default)]
struct Arrivals(Mutex<Option<Probe>>);

/// Looks at one arriving request's path.
type Probe = Arc<dyn Fn(&str) + Send + Sync>;

impl std::fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Arrivals")
    }
}

/// A running target. Routes (each also under the short name the CLI's manifests use):
///
/// * `POST /v1/payments` (`/pay`): a payment. With an `Idempotency-Key` seen before and the same
///   body, the first answer again and no payment; another body, 422; still in flight, 409.
/// * `POST /v1/tickets`: an irreversible side effect, counted.
/// * `POST /v1/inspect`: keeps the content type and body it received.
/// * `GET /v1/balance` (`/balance`): a read, counted.
/// * `GET /v1/echo`, `/v1/mirror`: send the credential back (the mirror in every spelling).
/// * `GET /v1/status/{key}`: what a payment with that key answered; `/v1/jobs/{key}`: "pending".
/// * `GET /v1/redirect` (to another host), `/v1/large` (100 kB).
/// * [`Target::vanish_addr`]: a listener that reads a request and closes without answering.
#[derive(Debug)]
pub struct Target {
    pub addr: SocketAddr,
    vanish: SocketAddr,
    counts: Arc<Counts>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Target {
    /// A target on a fresh loopback port.
    pub fn start() -> Target {
        Target::serve(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// A target on `listener` (a test that restarts a target on the address it had).
    pub fn serve(listener: std::net::TcpListener) -> Target {
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let vanish = vanishing(Arc::clone(&counts));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, is_ready) = std::sync::mpsc::channel();
        let app = routes(Arc::clone(&counts));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                ready.send(()).unwrap();
                // Stopped, the listener closes at once (a test may bind its address again);
                // answers still being written are dropped with the runtime.
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
            runtime.shutdown_background();
        });
        is_ready.recv().unwrap();
        Target { addr, vanish, counts, stop: Some(stop) }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address of the route that takes a request and never answers.
    pub fn vanish_addr(&self) -> SocketAddr {
        self.vanish
    }

    pub fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::SeqCst)
    }

    pub fn posts(&self) -> u64 {
        self.counts.posts.load(Ordering::SeqCst)
    }

    /// Payments the target made (repeats of a seen `Idempotency-Key` make none).
    pub fn payments(&self) -> u64 {
        self.counts.payments.load(Ordering::SeqCst)
    }

    pub fn irreversible(&self) -> u64 {
        self.counts.irreversible.load(Ordering::SeqCst)
    }

    pub fn gets(&self) -> u64 {
        self.counts.gets.load(Ordering::SeqCst)
    }

    pub fn vanished(&self) -> u64 {
        self.counts.vanished.load(Ordering::SeqCst)
    }

    /// Every `Idempotency-Key` received, in order.
    pub fn seen_keys(&self) -> Vec<String> {
        self.counts.seen_keys.lock().unwrap().clone()
    }

    /// Every `X-Api-Key` a payment carried, in order.
    pub fn seen_credentials(&self) -> Vec<String> {
        self.counts.seen_credentials.lock().unwrap().clone()
    }

    /// What `/v1/inspect` received: (content type, body).
    pub fn received(&self) -> Vec<(String, Vec<u8>)> {
        self.counts.received.lock().unwrap().clone()
    }

    /// Payments are made at once but answered `ms` later.
    pub fn delay_answers(&self, ms: u64) {
        self.counts.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// The target forgets every idempotency key it has seen (its retention passed).
    pub fn forget_keys(&self) {
        self.counts.keys.lock().unwrap().clear();
    }

    /// Calls `probe` with the path of every request from now on, as it arrives (before the route
    /// handles it): to see what else was true at the moment a request reached the target.
    pub fn on_arrival(&self, probe: impl Fn(&str) + Send + Sync + 'static) {
        *self.counts.arrivals.0.lock().unwrap() = Some(Arc::new(probe));
    }

    /// Payments made from now on wait for [`Target::release`] before being answered.
    pub fn hold(&self) {
        *self.counts.hold.lock().unwrap() = true;
    }

    pub fn release(&self) {
        *self.counts.hold.lock().unwrap() = false;
        self.counts.released.notify_waiters();
    }
}

impl Target {
    /// The tools manifest the CLI's end-to-end tests serve: an idempotency-key payment, an
    /// irreversible one, a read, and an irreversible call whose target never answers.
    pub fn manifest(&self) -> String {
        let base = self.base();
        let vanish = format!("http://{}", self.vanish);
        format!(
            r#"
[[tool]]
name = "pay"
description = "Make a payment."
method = "POST"
url = "{base}/pay"
input_schema = {{ type = "object", properties = {{ amount = {{ type = "integer" }} }}, required = ["amount"] }}
contract = {{ class = "idempotency_key", idempotency_header = "Idempotency-Key" }}

[[tool]]
name = "wire"
description = "Send a wire transfer (cannot be made idempotent)."
method = "POST"
url = "{base}/pay"
input_schema = {{ type = "object", properties = {{ amount = {{ type = "integer" }} }}, required = ["amount"] }}
contract = {{ class = "irreversible" }}

[[tool]]
name = "balance"
description = "Read the balance."
method = "GET"
url = "{base}/balance"

[[tool]]
name = "launch"
description = "Launch, irreversibly; the target never answers."
method = "POST"
url = "{vanish}/launch"
timeout = "5s"
input_schema = {{ type = "object", properties = {{ n = {{ type = "integer" }} }} }}
contract = {{ class = "irreversible" }}
"#
        )
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.release();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn routes(counts: Arc<Counts>) -> Router {
    Router::new()
        .route("/v1/payments", post(payments))
        .route("/pay", post(payments))
        .route("/v1/tickets", post(irreversible))
        .route("/v1/inspect", post(inspect))
        .route("/v1/balance", get(balance))
        .route("/balance", get(balance))
        .route("/v1/echo", get(echo))
        .route("/v1/mirror", get(mirror))
        .route("/v1/status/{key}", get(status))
        .route("/v1/jobs/{key}", get(job))
        .route("/v1/redirect", get(redirect))
        .route("/v1/large", get(large))
        .route("/v1/report", post(report))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&counts), arrived))
        .with_state(counts)
}

/// Hands each request's path to the probe set with [`Target::on_arrival`], if any.
async fn arrived(
    State(t): State<Arc<Counts>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let probe = t.arrivals.0.lock().unwrap().clone();
    if let Some(probe) = probe {
        probe(request.uri().path());
    }
    next.run(request).await
}

async fn payments(State(t): State<Arc<Counts>>, headers: HeaderMap, body: axum::body::Bytes) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    t.posts.fetch_add(1, Ordering::SeqCst);
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
    // The payment is made as soon as the request arrives; only the answer may be slow or held.
    let n = t.payments.fetch_add(1, Ordering::SeqCst) + 1;
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let created = json!({
        "payment": n,
        "id": format!("pay_{n}"),
        "amount": request["amount"],
        "received": String::from_utf8_lossy(&body),
    });
    if let Some(key) = key {
        t.keys.lock().unwrap().insert(key, Keyed::Done { payload: body.to_vec(), body: created.clone() });
    }
    let delay = t.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    loop {
        let wait = t.released.notified();
        if !*t.hold.lock().unwrap() {
            break;
        }
        wait.await;
    }
    (StatusCode::CREATED, axum::Json(created)).into_response()
}

async fn irreversible(State(t): State<Arc<Counts>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let n = t.irreversible.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, axum::Json(json!({ "ticket": n })))
}

async fn inspect(State(t): State<Arc<Counts>>, headers: HeaderMap, body: axum::body::Bytes) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    t.received.lock().unwrap().push((content_type, body.to_vec()));
    StatusCode::NO_CONTENT
}

async fn balance(State(t): State<Arc<Counts>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let n = t.gets.fetch_add(1, Ordering::SeqCst) + 1;
    axum::Json(json!({ "balance": 100, "reads": n }))
}

async fn echo(State(t): State<Arc<Counts>>, headers: HeaderMap) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    format!("you sent {key}")
}

/// A hostile target: sends the credential it received back in every spelling it can think of:
/// bare (after the scheme, or the decoded basic password), JSON-escaped, percent-encoded, as the
/// base64 it came in, and in a `Location` header.
async fn mirror(State(t): State<Arc<Counts>>, headers: HeaderMap) -> impl IntoResponse {
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

async fn redirect(State(t): State<Arc<Counts>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    (StatusCode::FOUND, [("location", "http://127.0.0.2:9/steal")], "moved")
}

async fn large(State(t): State<Arc<Counts>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    "x".repeat(100_000)
}

/// A side effect whose answer is larger than a client's kernel takes in without the client
/// reading, yet one that hyper buffers whole (150 KB), counted as a POST.
async fn report(State(t): State<Arc<Counts>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    t.posts.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "r".repeat(150_000))
}

async fn status(State(t): State<Arc<Counts>>, Path(key): Path<String>) -> impl IntoResponse {
    match t.keys.lock().unwrap().get(&key) {
        Some(Keyed::Done { body, .. }) => (StatusCode::OK, axum::Json(body.clone())).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A status route that never knows more than "pending", whatever was received.
async fn job(State(t): State<Arc<Counts>>) -> impl IntoResponse {
    t.requests.fetch_add(1, Ordering::SeqCst);
    axum::Json(json!({ "state": "pending" }))
}

/// A listener that takes each request and closes the connection without answering.
fn vanishing(counts: Arc<Counts>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut stream, &mut buf);
            counts.vanished.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    addr
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn post(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let key = key.map(|k| format!("Idempotency-Key: {k}\r\n")).unwrap_or_default();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{key}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn a_repeated_key_makes_no_second_payment_and_another_body_is_refused() {
        let t = Target::start();
        assert!(post(t.addr, "/v1/payments", Some("k1"), r#"{"amount":5}"#).starts_with("HTTP/1.1 201"));
        let again = post(t.addr, "/pay", Some("k1"), r#"{"amount":5}"#);
        assert!(again.contains("idempotent-replayed: true"), "{again}");
        assert!(post(t.addr, "/v1/payments", Some("k1"), r#"{"amount":6}"#).starts_with("HTTP/1.1 422"));
        post(t.addr, "/v1/payments", None, r#"{"amount":7}"#);
        assert_eq!((t.posts(), t.payments(), t.seen_keys().len()), (4, 2, 3));
    }
}
