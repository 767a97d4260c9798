//! A remote server's OAuth grant: one keychain item per server (`mcp/<server>/oauth`) holding
//! what the sign-in obtained (the tokens, the client, the issuer) as the engine wrote it. The
//! vault does not read it: it keeps it, hands it out while unlocked, and drops it from memory on
//! lock like every kept secret; a refresh replaces it whole, in one keychain write.

use crate::{McpServer, Sensitive, Vault, VaultError};
use postern_core::Timestamp;

impl Vault {
    fn oauth_item(&self, server: &str) -> String {
        self.item(&format!("mcp/{server}/oauth"))
    }

    /// The server's grant, if it signed in. Refused while locked.
    pub fn oauth_grant(&self, server: &McpServer) -> Result<Option<Sensitive<String>>, VaultError> {
        if self.is_locked()? {
            return Err(VaultError::Locked);
        }
        let item = self.oauth_item(&server.name);
        let Some(bytes) = self.read_item(&item)? else { return Ok(None) };
        let text = String::from_utf8(bytes.expose().clone())
            .map_err(|_| VaultError::CorruptKey { item: item.clone(), detail: "not UTF-8".into() })?;
        Ok(Some(Sensitive::new(text)))
    }

    /// Keeps the server's grant (a sign-in, or a refresh's rotated tokens), replacing the one
    /// before in one write: the old refresh token is gone only once the new one is kept.
    pub fn keep_oauth_grant(&self, server: &McpServer, grant: &Sensitive<String>) -> Result<(), VaultError> {
        if self.is_locked()? {
            return Err(VaultError::Locked);
        }
        if server.oauth.is_none() {
            return Err(VaultError::InvalidCredential(format!("server {:?} does not sign in with OAuth", server.name)));
        }
        let item = self.oauth_item(&server.name);
        self.keychain.set(&item, grant.expose().as_bytes())?;
        self.cache().items.remove(&item);
        Ok(())
    }

    /// Forgets the server's grant (sign-out, or the server's removal).
    pub fn forget_oauth_grant(&self, server: &str) -> Result<(), VaultError> {
        let item = self.oauth_item(server);
        self.keychain.delete(&item)?;
        self.cache().items.remove(&item);
        Ok(())
    }

    /// Journals a step of a server's sign-in (`detail`: the server, issuer, scopes, expiry and
    /// client id; never a token).
    pub fn journal_oauth(
        &self,
        event: postern_store::OAuthEvent,
        detail: serde_json::Value,
        now: Timestamp,
    ) -> Result<(), VaultError> {
        self.store.oauth_recorded(event, detail, now)?;
        Ok(())
    }
}
