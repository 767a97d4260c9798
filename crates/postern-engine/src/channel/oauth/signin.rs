//! One sign-in: the authorization server found from the server (its 401 challenge's
//! `resource_metadata`, else the well-known URLs), a client (the owner's `--client-id`, else the
//! owner's Client ID Metadata Document where the authorization server takes one, else Dynamic
//! Client Registration), an authorization URL with PKCE S256 and `resource`, and a loopback
//! listener on 127.0.0.1 that takes exactly one redirect carrying the right `state`, then
//! closes; the code is exchanged (its `iss` checked) for a [`Grant`]. [`offer`] runs the same
//! discovery for a URL not added yet, so the app can offer OAuth for it.

use super::Grant;
use postern_vault::McpServer;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationMetadata, AuthorizationMetadataSource, AuthorizationRequest,
};
use rmcp::transport::{AuthorizationSession, StoredCredentials};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a sign-in did not complete. No variant holds a code, a token or a verifier.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("{0:?} does not sign in with OAuth (add it with `postern servers add NAME --url URL --oauth`)")]
    NotOAuth(String),
    #[error("the loopback listener for the redirect could not be opened: {0}")]
    Listener(String),
    #[error(
        "{url} publishes no OAuth metadata (no protected-resource metadata, RFC 9728, and no \
         authorization-server metadata, RFC 8414): Postern does not guess endpoints"
    )]
    NoMetadata { url: String },
    #[error("discovery or registration failed: {0}")]
    Discovery(String),
    #[error(
        "the authorization server {issuer} offers no way for Postern to name itself: no Dynamic Client \
         Registration (RFC 7591){cimd}. Register Postern with it by hand and add the server again with \
         --client-id ID"
    )]
    NoClient { issuer: String, cimd: &'static str },
    #[error("the sign-in was refused by the authorization server: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Denied { error: String, description: Option<String> },
    #[error("no redirect came back within {0} s; run `postern servers login` again")]
    TimedOut(u64),
    #[error("the code exchange failed: {0}")]
    Exchange(String),
}

impl postern_core::ErrorCode for SignInError {
    fn code(&self) -> &'static str {
        match self {
            SignInError::NotOAuth(_) => "not_oauth",
            SignInError::Listener(_) => "oauth_listener_failed",
            SignInError::NoMetadata { .. } => "oauth_no_metadata",
            SignInError::Discovery(_) => "oauth_discovery_failed",
            SignInError::NoClient { .. } => "oauth_no_client",
            SignInError::Denied { .. } => "oauth_denied",
            SignInError::TimedOut(_) => "oauth_timed_out",
            SignInError::Exchange(_) => "oauth_exchange_failed",
        }
    }
}

/// A redirect the listener did not accept, for the journal (`oauth_redirect_refused`): what
/// was wrong, never the code it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub why: &'static str,
}

/// The loopback listener of one sign-in.
#[derive(Debug)]
pub struct Listener {
    socket: tokio::net::TcpListener,
    pub redirect_uri: String,
}

impl Listener {
    pub async fn bind() -> Result<Listener, SignInError> {
        let socket =
            tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| SignInError::Listener(e.to_string()))?;
        let port = socket.local_addr().map_err(|e| SignInError::Listener(e.to_string()))?.port();
        Ok(Listener { socket, redirect_uri: format!("http://127.0.0.1:{port}/callback") })
    }
}

/// A sign-in under way: the URL the owner opens, and what the redirect completes.
pub struct SignIn {
    session: AuthorizationSession,
    listener: Listener,
    state: String,
    client_secret: Option<String>,
    resource: String,
    /// The authorization server's metadata as discovery found it for this sign-in: what the
    /// grant keeps (a refresh goes to its token endpoint, and nowhere else).
    metadata: AuthorizationMetadata,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignIn").field("resource", &self.resource).finish_non_exhaustive()
    }
}

