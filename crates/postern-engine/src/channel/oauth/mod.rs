//! OAuth for remote MCP servers (the MCP authorization spec): the sign-in that obtains a grant,
//! the grant kept as one keychain item, and the token source a server's connection asks for an
//! access token on every request. rmcp's OAuth client does discovery, registration, PKCE, the
//! code exchange (with RFC 9207 `iss`) and the refresh; this module gives it Postern's keychain
//! as its credential store, makes a refresh single-flight per server, and never lets a token
//! reach a log, an error or the journal.

mod signin;

pub use signin::{Listener, Offer, Redirect, SignIn, SignInError, offer};

use postern_core::Clock;
use postern_store::OAuthEvent;
use postern_vault::{McpServer, Sensitive, Vault, VaultError};
use rmcp::transport::auth::{AuthError, AuthorizationManager, AuthorizationMetadata, OAuthClientConfig};
use rmcp::transport::{CredentialStore, StoredCredentials};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

/// What a sign-in obtained, as the keychain keeps it: the tokens (rmcp's record, with the time
/// they were received, so an expiry survives a restart), the client, and the authorization
/// server's metadata, so a refresh goes to the issuer that granted them and nowhere else.
#[derive(Clone, Serialize, Deserialize)]
pub struct Grant {
    pub credentials: StoredCredentials,
    pub metadata: AuthorizationMetadata,
    /// A confidential client's secret (Dynamic Client Registration may hand one out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    pub redirect_uri: String,
    /// The server URL the tokens were issued for (RFC 8707 `resource`): sent nowhere else.
    pub resource: String,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("client_id", &self.credentials.client_id)
            .field("issuer", &self.credentials.issuer)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

impl Grant {
    /// Reads a kept grant.
    pub fn read(kept: &Sensitive<String>) -> Result<Grant, AuthError> {
        serde_json::from_str(kept.expose()).map_err(|e| {
            AuthError::InternalError(format!("the kept OAuth grant does not read ({})", e.classify_name()))
        })
    }

    /// As the keychain keeps it.
    pub fn to_kept(&self) -> Sensitive<String> {
        Sensitive::new(serde_json::to_string(self).unwrap_or_default())
    }

    /// When the access token expires (seconds since the epoch), if the server said.
    pub fn expires_at(&self) -> Option<u64> {
        use oauth2::TokenResponse as _;
        let expires_in = self.credentials.token_response.as_ref()?.expires_in()?;
        Some(self.credentials.token_received_at? + expires_in.as_secs())
    }

    pub fn issuer(&self) -> Option<&str> {
        self.credentials.issuer.as_deref().or(self.metadata.issuer.as_deref())
    }

    /// What the journal and `servers list` may say about it: never a token or a secret.
    pub fn summary(&self, server: &str) -> Value {
        json!({
            "server": server,
            "issuer": self.issuer(),
            "scopes": self.credentials.granted_scopes,
            "expires_at": self.expires_at(),
            "client_id": self.credentials.client_id,
            "resource": self.resource,
        })
    }
}

trait Classify {
    fn classify_name(&self) -> &'static str;
}

impl Classify for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "I/O",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "a field is missing or of the wrong type",
            serde_json::error::Category::Eof => "cut short",
        }
    }
}

/// Where a server's sign-in stands, read from the journal (no keychain read, so it works beside
/// a running gateway and while the vault is locked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Standing {
    /// `not_signed_in`, `signed_in`, `sign_in_needed` or `signed_out`.
    pub state: &'static str,
    /// The same in words, with what to run.
    pub said: String,
    /// The journal row it was read from.
    pub seq: Option<u64>,
}

