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

/// Response bodies are stored up to this size; the rest is dropped and flagged.
pub const DEFAULT_BODY_CAP: usize = 8 * 1024 * 1024;

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

/// A vault credential as one request carries it, with every form in which a target could send
/// it back (so an echo is redacted from the result whatever its encoding).
pub struct InjectedCredential {
    pub header: String,
    pub value: Sensitive<String>,
    /// Longest first: the header value as sent, the bare secret, and base64 of `user:secret` and
    /// of the secret. Each is found in any mix of percent-, form- and JSON-escaped spellings.
    echoes: Vec<Sensitive<String>>,
}

impl fmt::Debug for InjectedCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InjectedCredential").field("header", &self.header).finish_non_exhaustive()
    }
}

impl InjectedCredential {
    pub fn new(kind: &CredentialKind, secret: Sensitive<String>) -> InjectedCredential {
        use base64::Engine as _;
        use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
        let raw = secret.expose();
        let mut echoes = vec![raw.to_owned(), STANDARD_NO_PAD.encode(raw), URL_SAFE_NO_PAD.encode(raw)];
        let (header, value) = match kind {
            CredentialKind::Bearer => ("authorization".to_owned(), format!("Bearer {raw}")),
            CredentialKind::Basic { username } => {
                let pair = format!("{username}:{raw}");
                echoes.extend([STANDARD_NO_PAD.encode(&pair), URL_SAFE_NO_PAD.encode(&pair)]);
                ("authorization".to_owned(), format!("Basic {}", STANDARD.encode(&pair)))
            }
            CredentialKind::Header { name } => (name.to_ascii_lowercase(), raw.to_owned()),
        };
        echoes.push(value.clone());
        echoes.retain(|e| !e.is_empty());
        echoes.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        echoes.dedup();
        InjectedCredential {
            header,
            value: Sensitive::new(value),
            echoes: echoes.into_iter().map(Sensitive::new).collect(),
        }
    }

    /// `bytes` with every echo of the secret, in any spelling, replaced by `<redacted>`, and
    /// whether there was one.
    pub fn redact(&self, bytes: &[u8]) -> (Vec<u8>, bool) {
        let mut out = bytes.to_vec();
        let mut found = false;
        for echo in &self.echoes {
            let (redacted, any) = crate::redaction::replace_spellings(&out, echo.expose(), b"<redacted>");
            if any {
                out = redacted;
                found = true;
            }
        }
        (out, found)
    }
}

/// The stored form of an HTTP outcome (what a retry gets back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResult {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// UTF-8 text, or `base64:` + standard base64 for other bytes.
    pub body: String,
    pub truncated: bool,
    /// The target sent the credential back; those bytes were replaced by `<redacted>`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_echoed: bool,
}

#[derive(Debug)]
pub enum Sent {
    Response { result: HttpResult, elapsed: Duration },
    NotSent { reason: String },
    Unknown { reason: String },
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

/// One HTTP client for the engine: rustls (ring), no redirects ever (a credentialed request
/// must not be forwarded to wherever the target points), no proxies from the environment.
pub fn client() -> reqwest::Client {
    static PROVIDER: Once = Once::new();
    PROVIDER.call_once(|| {
        // Fails only if another provider was installed first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
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

/// Sends `out` and classifies the result by send phase.
pub async fn send(client: &reqwest::Client, out: Outgoing, body_cap: usize) -> Sent {
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
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(k, _)| KEPT_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let mut body = Vec::new();
    let mut truncated = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = body_cap.saturating_sub(body.len());
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
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
    let mut secret_echoed = false;
    if let Some(credential) = &out.credential {
        let (redacted, echoed) = credential.redact(&body);
        (body, secret_echoed) = (redacted, echoed);
        for (_, value) in &mut headers {
            let (redacted, echoed) = credential.redact(value.as_bytes());
            if echoed {
                *value = String::from_utf8_lossy(&redacted).into_owned();
                secret_echoed = true;
            }
        }
    }
    Sent::Response {
        result: HttpResult { status, headers, body: encode_body(&body), truncated, secret_echoed },
        elapsed: started.elapsed(),
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
    use proptest::prelude::*;

    fn bearer(secret: &str) -> InjectedCredential {
        InjectedCredential::new(&CredentialKind::Bearer, Sensitive::new(secret.to_owned()))
    }

    #[test]
    fn every_spelling_of_the_secret_is_redacted() {
        let c = InjectedCredential::new(
            &CredentialKind::Basic { username: "ops".into() },
            Sensitive::new("p@ss w/\"d".into()),
        );
        for echo in [
            "p@ss w/\"d",
            "p%40ss%20w%2F%22d",
            "p%40ss+w%2f%22d",
            "p@ss w\\/\\\"d",
            "p\\u0040ss w/\\\"d",
            "b3BzOnBAc3Mgdy8iZA",
            "Basic b3BzOnBAc3Mgdy8iZA==",
        ] {
            let (out, found) = c.redact(format!("before {echo} after").as_bytes());
            assert!(found, "{echo}");
            assert_eq!(String::from_utf8(out).unwrap(), "before <redacted> after", "{echo}");
        }
        let (out, found) = c.redact(b"p@ss w/ nothing else");
        assert!(!found);
        assert_eq!(out, b"p@ss w/ nothing else");
        assert!(!format!("{c:?}").contains("p@ss"));
    }

    /// One spelling of `secret`: each character as itself, percent-encoded (either case) or
    /// JSON-escaped, as `choices` says.
    fn spell(secret: &str, choices: &[u8]) -> String {
        secret
            .chars()
            .zip(choices.iter().cycle())
            .map(|(c, choice)| match choice % 4 {
                0 => c.to_string(),
                1 => c.to_string().bytes().map(|b| format!("%{b:02X}")).collect(),
                2 => c.to_string().bytes().map(|b| format!("%{b:02x}")).collect(),
                _ => match c {
                    '"' | '\\' | '/' => format!("\\{c}"),
                    c if (c as u32) < 0x10000 => format!("\\u{:04x}", c as u32),
                    c => c.to_string(),
                },
            })
            .collect()
    }

    proptest! {
        /// Whatever the secret and however a hostile target spells it back, the result keeps no
        /// spelling of it.
        #[test]
        fn a_secret_spelled_any_way_is_redacted(
            secret in "#[ -~]{5,40}",
            choices in proptest::collection::vec(any::<u8>(), 1..64),
            before in "[a-z ]{0,20}",
            after in "[a-z ]{0,20}",
        ) {
            let c = bearer(&secret);
            let spelled = spell(&secret, &choices);
            let (out, found) = c.redact(format!("{before}{spelled}{after}").as_bytes());
            prop_assert!(found);
            let out = String::from_utf8(out).unwrap();
            prop_assert!(!out.contains(&secret), "{out}");
            prop_assert!(!out.contains(&spelled), "{out}");
        }
    }

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