/// The endpoints a sign-in sends the code, the verifier, tokens or a client secret to, or opens
/// in the browser, obey the HTTP channel's target rules (https, or http to loopback; no
/// link-local or metadata addresses) and are http(s) at all (no `file:` or custom scheme for
/// `xdg-open`).
fn checked_endpoints(m: &AuthorizationMetadata) -> Result<(), SignInError> {
    let revocation = m.additional_fields.get("revocation_endpoint").and_then(serde_json::Value::as_str);
    let named = [
        Some(m.authorization_endpoint.as_str()),
        Some(m.token_endpoint.as_str()),
        m.registration_endpoint.as_deref(),
        revocation,
    ];
    for endpoint in named.into_iter().flatten() {
        let parsed = url::Url::parse(endpoint)
            .map_err(|e| SignInError::Discovery(format!("an endpoint does not parse: {e}")))?;
        if !matches!(parsed.scheme(), "https" | "http") {
            return Err(SignInError::Discovery(format!(
                "the authorization server's endpoint {endpoint} is not http(s)"
            )));
        }
        crate::channel::http::check_target(&parsed)
            .map_err(|e| SignInError::Discovery(format!("the authorization server's endpoint {endpoint}: {e}")))?;
    }
    if m.issuer.as_deref().is_none_or(str::is_empty) {
        return Err(SignInError::Discovery("the authorization server's metadata names no issuer (RFC 8414)".into()));
    }
    Ok(())
}

fn discovery(e: AuthError) -> SignInError {
    SignInError::Discovery(e.to_string())
}

/// The `WWW-Authenticate` challenge the server answers an unauthenticated request with.
async fn challenge(url: &str) -> Option<String> {
    let body = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"postern","version":"0"}}}"#;
    let answer = crate::channel::http::client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body)
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .ok()?;
    (answer.status() == reqwest::StatusCode::UNAUTHORIZED)
        .then(|| answer.headers().get("www-authenticate")?.to_str().ok().map(str::to_owned))
        .flatten()
}

/// The authorization server of the MCP server at `url`: its metadata as the server's 401
/// challenge (RFC 9728), else the well-known URLs (RFC 8414), publish it; endpoints checked.
/// Nothing is guessed: a server that publishes none is [`SignInError::NoMetadata`]. `challenge`:
/// the server's `WWW-Authenticate`, when the caller has already asked for it.
async fn discover(
    url: &str,
    challenge: Option<String>,
) -> Result<(AuthorizationManager, AuthorizationMetadata), SignInError> {
    crate::channel::http::install_crypto();
    let mut manager = AuthorizationManager::new(url).await.map_err(discovery)?;
    let challenge = match challenge {
        Some(c) => Some(c),
        None => self::challenge(url).await,
    };
    let found = manager.resolve_metadata_from_challenge(challenge.as_deref()).await.map_err(discovery)?;
    if found.source == AuthorizationMetadataSource::LegacyEndpointFallback {
        return Err(SignInError::NoMetadata { url: url.to_owned() });
    }
    let metadata = found.metadata;
    checked_endpoints(&metadata)?;
    manager.set_metadata(metadata.clone());
    Ok((manager, metadata))
}

/// Whether the authorization server takes a Client ID Metadata Document as a client's identity
/// (it advertises `client_id_metadata_document_supported`).
fn takes_metadata_documents(m: &AuthorizationMetadata) -> bool {
    m.additional_fields.get("client_id_metadata_document_supported").and_then(serde_json::Value::as_bool) == Some(true)
}

/// What the server at a URL not added yet says about signing in, for the owner deciding how to
/// add it: whether it asks for OAuth (a 401 whose authorization server publishes metadata), at
/// which issuer, and how Postern would name itself there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Offer {
    pub oauth: bool,
    pub issuer: Option<String>,
    /// `client_metadata_document`, `dynamic_registration` or `client_id_needed` (the owner
    /// registers Postern by hand), when `oauth`.
    pub registration: Option<&'static str>,
    /// The same in words.
    pub said: String,
}

