//! A server's new OAuth grant taken in: checked against the server's URL, kept in the keychain,
//! journaled (`oauth_signed_in`), and the running server reconnected with it. The one place
//! every way of signing in (the control socket, the desktop app) goes through.

use super::*;
use crate::channel::oauth::Grant;
use postern_vault::Sensitive;

/// Keeps `kept` (a [`Grant`] as the keychain keeps it) as server `name`'s grant. `upstreams`:
/// the running gateway's, whose server is reconnected at once.
pub async fn keep_sign_in(
    vault: &Arc<Vault>,
    upstreams: Option<&Upstreams>,
    name: &str,
    kept: Sensitive<String>,
    now: postern_core::Timestamp,
) -> Result<(), UpstreamError> {
    let server = vault.mcp_server(name)?;
    let grant =
        Grant::read(&kept).map_err(|e| UpstreamError::Unavailable { server: name.into(), message: e.to_string() })?;
    if server.url.as_deref() != Some(grant.resource.as_str()) {
        return Err(VaultError::InvalidCredential(format!(
            "the grant was issued for {}, not for {name:?}'s URL; nothing was kept",
            grant.resource
        ))
        .into());
    }
    let summary = grant.summary(name);
    let v = Arc::clone(vault);
    tokio::task::spawn_blocking(move || {
        v.keep_oauth_grant(&server, &kept)?;
        v.journal_oauth(postern_store::OAuthEvent::OAuthSignedIn, summary, now)
    })
    .await
    .map_err(|e| UpstreamError::Unavailable { server: name.into(), message: e.to_string() })??;
    if let Some(u) = upstreams {
        // A sign-in takes effect now: the server reconnects with the new grant.
        let _ = u.restart(name).await;
    }
    Ok(())
}
