//! What a new remote server must satisfy before it is added, whoever adds it (the control
//! socket for the CLI, the desktop app): its URL obeys the HTTP channel's target rules, and the
//! vault credential it names is bound to that URL. One check, so no way of adding skips it.

use postern_vault::{McpServer, Vault, VaultError};

/// Checks `server` (a remote one; a stdio server passes) against the target rules and, when it
/// names a credential, that credential's binding. Nothing is sent anywhere.
pub fn check_remote(vault: &Vault, server: &McpServer) -> Result<(), VaultError> {
    let Some(url) = &server.url else { return Ok(()) };
    let invalid = |m: String| VaultError::InvalidCredential(m);
    let parsed = url::Url::parse(url).map_err(|e| invalid(format!("--url: {e}")))?;
    crate::channel::http::check_target(&parsed).map_err(|e| invalid(format!("--url: {e}")))?;
    if let Some(name) = &server.credential
        && !vault.credential(name)?.allows(&parsed)
    {
        return Err(invalid(format!(
            "credential {name:?} is not bound to {url} (see `postern vault list`); nothing was added"
        )));
    }
    Ok(())
}