/// Asks the server at `url` (an MCP endpoint, unauthenticated) whether it signs in with OAuth.
/// The URL obeys the HTTP channel's target rules before anything is sent to it.
pub async fn offer(url: &str) -> Result<Offer, SignInError> {
    let parsed = url::Url::parse(url).map_err(|e| SignInError::Discovery(format!("the URL does not parse: {e}")))?;
    if !matches!(parsed.scheme(), "https" | "http") {
        return Err(SignInError::Discovery(format!("{url} is not http(s)")));
    }
    crate::channel::http::check_target(&parsed).map_err(|e| SignInError::Discovery(format!("{url}: {e}")))?;
    crate::channel::http::install_crypto();
    let Some(challenge) = challenge(url).await else {
        return Ok(Offer {
            oauth: false,
            issuer: None,
            registration: None,
            said: "The server did not ask for a sign-in (no 401 challenge): give a vault credential if it needs one."
                .into(),
        });
    };
    let (_, metadata) = discover(url, Some(challenge)).await?;
    let registration = if takes_metadata_documents(&metadata) {
        "client_metadata_document"
    } else if metadata.registration_endpoint.is_some() {
        "dynamic_registration"
    } else {
        "client_id_needed"
    };
    let issuer = metadata.issuer.clone().unwrap_or_default();
    let how = match registration {
        "client_metadata_document" => "it takes a Client ID Metadata Document, else registers Postern itself",
        "dynamic_registration" => "Postern registers itself there",
        _ => "it offers no registration: give the client ID you registered",
    };
    Ok(Offer {
        oauth: true,
        said: format!("The server signs in with OAuth at {issuer} ({how})."),
        issuer: Some(issuer),
        registration: Some(registration),
    })
}

impl SignIn {
    /// Discovers the server's authorization server, names Postern to it (the owner's client ID,
    /// the owner's Client ID Metadata Document where the server takes one, else Dynamic Client
    /// Registration), and builds the authorization URL; the listener is already bound.
    pub async fn begin(server: &McpServer) -> Result<SignIn, SignInError> {
        let (Some(url), Some(settings)) = (&server.url, &server.oauth) else {
            return Err(SignInError::NotOAuth(server.name.clone()));
        };
        let listener = Listener::bind().await?;
        let (mut manager, metadata) = discover(url, None).await?;
        let scopes: Vec<&str> = settings.scopes.iter().map(String::as_str).collect();
        let mut request = AuthorizationRequest::new(listener.redirect_uri.clone()).with_client_name("Postern");
        if !scopes.is_empty() {
            request = request.with_scopes(scopes.iter().copied());
        }
        let document = settings.client_metadata_url.as_deref().filter(|_| takes_metadata_documents(&metadata));
        let client_secret = match (&settings.client_id, document) {
            (Some(id), _) => {
                request = request.with_preregistered_client(id.clone());
                None
            }
            // The document's URL is the client ID; the authorization server fetches it.
            (None, Some(document)) => {
                request = request.with_client_metadata_url(document);
                None
            }
            (None, None) if metadata.registration_endpoint.is_none() => {
                return Err(SignInError::NoClient {
                    issuer: metadata.issuer.clone().unwrap_or_default(),
                    cimd: if settings.client_metadata_url.is_some() {
                        ", and it does not take Client ID Metadata Documents"
                    } else {
                        ""
                    },
                });
            }
            (None, None) => {
                let config =
                    manager.register_client("Postern", &listener.redirect_uri, &scopes).await.map_err(discovery)?;
                request = request.with_preregistered_client(config.client_id.clone());
                if let Some(secret) = &config.client_secret {
                    request = request.with_client_secret(secret.clone());
                }
                config.client_secret
            }
        };
        let session = AuthorizationSession::new(manager, request).await.map_err(|(_, e)| discovery(e))?;
        let state = url::Url::parse(session.get_authorization_url())
            .ok()
            .and_then(|u| u.query_pairs().find(|(k, _)| k == "state").map(|(_, v)| v.into_owned()))
            .ok_or_else(|| SignInError::Discovery("the authorization URL carries no state".into()))?;
        Ok(SignIn { session, listener, state, client_secret, resource: url.clone(), metadata })
    }

    /// The URL the owner opens in a browser.
    pub fn url(&self) -> &str {
        self.session.get_authorization_url()
    }

    /// Opens the system browser at the URL (`xdg-open`); whether one could be started. Every
    /// way of signing in (the CLI, the app) opens it so; the URL is shown anyway.
    pub fn open_browser(&self) -> bool {
        std::process::Command::new("xdg-open")
            .arg(self.url())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .is_ok()
    }

