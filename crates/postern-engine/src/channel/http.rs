//! The HTTP channel: send one request and classify what happened by send phase.
//!
//! * no connection was ever established (DNS failure, connection refused, TLS handshake) →
//!   [`Sent::NotSent`]: provably nothing reached the target;
//! * any HTTP response, 4xx and 5xx included → [`Sent::Response`];
//! * anything else after the connection was made (timeout, reset, truncated response) →
//!   [`Sent::Unknown`]: the request may have been executed.

use postern_vault::{CredentialKind, Sensitive};
use serde::{Deserialize, Serialize};
use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Once,
    time::{Duration, Instant},
};

/// The most bytes of a channel's answer a result may hold, unless configured
/// (`--max-result-bytes`): beyond it the answer is not kept, and the result says so
/// (`result_too_large`). No agent can use more in one answer.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;

/// Response headers worth keeping with a result (others are noise or may carry secrets).
const KEPT_HEADERS: [&str; 6] = ["content-type", "location", "etag", "retry-after", "idempotency-key", "x-request-id"];

/// What the channel sends: the rendered request plus the injected credential and key.
#[derive(Debug)]
pub struct Outgoing {
    pub method: String,
    pub url: url::Url,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// The credential, injected as a header; never logged, never journaled.
    pub credential: Option<InjectedCredential>,
    pub idempotency: Option<(String, String)>,
    pub timeout: Duration,
}

/// A vault credential as one request carries it: the header it goes in, and the secrets the
/// outcome stage looks for in what the target sends back (every form of the value).
pub struct InjectedCredential {
    pub header: String,
    pub value: Sensitive<String>,
    secrets: crate::catalog::redaction::CallSecrets,
}

impl fmt::Debug for InjectedCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InjectedCredential").field("header", &self.header).finish_non_exhaustive()
    }
}

impl InjectedCredential {
    pub fn new(kind: &CredentialKind, secret: Sensitive<String>) -> InjectedCredential {
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        let raw = secret.expose();
        let (header, value) = match kind {
            CredentialKind::Bearer => ("authorization".to_owned(), format!("Bearer {raw}")),
            CredentialKind::Basic { username } => {
                ("authorization".to_owned(), format!("Basic {}", STANDARD.encode(format!("{username}:{raw}"))))
            }
            CredentialKind::Header { name } => (name.to_ascii_lowercase(), raw.to_owned()),
        };
        let mut secrets = crate::catalog::redaction::CallSecrets::default();
        secrets.add_credential(kind, raw);
        InjectedCredential { header, value: Sensitive::new(value), secrets }
    }

    /// Every form of the secret a target could send back.
    pub fn secrets(&self) -> &crate::catalog::redaction::CallSecrets {
        &self.secrets
    }
}

/// The stored form of an HTTP outcome (what a retry gets back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResult {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// UTF-8 text, or `base64:` + standard base64 for other bytes.
    pub body: String,
    /// The body broke off after the status line arrived (the rest is missing).
    pub truncated: bool,
    /// The target sent a secret of the call back; those bytes were replaced by `<redacted>` (a
    /// vault secret) or `SECRET(name:digest)` (a secret argument).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_echoed: bool,
    /// The answer was larger than the limit (the number, in bytes): its body was not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_too_large: Option<u64>,
}

#[derive(Debug)]
pub enum Sent {
    /// An answer, as the target sent it (not yet through the outcome stage: never answer, journal
    /// or log it as it is). `over_limit`: the body went on past the limit and was not read.
    Response {
        result: HttpResult,
        elapsed: Duration,
        over_limit: bool,
    },
    NotSent {
        reason: String,
    },
    Unknown {
        reason: String,
    },
}

/// Why a target is refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeTarget {
    #[error("{0} is not https; plain http is allowed only to loopback addresses")]
    PlainHttp(String),
    #[error("{0} is a link-local or cloud-metadata address; Postern never sends requests there")]
    LinkLocal(String),
}

/// Link-local addresses (where cloud metadata services live), the 100.100.100.200-style metadata
/// range, the IPv6 metadata endpoints (AWS `fd00:ec2::254`, GCP `fd20:ce::254`), and an IPv4
/// link-local address embedded in IPv6 (v4-mapped, v4-compatible, NAT64 `64:ff9b::/96` and
/// `64:ff9b:1::/48`, 6to4 `2002::/16`).
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.octets()[..2] == [100, 100],
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                is_link_local(IpAddr::V4(std::net::Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))))
            };
            (s[0] & 0xffc0) == 0xfe80
                || v6 == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
                || v6 == std::net::Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)
                || v6.to_ipv4_mapped().is_some_and(|v4| is_link_local(IpAddr::V4(v4)))
                // v4-compatible (::a.b.c.d) and NAT64 (64:ff9b::a.b.c.d, 64:ff9b:1::/48).
                || (s[..6] == [0; 6] && embedded(s[6], s[7]))
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && embedded(s[6], s[7]))
                || (s[..2] == [0x64, 0xff9b] && s[2] == 1 && embedded(s[6], s[7]))
                // 6to4: 2002:a.b.c.d::/48
                || (s[0] == 0x2002 && embedded(s[1], s[2]))
        }
    }
}