/// Where server `name`'s sign-in stands: its newest `oauth_*` row that says so.
pub fn standing(view: &postern_store::JournalView, name: &str) -> Result<Standing, postern_store::StoreError> {
    use postern_store::{Event, VaultEvent as V};
    let row = view.last_oauth_event(name)?;
    let login = format!("run `postern servers login {name}`");
    let (state, said) = match row.as_ref().map(|e| (e.row.event, &e.row.detail)) {
        None => ("not_signed_in", format!("not signed in: {login}")),
        Some((Event::Vault(V::OAuthSignedIn | V::OAuthRefreshed), d)) => {
            let until = d["expires_at"].as_u64().map(|at| {
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(at))
                    .to_string()
            });
            let said = match until {
                Some(at) => format!("signed in (token until {at}, refreshed as needed)"),
                None => "signed in".to_owned(),
            };
            ("signed_in", said)
        }
        Some((Event::Vault(V::OAuthRefreshFailed), _)) => ("sign_in_needed", format!("sign-in needed: {login}")),
        Some(_) => ("signed_out", format!("signed out: {login} to sign in")),
    };
    Ok(Standing { state, said, seq: row.map(|e| e.row.seq) })
}

/// The tokens of `server`'s grant, as secrets the outcome stage masks in whatever the server
/// sends back (empty when it has none, or the vault is locked).
pub fn grant_secrets(vault: &Vault, server: &McpServer) -> crate::catalog::redaction::CallSecrets {
    use oauth2::TokenResponse as _;
    let mut secrets = crate::catalog::redaction::CallSecrets::default();
    if server.oauth.is_none() {
        return secrets;
    }
    let Ok(Some(kept)) = vault.oauth_grant(server) else { return secrets };
    let Ok(grant) = Grant::read(&kept) else { return secrets };
    if let Some(tokens) = &grant.credentials.token_response {
        secrets.add_vault_secret(tokens.access_token().secret());
        if let Some(refresh) = tokens.refresh_token() {
            secrets.add_vault_secret(refresh.secret());
        }
    }
    if let Some(secret) = &grant.client_secret {
        secrets.add_vault_secret(secret);
    }
    secrets
}

/// Revokes the grant's refresh token (and with it, at most servers, its access tokens) where
/// the authorization server offers RFC 7009 revocation: `Ok(true)` when it accepted,
/// `Ok(false)` when it offers none. The error never holds a token.
pub async fn revoke(grant: &Grant) -> Result<bool, String> {
    use oauth2::TokenResponse as _;
    let Some(endpoint) = grant.metadata.additional_fields.get("revocation_endpoint").and_then(Value::as_str) else {
        return Ok(false);
    };
    // The refresh token goes only where the HTTP channel's target rules allow.
    let parsed = url::Url::parse(endpoint).map_err(|e| format!("the revocation endpoint does not parse: {e}"))?;
    if !matches!(parsed.scheme(), "https" | "http") {
        return Err("the revocation endpoint is not http(s)".into());
    }
    crate::channel::http::check_target(&parsed).map_err(|e| format!("the revocation endpoint: {e}"))?;
    let Some(tokens) = &grant.credentials.token_response else { return Ok(false) };
    let (token, hint) = match tokens.refresh_token() {
        Some(r) => (r.secret().clone(), "refresh_token"),
        None => (tokens.access_token().secret().clone(), "access_token"),
    };
    let token = Sensitive::new(token);
    let send = |empty_secret: bool| {
        let mut form = vec![("token", token.expose().as_str()), ("token_type_hint", hint)];
        form.push(("client_id", grant.credentials.client_id.as_str()));
        match &grant.client_secret {
            Some(secret) => form.push(("client_secret", secret.as_str())),
            None if empty_secret => form.push(("client_secret", "")),
            None => {}
        }
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(&form).finish();
        crate::channel::http::client()
            .post(endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .timeout(std::time::Duration::from_secs(15))
            .send()
    };
    let failed = |e: reqwest::Error| format!("the revocation endpoint did not answer ({})", e.without_url());
    let mut answer = send(false).await.map_err(failed)?;
    // A public client sends no secret (RFC 7009 §2.1). The Python SDK's endpoint refuses a form
    // without the field (HTTP 400), and takes it empty: asked once more so, for such servers.
    if answer.status() == reqwest::StatusCode::BAD_REQUEST && grant.client_secret.is_none() {
        answer = send(true).await.map_err(failed)?;
    }
    match answer.status() {
        s if s.is_success() => Ok(true),
        s => Err(format!("the revocation endpoint answered HTTP {}", s.as_u16())),
    }
}

/// rmcp's credential store over the server's keychain item: what a refresh rotates is kept in
/// one write before the old token is dropped.
struct KeychainStore {
    vault: Arc<Vault>,
    server: McpServer,
    clock: Clock,
}

fn vault_error(e: VaultError) -> AuthError {
    AuthError::CredentialStoreError(format!("the vault: {e}"))
}

impl KeychainStore {
    fn grant(&self) -> Result<Option<Grant>, AuthError> {
        match self.vault.oauth_grant(&self.server).map_err(vault_error)? {
            Some(kept) => Grant::read(&kept).map(Some),
            None => Ok(None),
        }
    }
}

#[async_trait::async_trait]
impl CredentialStore for KeychainStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self.grant()?.map(|g| g.credentials))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let Some(grant) = self.grant()? else { return Err(AuthError::AuthorizationRequired) };
        // A sign-in made while this refresh ran replaced the grant (another client, perhaps):
        // the refresh's tokens belong to the old one and are not written over the new.
        if grant.credentials.client_id != credentials.client_id {
            tracing::info!(server = %self.server.name, "a refresh finished after a new sign-in; its tokens were dropped");
            return Ok(());
        }
        let grant = Grant { credentials, ..grant };
        self.vault.keep_oauth_grant(&self.server, &grant.to_kept()).map_err(vault_error)?;
        // Only a refresh saves through this store (a sign-in's tokens arrive over the control
        // socket): the journal says when the server's tokens were renewed, never what they are.
        let row =
            self.vault.journal_oauth(OAuthEvent::OAuthRefreshed, grant.summary(&self.server.name), (self.clock)());
        if let Err(e) = row {
            tracing::warn!(server = %self.server.name, error = %e, "a refresh could not be journaled");
        }
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.vault.forget_oauth_grant(&self.server.name).map_err(vault_error)
    }
}