    /// Waits up to `wait` for the redirect with the right `state`, answering every other
    /// request with a page that says why (each reported to `refused`), then exchanges the code.
    pub async fn finish(
        self,
        wait: Duration,
        clock: &postern_core::Clock,
        refused: impl Fn(Redirect),
    ) -> Result<Grant, SignInError> {
        let deadline = tokio::time::Instant::now() + wait;
        let (code, issuer) = loop {
            let accepted = tokio::time::timeout_at(deadline, self.listener.socket.accept()).await;
            let Ok(Ok((mut stream, _))) = accepted else { return Err(SignInError::TimedOut(wait.as_secs())) };
            // One deadline for the whole request head: a client that trickles bytes holds the
            // listener for 5 s at most.
            let target = tokio::time::timeout(Duration::from_secs(5), read_target(&mut stream)).await.ok().flatten();
            match judge(target.as_deref(), &self.state) {
                Judged::Code { code, issuer } => {
                    respond(&mut stream, 200, "Signed in. You can close this window and return to the terminal.").await;
                    break (code, issuer);
                }
                Judged::Denied { error, description } => {
                    respond(&mut stream, 400, "The sign-in was refused. Postern recorded why; see the terminal.").await;
                    refused(Redirect { why: "the authorization server redirected with an error" });
                    return Err(SignInError::Denied { error, description });
                }
                Judged::Refused(why) => {
                    respond(&mut stream, 400, &format!("Postern did not accept this request: {why}.")).await;
                    refused(Redirect { why });
                }
            }
        };
        // The listener closes here: a second redirect finds nothing listening.
        drop(self.listener);
        // What the authorization server says back may echo what it was sent: the code and the
        // client secret are masked in it, and it is cut short.
        let told = |e: AuthError| {
            let mut text = e.to_string().replace(&code, "<redacted>");
            if let Some(secret) = &self.client_secret {
                text = text.replace(secret.as_str(), "<redacted>");
            }
            SignInError::Exchange(text.chars().take(300).collect())
        };
        let token =
            self.session.handle_callback_with_issuer(&code, &self.state, issuer.as_deref()).await.map_err(told)?;
        let manager = &self.session.auth_manager;
        let (client_id, _) = manager.get_credentials().await.map_err(told)?;
        let metadata = self.metadata;
        let granted = manager.get_current_scopes().await;
        let received = u64::try_from(clock().as_millis() / 1000).unwrap_or_default();
        let credentials = StoredCredentials::new(client_id, Some(token), granted, Some(received))
            .with_issuer(metadata.issuer.clone());
        Ok(Grant {
            credentials,
            metadata,
            client_secret: self.client_secret,
            redirect_uri: self.session.redirect_uri.clone(),
            resource: self.resource,
        })
    }
}

/// What one request to the listener amounts to.
#[derive(Debug, PartialEq, Eq)]
enum Judged {
    Code { code: String, issuer: Option<String> },
    Denied { error: String, description: Option<String> },
    Refused(&'static str),
}

/// Judges a request's target (`/callback?…`) against the sign-in's `state`.
fn judge(target: Option<&str>, state: &str) -> Judged {
    let Some(target) = target else { return Judged::Refused("not an HTTP GET request") };
    let Ok(url) = url::Url::parse(&format!("http://127.0.0.1{target}")) else {
        return Judged::Refused("its path does not parse");
    };
    if url.path() != "/callback" {
        return Judged::Refused("it is not the sign-in's redirect path");
    }
    let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (k, v) in url.query_pairs() {
        seen.entry(k.into_owned()).or_default().push(v.into_owned());
    }
    let one = |k: &str| match seen.get(k).map(Vec::as_slice) {
        Some([v]) => Ok(Some(v.clone())),
        Some(_) => Err(()),
        None => Ok(None),
    };
    let (Ok(got_state), Ok(code), Ok(error), Ok(issuer)) = (one("state"), one("code"), one("error"), one("iss")) else {
        return Judged::Refused("a parameter is repeated");
    };
    if got_state.as_deref() != Some(state) {
        return Judged::Refused("its state is not this sign-in's (a stale or forged redirect)");
    }
    match (code, error) {
        (_, Some(error)) => Judged::Denied { error, description: one("error_description").ok().flatten() },
        (Some(code), None) if !code.is_empty() => Judged::Code { code, issuer },
        _ => Judged::Refused("it carries no code"),
    }
}

/// The request target of a GET, read from at most 8 KiB of the request head.
async fn read_target(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = vec![0u8; 8192];
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buf[filled..]).await.ok()?;
        if n == 0 {
            return None;
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(_)) => {
                return (request.method == Some("GET")).then(|| request.path.map(str::to_owned)).flatten();
            }
            Ok(httparse::Status::Partial) if filled < buf.len() => continue,
            _ => return None,
        }
    }
}