/// Keeps only the addresses Postern may connect to; refuses a name that resolves to nothing else.
pub fn allowed_addresses(host: &str, resolved: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, String> {
    let allowed: Vec<SocketAddr> = resolved.into_iter().filter(|a| !is_link_local(a.ip())).collect();
    if allowed.is_empty() {
        return Err(format!(
            "{host} resolves only to link-local or cloud-metadata addresses; Postern never sends requests there"
        ));
    }
    Ok(allowed)
}

/// The client's resolver: system DNS, minus link-local and metadata addresses, so a name that
/// points there (DNS rebinding included) is refused at connect time, before any byte is sent.
struct GuardedResolver;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed = allowed_addresses(&host, resolved)?;
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// HTTPS is required except for loopback; link-local and metadata addresses are refused.
pub fn check_target(url: &url::Url) -> Result<(), UnsafeTarget> {
    let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let ip: Option<IpAddr> = host.parse().ok();
    let link_local = match ip {
        Some(ip) => is_link_local(ip),
        None => host == "metadata.google.internal" || host == "metadata",
    };
    if link_local {
        return Err(UnsafeTarget::LinkLocal(host));
    }
    let loopback = ip.is_some_and(|ip| ip.is_loopback()) || host == "localhost";
    if url.scheme() != "https" && !loopback {
        return Err(UnsafeTarget::PlainHttp(url.to_string()));
    }
    Ok(())
}

/// Installs rustls' crypto provider once, before any client is built (Postern's, or the one
/// rmcp's OAuth client builds for itself).
pub fn install_crypto() {
    static PROVIDER: Once = Once::new();
    PROVIDER.call_once(|| {
        // Fails only if another provider was installed first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// One HTTP client for the engine: rustls (ring), no redirects ever (a credentialed request
/// must not be forwarded to wherever the target points), no proxies from the environment.
pub fn client() -> reqwest::Client {
    install_crypto();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(std::sync::Arc::new(GuardedResolver))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

fn encode_body(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("base64:{}", base64(bytes)),
    }
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Sends `out` and classifies the result by send phase. At most `limit` bytes of the body are
/// read: a longer one is dropped (`over_limit`), so nothing unbounded is buffered.
pub async fn send(client: &reqwest::Client, out: Outgoing, limit: usize) -> Sent {
    let started = Instant::now();
    let method = match reqwest::Method::from_bytes(out.method.as_bytes()) {
        Ok(m) => m,
        Err(_) => return Sent::NotSent { reason: format!("invalid method {:?}", out.method) },
    };
    let mut request = client.request(method, out.url.clone()).timeout(out.timeout);
    for (name, value) in &out.headers {
        request = request.header(name, value);
    }
    if let Some((name, value)) = &out.idempotency {
        request = request.header(name, value);
    }
    if let Some(credential) = &out.credential {
        let Ok(mut header) = reqwest::header::HeaderValue::from_str(credential.value.expose()) else {
            return Sent::NotSent {
                reason: format!(
                    "the credential cannot be sent in the {} header (only visible ASCII is allowed there)",
                    credential.header
                ),
            };
        };
        header.set_sensitive(true);
        request = request.header(&credential.header, header);
    }
    if let Some(body) = out.body {
        request = request.body(body);
    }
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Sent::NotSent { reason: describe(&e) },
        Err(e) => return Sent::Unknown { reason: describe(&e) },
    };
    let status = response.status().as_u16();
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(k, _)| KEPT_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let mut body = Vec::new();
    let (mut truncated, mut over_limit) = (false, false);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if chunk.len() > limit.saturating_sub(body.len()) {
                    over_limit = true;
                    body = Vec::new();
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            // The status line arrived, so the target acted; the body is incomplete.
            Err(_) => {
                truncated = true;
                break;
            }
        }
    }
    Sent::Response {
        result: HttpResult {
            status,
            headers,
            body: encode_body(&body),
            truncated,
            secret_echoed: false,
            result_too_large: None,
        },
        elapsed: started.elapsed(),
        over_limit,
    }
}

/// An error message with its cause chain, without any request detail that could hold a secret.
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "response body failed"
    } else {
        "request failed"
    };
    let mut cause = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    if cause.is_empty() { kind.to_owned() } else { format!("{kind}: {cause}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolving_only_to_link_local_addresses_are_refused() {
        let addr = |s: &str| s.parse::<SocketAddr>().expect("addr");
        let mixed = vec![addr("169.254.169.254:0"), addr("203.0.113.7:0"), addr("[fe80::1]:0")];
        assert_eq!(allowed_addresses("api.example", mixed), Ok(vec![addr("203.0.113.7:0")]));
        let err = allowed_addresses("rebind.example", vec![addr("169.254.169.254:0"), addr("100.100.100.200:0")])
            .unwrap_err();
        assert!(err.contains("rebind.example resolves only to link-local"), "{err}");
        for metadata in [
            "::ffff:169.254.1.1",
            "fd00:ec2::254",
            "fd20:ce::254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "::169.254.169.254",
            "2002:a9fe:a9fe::1",
            "64:ff9b::6464:64c8",
        ] {
            assert!(is_link_local(metadata.parse().expect("ip")), "{metadata}");
        }
        for fine in ["127.0.0.1", "::1", "64:ff9b::cb00:7107", "2002:cb00:7107::1", "fd00:ec2::253", "2001:db8::1"] {
            assert!(!is_link_local(fine.parse().expect("ip")), "{fine}");
        }
    }

    #[test]
    fn targets_need_https_except_loopback_and_never_link_local() {
        let ok = ["https://api.example/x", "http://127.0.0.1:8080/x", "http://localhost/x", "http://[::1]:9/x"];
        for u in ok {
            check_target(&url::Url::parse(u).expect("url")).expect(u);
        }
        assert!(matches!(
            check_target(&url::Url::parse("http://api.example/").expect("u")),
            Err(UnsafeTarget::PlainHttp(_))
        ));
        for u in ["https://169.254.169.254/latest/meta-data", "https://[fe80::1]/", "https://metadata.google.internal/"]
        {
            assert!(matches!(check_target(&url::Url::parse(u).expect("u")), Err(UnsafeTarget::LinkLocal(_))), "{u}");
        }
    }
}