/// Where a connection to a remote server gets its access token: one per running server. Every
/// refresh is made under one lock, and a caller that waited for it takes the token the refresh
/// obtained instead of refreshing again (rmcp's own guard serialises refreshes but would make
/// each waiter refresh once more).
pub struct TokenSource {
    manager: AuthorizationManager,
    turn: tokio::sync::Mutex<()>,
    server: String,
    vault: Arc<Vault>,
    clock: Clock,
    /// A refresh failed and nothing has succeeded since (journaled once, not per call).
    failed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource").field("server", &self.server).finish_non_exhaustive()
    }
}

/// The words every [`SignInNeeded`] says (a failed start is kept as text).
pub const SIGN_IN_NEEDED_PHRASE: &str = "needs a new sign-in";

/// Why a server's calls are refused until the owner signs in again.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{server:?} needs a new sign-in ({why}); the call was not carried out. Run `postern servers login {server}` \
     (oauth_login_required)"
)]
pub struct SignInNeeded {
    pub server: String,
    pub why: String,
}

impl SignInNeeded {
    /// Server `server` has no grant.
    pub fn not_signed_in(server: &str) -> SignInNeeded {
        SignInNeeded { server: server.into(), why: "it has not signed in".into() }
    }
}

impl TokenSource {
    /// The token source of a server that signed in; `Err` when it has no grant.
    pub async fn open(vault: Arc<Vault>, server: &McpServer, clock: Clock) -> Result<TokenSource, SignInNeeded> {
        let needed = |why: String| SignInNeeded { server: server.name.clone(), why };
        let kept = vault.oauth_grant(server).map_err(|e| needed(e.to_string()))?;
        let grant = Grant::read(&kept.ok_or_else(|| needed("it has not signed in".into()))?)
            .map_err(|e| needed(e.to_string()))?;
        // A grant is for the URL it was issued for: a server re-added under the same name with
        // another URL does not get the old tokens.
        if server.url.as_deref() != Some(grant.resource.as_str()) {
            return Err(needed(format!("its grant was issued for {}, not for its URL", grant.resource)));
        }
        crate::channel::http::install_crypto();
        let mut manager =
            AuthorizationManager::new(grant.resource.as_str()).await.map_err(|e| needed(e.to_string()))?;
        manager.set_metadata(grant.metadata.clone());
        let mut config = OAuthClientConfig::new(grant.credentials.client_id.clone(), grant.redirect_uri.clone());
        if let Some(secret) = &grant.client_secret {
            config = config.with_client_secret(secret.clone());
        }
        manager.configure_client(config).map_err(|e| needed(e.to_string()))?;
        manager.set_credential_store(KeychainStore {
            vault: Arc::clone(&vault),
            server: server.clone(),
            clock: Arc::clone(&clock),
        });
        Ok(TokenSource {
            manager,
            turn: tokio::sync::Mutex::new(()),
            server: server.name.clone(),
            vault,
            clock,
            failed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A token obtained: a failure before it is over.
    fn ok(&self, token: String) -> Sensitive<String> {
        self.failed.store(false, std::sync::atomic::Ordering::Relaxed);
        Sensitive::new(token)
    }

    /// Why no token can be had; the first failure in a row is journaled
    /// (`oauth_refresh_failed`), so `servers list` and the app say "sign-in needed".
    fn needed(&self, e: AuthError) -> SignInNeeded {
        // Fixed words only: an authorization server's own error text may echo the form it was
        // sent (the refresh token, the client secret), and this reaches the journal and the agent.
        let why = match e {
            AuthError::AuthorizationRequired => "its refresh token was refused or has expired".to_owned(),
            AuthError::TokenRefreshRejected(_) => "the authorization server refused its refresh token".to_owned(),
            AuthError::TokenRefreshFailed(_) => {
                "the authorization server's token endpoint did not refresh it".to_owned()
            }
            AuthError::CredentialStoreError(text) => text,
            _ => "the OAuth client could not get a token".to_owned(),
        };
        // A locked vault is not a failed refresh: the calls are refused by the ladder anyway.
        let locked = self.vault.is_locked().unwrap_or(true);
        if !locked && !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let detail = json!({ "server": self.server, "why": why });
            if let Err(e) = self.vault.journal_oauth(OAuthEvent::OAuthRefreshFailed, detail, (self.clock)()) {
                tracing::warn!(server = %self.server, error = %e, "a failed refresh could not be journaled");
            }
        }
        tracing::warn!(server = %self.server, %why, "the server needs a new sign-in");
        SignInNeeded { server: self.server.clone(), why }
    }

    /// Why a request refused even with a freshly refreshed token is not sent again.
    pub fn refused_after_refresh(&self) -> SignInNeeded {
        SignInNeeded { server: self.server.clone(), why: "the server refused a freshly refreshed token".into() }
    }

    /// An access token for the next request: the kept one, or a refreshed one when it is about
    /// to expire.
    pub async fn access_token(&self) -> Result<Sensitive<String>, SignInNeeded> {
        let _turn = self.turn.lock().await;
        self.manager.get_access_token().await.map(|t| self.ok(t)).map_err(|e| self.needed(e))
    }

    /// A token to replace `rejected`, which the server answered 401: the one another caller's
    /// refresh already obtained, else a refresh now.
    pub async fn after_rejection(&self, rejected: &Sensitive<String>) -> Result<Sensitive<String>, SignInNeeded> {
        let _turn = self.turn.lock().await;
        let current = self.manager.get_access_token().await.map_err(|e| self.needed(e))?;
        if current != *rejected.expose() {
            return Ok(Sensitive::new(current));
        }
        match self.manager.refresh_token().await {
            Ok(_) => self.manager.get_access_token().await.map(|t| self.ok(t)).map_err(|e| self.needed(e)),
            Err(e) => Err(self.needed(e)),
        }
    }
}