async fn respond(stream: &mut tokio::net::TcpStream, status: u16, text: &str) {
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    let body = format!(
        "<!doctype html><meta charset=utf-8><title>Postern</title><p>{}</p>",
        text.replace('&', "&amp;").replace('<', "&lt;")
    );
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\n\
         cache-control: no-store\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_the_right_state_with_one_code_completes_the_sign_in() {
        let code = |t: &str| judge(Some(t), "s1");
        assert_eq!(code("/callback?code=c&state=s1"), Judged::Code { code: "c".into(), issuer: None });
        assert_eq!(
            code("/callback?code=c&state=s1&iss=https%3A%2F%2Fas"),
            Judged::Code { code: "c".into(), issuer: Some("https://as".into()) }
        );
        assert!(matches!(code("/callback?code=c&state=s2"), Judged::Refused(_)));
        assert!(matches!(code("/callback?code=c"), Judged::Refused(_)));
        assert!(matches!(code("/callback?code=c&state=s1&state=s2"), Judged::Refused(_)));
        assert!(matches!(code("/callback?code=c&code=d&state=s1"), Judged::Refused(_)));
        assert!(matches!(code("/other?code=c&state=s1"), Judged::Refused(_)));
        assert!(matches!(code("/callback?state=s1"), Judged::Refused(_)));
        assert!(matches!(judge(None, "s1"), Judged::Refused(_)));
        assert_eq!(
            code("/callback?error=access_denied&state=s1"),
            Judged::Denied { error: "access_denied".into(), description: None }
        );
        // An error with the wrong state is someone else's: it does not end this sign-in.
        assert!(matches!(code("/callback?error=access_denied&state=x"), Judged::Refused(_)));
    }

    #[test]
    fn endpoints_that_would_carry_a_code_or_a_token_in_clear_or_off_the_web_are_refused() {
        let metadata = |authorize: &str, token: &str, issuer: Option<&str>| {
            serde_json::from_value::<AuthorizationMetadata>(serde_json::json!({
                "authorization_endpoint": authorize, "token_endpoint": token, "issuer": issuer,
            }))
            .unwrap()
        };
        let ok = metadata("https://as.example/authorize", "https://as.example/token", Some("https://as.example"));
        assert!(checked_endpoints(&ok).is_ok());
        let local = metadata("http://127.0.0.1:9/authorize", "http://127.0.0.1:9/token", Some("http://127.0.0.1:9"));
        assert!(checked_endpoints(&local).is_ok(), "http to loopback is a test server's");
        for (authorize, token, issuer) in [
            ("http://as.example/authorize", "https://as.example/token", Some("https://as.example")),
            ("https://as.example/authorize", "http://as.example/token", Some("https://as.example")),
            ("file:///etc/passwd", "https://as.example/token", Some("https://as.example")),
            ("x-handler://127.0.0.1/authorize", "https://as.example/token", Some("https://as.example")),
            ("https://169.254.169.254/authorize", "https://as.example/token", Some("https://as.example")),
            ("https://as.example/authorize", "https://as.example/token", None),
        ] {
            assert!(checked_endpoints(&metadata(authorize, token, issuer)).is_err(), "{authorize} {token} {issuer:?}");
        }
    }

    proptest! {
        /// Whatever a hostile page sends to the listener, only a request carrying the sign-in's
        /// own state can complete or end it.
        #[test]
        fn a_request_without_the_state_never_completes_or_ends_the_sign_in(target in "/[ -~]{0,80}") {
            let judged = judge(Some(&target), "the-state-8f2a");
            if !target.contains("the-state-8f2a") {
                prop_assert!(matches!(judged, Judged::Refused(_)), "{target} → {judged:?}");
            }
        }
    }
}
