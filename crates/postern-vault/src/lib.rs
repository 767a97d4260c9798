//! Postern's vault: the only crate that touches the OS keychain.
//!
//! Secrets (credential values, the fingerprint key, the journal-signing key) live only in the
//! keychain; their non-secret metadata and the lock state live in the store, where every change
//! is journaled. A locked vault hands out no secret at all.

mod checkpoint;
mod credential;
mod error;
mod keychain;
mod mcp_server;
pub mod note;
mod oauth;
mod sensitive;
mod ssh_host;

pub use checkpoint::{SignatureProblem, Signed, verify_checkpoint_signature};
pub use credential::{Binding, Credential, CredentialKind};
pub use error::{HEADLESS_RECIPE, VaultError};
pub use keychain::{MemoryKeychain, OsKeychain, SERVICE, SecretStore};
pub use mcp_server::{
    KIND as MCP_SERVER_KIND, MAX_SERVER_NAME, McpServer, OAuthSettings, SecretArg, ServerStart, ToolOverride,
};
pub use sensitive::Sensitive;
pub use ssh_host::{DEFAULT_MARKER_ROOT, HostKeyPolicy, KIND as SSH_HOST_KIND, SshHost};

use postern_core::{FingerprintKey, Timestamp};
use postern_store::Store;
use serde_json::json;
use std::sync::Arc;

/// The bytes of files Postern rewrote (agent configs holding plaintext tokens), kept as keychain
/// items of one installation so a rewrite can be undone without the secrets being on disk again.
/// Reachable without the journal (beside a running gateway), from the installation's id.
#[derive(Clone)]
pub struct FileBackups {
    keychain: Arc<dyn SecretStore>,
    installation: String,
}

impl std::fmt::Debug for FileBackups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBackups").field("installation", &self.installation).finish_non_exhaustive()
    }
}

impl FileBackups {
    /// The backups of the installation `installation` (its id, as the journal holds it).
    pub fn new(keychain: Arc<dyn SecretStore>, installation: String) -> Self {
        FileBackups { keychain, installation }
    }

    fn item(&self, key: &str) -> String {
        format!("{}/backup/{key}", self.installation)
    }

    pub fn keep(&self, key: &str, bytes: &[u8]) -> Result<(), VaultError> {
        self.keychain.set(&self.item(key), bytes)
    }

    pub fn get(&self, key: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError> {
        self.keychain.get(&self.item(key))
    }

    pub fn drop_backup(&self, key: &str) -> Result<(), VaultError> {
        self.keychain.delete(&self.item(key)).map(|_| ())
    }
}

/// The vault of one installation (one data directory).
#[derive(Debug)]
pub struct Vault {
    store: Arc<Store>,
    keychain: keychain::VaultKeychain,
    installation: String,
    /// Held by every add, removal and spec change from its first read of a name to its last
    /// keychain write: two adds of one name cannot both write its items (the loser deleting the
    /// winner's), a removal cannot delete the items of an entry added again meanwhile, and a
    /// spec change cannot write a removed entry's spec onto its successor.
    names: std::sync::Mutex<()>,
    /// Secrets read from the keychain since the vault was last unlocked, so the hot path makes
    /// no D-Bus round trip: dropped (and zeroized) on lock, idle lock, and whenever a credential
    /// or SSH host is added, removed or changed.
    cache: std::sync::Mutex<SecretCache>,
}

/// Keychain items as read, by item name, valid for one [`Store::vault_epoch`] and one count of
/// the vault's own keychain writes (see [`Vault::epoch`]).
#[derive(Default)]
struct SecretCache {
    epoch: (u64, u64),
    /// The lock as last read from the journal's tables, valid for the same epoch.
    locked: Option<bool>,
    /// The credentials and SSH hosts (metadata, no secrets) as last read, for the same epoch.
    records: Option<Arc<Vec<postern_store::CredentialRecord>>>,
    /// `None`: the keychain has no such item (an SSH host without a passphrase).
    items: std::collections::HashMap<String, Option<Arc<Sensitive<Vec<u8>>>>>,
}

impl std::fmt::Debug for SecretCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretCache").field("items", &self.items.len()).finish_non_exhaustive()
    }
}

impl Vault {
    /// Opens the vault of the installation whose journal is `store`, creating its id on first use.
    pub fn open(store: Arc<Store>, keychain: Arc<dyn SecretStore>, now: Timestamp) -> Result<Self, VaultError> {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| VaultError::Randomness(e.to_string()))?;
        let candidate =
            format!("inst_{}", ulid::Ulid::from_parts(now.as_millis().max(0) as u64, u128::from_le_bytes(random)));
        let installation = store.installation_id(&candidate, now)?;
        let cache = std::sync::Mutex::new(SecretCache {
            epoch: (store.vault_epoch(), 0),
            locked: None,
            records: None,
            items: Default::default(),
        });
        let keychain = keychain::VaultKeychain::new(keychain);
        Ok(Vault { store, keychain, installation, names: Default::default(), cache })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, SecretCache> {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops every secret kept in memory (each is zeroized as it goes).
    pub fn forget_secrets(&self) {
        self.cache().items.clear();
    }

    /// How many keychain items (secrets, or the absence of one) are kept in memory now.
    pub fn secrets_in_memory(&self) -> usize {
        self.current(self.epoch()).items.len()
    }

    /// Drops now whatever a lock or a credential change since it was kept has made stale,
    /// instead of at the next use.
    pub fn drop_stale(&self) {
        drop(self.current(self.epoch()));
    }

    /// What `get` finds in the cache for the current epoch; else `read` (outside the cache's
    /// lock), kept with `put` only if nothing changed while it was being read.
    fn cached<T: Clone>(
        &self,
        get: impl FnOnce(&SecretCache) -> Option<T>,
        read: impl FnOnce() -> Result<T, VaultError>,
        put: impl FnOnce(&mut SecretCache, T),
    ) -> Result<T, VaultError> {
        let epoch = self.epoch();
        if let Some(found) = get(&self.current(epoch)) {
            return Ok(found);
        }
        let value = read()?;
        let mut cache = self.cache();
        if cache.epoch == epoch && self.epoch() == epoch {
            put(&mut cache, value.clone());
        }
        Ok(value)
    }

    /// A keychain item, from memory if it was read since the last change to the lock or the
    /// credentials, else from the keychain (and then kept).
    fn read_item(&self, item: &str) -> Result<Option<Arc<Sensitive<Vec<u8>>>>, VaultError> {
        self.cached(
            |c| c.items.get(item).cloned(),
            || Ok(self.keychain.get(item)?.map(Arc::new)),
            |c, read| {
                c.items.insert(item.to_owned(), read);
            },
        )
    }

    fn item(&self, name: &str) -> String {
        format!("{}/{name}", self.installation)
    }

    pub fn installation_id(&self) -> &str {
        &self.installation
    }

    /// Is the vault locked? Read from the journal's tables once per change of the lock (every
    /// lock and unlock goes through this process's store, which bumps the epoch), so the hot
    /// path does not query the database for it on every call.
    pub fn is_locked(&self) -> Result<bool, VaultError> {
        self.cached(|c| c.locked, || Ok(self.store.view().locked()?), |c, locked| c.locked = Some(locked))
    }

    /// The cache, emptied first if the lock or the credentials changed since it was filled.
    /// What the kept secrets are valid for: the store's vault epoch (the lock and the credentials'
    /// rows) and the count of this vault's keychain writes.
    fn epoch(&self) -> (u64, u64) {
        (self.store.vault_epoch(), self.keychain.writes())
    }

    fn names(&self) -> std::sync::MutexGuard<'_, ()> {
        self.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn current(&self, epoch: (u64, u64)) -> std::sync::MutexGuard<'_, SecretCache> {
        let mut cache = self.cache();
        if cache.epoch != epoch {
            cache.items.clear();
            cache.locked = None;
            cache.records = None;
            cache.epoch = epoch;
        }
        cache
    }

    /// The credentials table (metadata only), read once per epoch: every call resolves its
    /// credential or SSH host here.
    fn records(&self) -> Result<Arc<Vec<postern_store::CredentialRecord>>, VaultError> {
        self.cached(
            |c| c.records.clone(),
            || Ok(Arc::new(self.store.view().credentials()?)),
            |c, records| c.records = Some(records),
        )
    }

    /// Locks the vault: every later action is denied until it is unlocked, and the secrets
    /// kept in memory are dropped.
    pub fn lock(&self, by: &str, now: Timestamp) -> Result<(), VaultError> {
        let locked = self.store.set_locked(true, json!({ "by": by }), now);
        self.forget_secrets();
        locked?;
        Ok(())
    }

    pub fn unlock(&self, by: &str, now: Timestamp) -> Result<(), VaultError> {
        self.store.set_locked(false, json!({ "by": by }), now)?;
        Ok(())
    }

    /// Stores `secret` in the keychain, then the metadata in the journal. If recording the
    /// metadata fails, the keychain item is removed again.
    pub fn add_credential(
        &self,
        credential: &Credential,
        secret: &Sensitive<String>,
        now: Timestamp,
    ) -> Result<(), VaultError> {
        credential.validate()?;
        if secret.expose().is_empty() {
            return Err(VaultError::EmptySecret);
        }
        let _names = self.names();
        if self.records()?.iter().any(|c| c.name == credential.name) {
            return Err(VaultError::DuplicateCredential(credential.name.clone()));
        }
        let item = self.item(&format!("credential/{}", credential.name));
        self.keychain.set(&item, secret.expose().as_bytes())?;
        if let Err(e) = self.store.put_credential(credential.to_record(now.as_millis()), now) {
            let _ = self.keychain.delete(&item);
            return Err(match e {
                postern_store::StoreError::DuplicateCredential(n) => VaultError::DuplicateCredential(n),
                other => other.into(),
            });
        }
        Ok(())
    }

    /// Removes the metadata (journaled) and the keychain item.
    pub fn remove_credential(&self, name: &str, now: Timestamp) -> Result<(), VaultError> {
        let _names = self.names();
        self.store.remove_credential(name, now).map_err(|e| match e {
            postern_store::StoreError::UnknownCredential(n) => VaultError::UnknownCredential(n),
            other => other.into(),
        })?;
        let deleted = self.keychain.delete(&self.item(&format!("credential/{name}")));
        self.forget_secrets();
        deleted?;
        Ok(())
    }

    pub fn credentials(&self) -> Result<Vec<Credential>, VaultError> {
        self.records()?
            .iter()
            .filter(|r| r.kind != ssh_host::KIND && r.kind != mcp_server::KIND)
            .map(Credential::from_record)
            .collect()
    }

    /// Stores the private key (and its passphrase) in the keychain, then the host's metadata in
    /// the journal. The key is kept exactly as given — an encrypted key stays encrypted, its
    /// passphrase a keychain item of its own; neither is ever written to disk in clear.
    pub fn add_ssh_host(
        &self,
        host: &SshHost,
        private_key: &Sensitive<String>,
        passphrase: Option<&Sensitive<String>>,
        now: Timestamp,
    ) -> Result<(), VaultError> {
        host.validate()?;
        if private_key.expose().trim().is_empty() {
            return Err(VaultError::EmptySecret);
        }
        let _names = self.names();
        if self.store.view().credentials()?.iter().any(|c| c.name == host.name) {
            return Err(VaultError::DuplicateCredential(host.name.clone()));
        }
        let (key_item, pass_item) = self.ssh_items(&host.name);
        self.keychain.set(&key_item, private_key.expose().as_bytes())?;
        if let Some(p) = passphrase {
            self.keychain.set(&pass_item, p.expose().as_bytes())?;
        }
        if let Err(e) = self.store.put_credential(host.to_record(now.as_millis()), now) {
            let _ = self.keychain.delete(&key_item);
            let _ = self.keychain.delete(&pass_item);
            return Err(match e {
                postern_store::StoreError::DuplicateCredential(n) => VaultError::DuplicateCredential(n),
                other => other.into(),
            });
        }
        Ok(())
    }

    /// Stores each secret environment value in the keychain, then the server's metadata in the
    /// journal (no secret value ever reaches it). If recording fails, the items are removed.
    pub fn add_mcp_server(
        &self,
        server: &McpServer,
        secrets: &[(String, Sensitive<String>)],
        now: Timestamp,
    ) -> Result<(), VaultError> {
        server.validate()?;
        let named: Vec<&str> = secrets.iter().map(|(k, _)| k.as_str()).collect();
        let declared = server.secret_names();
        if named.len() != declared.len() || declared.iter().any(|k| !named.contains(k)) {
            return Err(VaultError::InvalidCredential(format!(
                "server {:?} declares the secrets {declared:?}; exactly those must be given",
                server.name
            )));
        }
        if let Some((k, _)) = secrets.iter().find(|(_, v)| v.expose().is_empty()) {
            return Err(VaultError::InvalidCredential(format!("the secret value of {k:?} is empty")));
        }
        let _names = self.names();
        if self.store.view().credentials()?.iter().any(|c| c.name == server.name) {
            return Err(VaultError::DuplicateCredential(server.name.clone()));
        }
        if server.oauth.is_some() {
            // A grant left by an earlier server of this name is not this server's.
            self.forget_oauth_grant(&server.name)?;
        }
        for (k, v) in secrets {
            self.keychain.set(&self.server_item(server, k), v.expose().as_bytes())?;
        }
        if let Err(e) = self.store.put_credential(server.to_record(now.as_millis()), now) {
            for (k, _) in secrets {
                let _ = self.keychain.delete(&self.server_item(server, k));
            }
            return Err(match e {
                postern_store::StoreError::DuplicateCredential(n) => VaultError::DuplicateCredential(n),
                other => other.into(),
            });
        }
        Ok(())
    }

    /// The keychain item of one of a server's secrets: an environment value
    /// (`mcp/<server>/env/<KEY>`) or an argument (`mcp/<server>/arg/<NAME>`).
    fn server_item(&self, server: &McpServer, key: &str) -> String {
        let kind = if server.secret_env.iter().any(|k| k == key) { "env" } else { "arg" };
        self.item(&format!("mcp/{}/{kind}/{key}", server.name))
    }

    pub fn mcp_servers(&self) -> Result<Vec<McpServer>, VaultError> {
        self.records()?.iter().filter(|r| r.kind == mcp_server::KIND).map(McpServer::from_record).collect()
    }

    pub fn mcp_server(&self, name: &str) -> Result<McpServer, VaultError> {
        self.mcp_servers()?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| VaultError::UnknownMcpServer(name.into()))
    }

    /// The server's secrets (environment values, then arguments, by name), to start its process.
    /// Refused while locked.
    pub fn mcp_server_secrets(&self, server: &McpServer) -> Result<Vec<(String, Sensitive<String>)>, VaultError> {
        if self.is_locked()? {
            return Err(VaultError::Locked);
        }
        server
            .secret_names()
            .into_iter()
            .map(|k| {
                let item = self.server_item(server, k);
                let bytes =
                    self.read_item(&item)?.ok_or_else(|| VaultError::MissingSecret(format!("{}/{k}", server.name)))?;
                let text = String::from_utf8(bytes.expose().clone())
                    .map_err(|_| VaultError::CorruptKey { item: item.clone(), detail: "not UTF-8".into() })?;
                Ok((k.to_owned(), Sensitive::new(text)))
            })
            .collect()
    }

    /// Sets (or, with `None`, clears) the owner's contract for one of a server's tools,
    /// journaled as `mcp_tool_contract_set` with the server's new spec.
    pub fn set_mcp_tool_contract(
        &self,
        server: &str,
        tool: &str,
        contract: Option<ToolOverride>,
        now: Timestamp,
    ) -> Result<McpServer, VaultError> {
        let _names = self.names();
        let mut s = self.mcp_server(server)?;
        match contract.filter(|c| !c.is_empty()) {
            Some(c) => s.tools.insert(tool.to_owned(), c),
            None => s.tools.remove(tool),
        };
        s.validate()?;
        let detail = json!({ "tool": tool, "contract": s.tools.get(tool) });
        self.store.update_credential_spec(
            server,
            s.spec(),
            postern_store::SpecChange::McpToolContractSet,
            detail,
            now,
        )?;
        Ok(s)
    }

    /// Sets when a server's process starts, journaled as `mcp_server_start_set`.
    pub fn set_mcp_server_start(
        &self,
        server: &str,
        start: ServerStart,
        now: Timestamp,
    ) -> Result<McpServer, VaultError> {
        let _names = self.names();
        let mut s = self.mcp_server(server)?;
        s.start = start;
        self.store.update_credential_spec(
            server,
            s.spec(),
            postern_store::SpecChange::McpServerStartSet,
            json!({ "start": start }),
            now,
        )?;
        Ok(s)
    }

    /// Removes a server's metadata (journaled) and its keychain items.
    pub fn remove_mcp_server(&self, name: &str, now: Timestamp) -> Result<(), VaultError> {
        let _names = self.names();
        let server = self.mcp_server(name)?;
        self.store.remove_credential(name, now)?;
        let mut deleted = if server.oauth.is_some() { self.forget_oauth_grant(name) } else { Ok(()) };
        for k in server.secret_names() {
            if let Err(e) = self.keychain.delete(&self.server_item(&server, k)) {
                deleted = Err(e);
            }
        }
        self.forget_secrets();
        deleted?;
        Ok(())
    }

    /// Keeps the bytes of a file Postern is about to rewrite (an agent config holding plaintext
    /// tokens) as a keychain item, so the rewrite can be undone without the secrets ever being
    /// on disk again. `key` names the backup (not a secret).
    pub fn keep_file_backup(&self, key: &str, bytes: &[u8]) -> Result<(), VaultError> {
        self.file_backups().keep(key, bytes)
    }

    pub fn file_backup(&self, key: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError> {
        self.file_backups().get(key)
    }

    pub fn drop_file_backup(&self, key: &str) -> Result<(), VaultError> {
        self.file_backups().drop_backup(key)
    }

    /// Journals an import of agent configs, or its undo (see `postern_host::import`).
    pub fn journal_import(
        &self,
        event: postern_store::ImportEvent,
        detail: serde_json::Value,
        now: Timestamp,
    ) -> Result<(), VaultError> {
        self.store.import_recorded(event, detail, now)?;
        Ok(())
    }

    /// The journal this vault records into (read side).
    pub fn journal(&self) -> &postern_store::JournalView {
        self.store.view()
    }

    /// This installation's file backups in the keychain.
    pub fn file_backups(&self) -> FileBackups {
        FileBackups { keychain: self.keychain.inner(), installation: self.installation.clone() }
    }

    fn ssh_items(&self, name: &str) -> (String, String) {
        (self.item(&format!("ssh/{name}/key")), self.item(&format!("ssh/{name}/passphrase")))
    }

    pub fn ssh_hosts(&self) -> Result<Vec<SshHost>, VaultError> {
        self.records()?.iter().filter(|r| r.kind == ssh_host::KIND).map(SshHost::from_record).collect()
    }

    pub fn ssh_host(&self, name: &str) -> Result<SshHost, VaultError> {
        self.ssh_hosts()?.into_iter().find(|h| h.name == name).ok_or_else(|| VaultError::UnknownSshHost(name.into()))
    }

    /// The host's private key and passphrase, for the SSH channel. Refused while locked.
    pub fn ssh_key_of(&self, host: &SshHost) -> Result<(Sensitive<String>, Option<Sensitive<String>>), VaultError> {
        if self.is_locked()? {
            return Err(VaultError::Locked);
        }
        let (key_item, pass_item) = self.ssh_items(&host.name);
        let text = |item: &str, bytes: &Sensitive<Vec<u8>>| {
            String::from_utf8(bytes.expose().clone())
                .map(Sensitive::new)
                .map_err(|_| VaultError::CorruptKey { item: item.to_owned(), detail: "not UTF-8".into() })
        };
        let key = self.read_item(&key_item)?.ok_or_else(|| VaultError::MissingSecret(host.name.clone()))?;
        let key = text(&key_item, &key)?;
        let passphrase = self.read_item(&pass_item)?.map(|p| text(&pass_item, &p)).transpose()?;
        Ok((key, passphrase))
    }

    /// Pins the key an `accept-new` host presented, once authentication with it succeeded.
    /// `connected` is the host as it was connected to: if the host was changed since (removed
    /// and added again, or pinned meanwhile), nothing is pinned.
    pub fn pin_host_key(
        &self,
        connected: &SshHost,
        key: &str,
        fingerprint: &str,
        now: Timestamp,
    ) -> Result<SshHost, VaultError> {
        let _names = self.names();
        let name = connected.name.as_str();
        let mut host = self.ssh_host(name)?;
        if host != *connected || host.host_key.is_some() {
            return Err(VaultError::SshHostChanged(name.to_owned()));
        }
        host.host_key = Some(key.to_owned());
        host.host_key_fingerprint = Some(fingerprint.to_owned());
        let detail = json!({ "name": name, "host_key_fingerprint": fingerprint, "policy": host.policy });
        self.store.update_credential_spec(
            name,
            host.spec(),
            postern_store::SpecChange::SshHostKeyPinned,
            detail,
            now,
        )?;
        Ok(host)
    }

    /// Turns "approve every use" on or off for a credential or SSH host.
    pub fn set_approve_every_use(&self, name: &str, on: bool, now: Timestamp) -> Result<(), VaultError> {
        self.store.set_approve_every_use(name, on, now).map_err(|e| match e {
            postern_store::StoreError::UnknownCredential(n) => VaultError::UnknownCredential(n),
            other => other.into(),
        })?;
        Ok(())
    }

    /// Removes an SSH host's metadata (journaled) and its keychain items.
    pub fn remove_ssh_host(&self, name: &str, now: Timestamp) -> Result<(), VaultError> {
        let _names = self.names();
        self.ssh_host(name)?;
        self.store.remove_credential(name, now)?;
        let (key_item, pass_item) = self.ssh_items(name);
        let deleted = self.keychain.delete(&key_item).and_then(|_| self.keychain.delete(&pass_item));
        self.forget_secrets();
        deleted?;
        Ok(())
    }

    pub fn credential(&self, name: &str) -> Result<Credential, VaultError> {
        self.credentials()?
            .into_iter()
            .find(|c| c.name == name)
            .ok_or_else(|| VaultError::UnknownCredential(name.into()))
    }

    /// The secret of a credential, for the channel that injects it. Refused while locked.
    pub fn secret(&self, name: &str) -> Result<Sensitive<String>, VaultError> {
        self.secret_of(&self.credential(name)?)
    }

    /// The secret of a credential the caller has just resolved (no second metadata read on the
    /// dispatch path). Refused while locked.
    pub fn secret_of(&self, credential: &Credential) -> Result<Sensitive<String>, VaultError> {
        if self.is_locked()? {
            return Err(VaultError::Locked);
        }
        let name = &credential.name;
        let bytes = self
            .read_item(&self.item(&format!("credential/{name}")))?
            .ok_or_else(|| VaultError::MissingSecret(name.clone()))?;
        let text = String::from_utf8(bytes.expose().clone())
            .map_err(|_| VaultError::CorruptKey { item: name.clone(), detail: "not UTF-8".into() })?;
        Ok(Sensitive::new(text))
    }

    /// 32 random bytes kept in the keychain under `name`, created on first use.
    fn key_material(&self, name: &str) -> Result<Sensitive<[u8; 32]>, VaultError> {
        let item = self.item(name);
        if let Some(bytes) = self.keychain.get(&item)? {
            let key: [u8; 32] = bytes.expose().as_slice().try_into().map_err(|_| VaultError::CorruptKey {
                item,
                detail: format!("{} bytes, expected 32", bytes.expose().len()),
            })?;
            return Ok(Sensitive::new(key));
        }
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| VaultError::Randomness(e.to_string()))?;
        self.keychain.set(&item, &key)?;
        Ok(Sensitive::new(key))
    }

    /// The installation's fingerprint key (docs/src/design.md, the action record), created on first use.
    pub fn fingerprint_key(&self) -> Result<FingerprintKey, VaultError> {
        Ok(FingerprintKey::from_bytes(*self.key_material("fingerprint-key")?.expose()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A vault on a new journal, its secrets in memory.
    pub(crate) fn vault() -> (tempfile::TempDir, Vault) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = Store::open(&dir.path().join("postern.db"), Timestamp::from_millis(0)).expect("store");
        let vault = Vault::open(Arc::new(store), Arc::new(MemoryKeychain::default()), Timestamp::from_millis(1))
            .expect("vault");
        (dir, vault)
    }

    fn bearer(name: &str) -> Credential {
        Credential {
            name: name.into(),
            kind: CredentialKind::Bearer,
            bindings: vec![Binding::new("api.example", None).expect("b")],
            approve_every_use: false,
            idempotency_header: None,
            reads_have_effects: false,
        }
    }

    /// The owner's tool contracts and start setting live in the server's record: set, cleared
    /// and refused (a contract that cannot hold changes nothing), each change journaled.
    #[test]
    fn a_servers_tool_contracts_and_start_are_owner_settings_on_its_record() {
        let (_dir, v) = vault();
        let server = McpServer { name: "gh".into(), command: "gh-mcp".into(), ..McpServer::default() };
        v.add_mcp_server(&server, &[], Timestamp::from_millis(2)).expect("add");
        let key = ToolOverride {
            class: Some(postern_core::ReplayClass::IdempotencyKey),
            idempotency_argument: Some("requestId".into()),
            ..ToolOverride::default()
        };
        v.set_mcp_tool_contract("gh", "create_issue", Some(key.clone()), Timestamp::from_millis(3)).expect("set");
        assert_eq!(v.mcp_server("gh").expect("gh").tools.get("create_issue"), Some(&key));
        let bad = ToolOverride { class: Some(postern_core::ReplayClass::IdempotencyKey), ..ToolOverride::default() };
        assert!(v.set_mcp_tool_contract("gh", "delete_repo", Some(bad), Timestamp::from_millis(4)).is_err());
        assert_eq!(v.mcp_server("gh").expect("gh").tools.len(), 1, "a refused contract changes nothing");
        v.set_mcp_tool_contract("gh", "create_issue", None, Timestamp::from_millis(5)).expect("clear");
        assert!(v.mcp_server("gh").expect("gh").tools.is_empty());
        v.set_mcp_server_start("gh", ServerStart::OnFirstUse, Timestamp::from_millis(6)).expect("start");
        assert_eq!(v.mcp_server("gh").expect("gh").start, ServerStart::OnFirstUse);
        assert!(matches!(
            v.set_mcp_server_start("nope", ServerStart::OnFirstUse, Timestamp::from_millis(7)),
            Err(VaultError::UnknownMcpServer(_))
        ));
    }

    /// A keychain that counts reads (each is a D-Bus round trip with the OS keychain).
    #[derive(Debug, Default)]
    struct CountingKeychain {
        inner: MemoryKeychain,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl SecretStore for CountingKeychain {
        fn get(&self, item: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.get(item)
        }
        fn set(&self, item: &str, secret: &[u8]) -> Result<(), VaultError> {
            self.inner.set(item, secret)
        }
        fn delete(&self, item: &str) -> Result<bool, VaultError> {
            self.inner.delete(item)
        }
    }

    /// A keychain read that a write through the vault overtook (an OAuth refresh, a rolled-back
    /// add) is not kept: the next use reads the keychain again and sees the write.
    #[test]
    fn a_read_overtaken_by_a_keychain_write_is_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = Store::open(&dir.path().join("postern.db"), Timestamp::from_millis(0)).expect("store");
        let v = Vault::open(Arc::new(store), Arc::new(MemoryKeychain::default()), Timestamp::from_millis(1)).unwrap();
        v.add_credential(&bearer("api"), &Sensitive::new("old".into()), Timestamp::from_millis(2)).expect("add");
        let item = v.item("credential/api");
        let read = v.cached(
            |c| c.items.get(&item).cloned(),
            || {
                let old = v.keychain.get(&item)?.map(Arc::new);
                v.keychain.set(&item, b"new")?;
                Ok(old)
            },
            |c, read| {
                c.items.insert(item.clone(), read);
            },
        );
        assert_eq!(read.unwrap().unwrap().expose().as_slice(), b"old");
        assert_eq!(v.secrets_in_memory(), 0, "the overtaken read is not kept");
        assert_eq!(v.secret("api").expect("secret").expose(), "new");
    }

    /// After unlock a secret is read from the keychain once; lock, removal and a new credential
    /// drop what is kept, so the next read asks the keychain again (and a locked vault hands out
    /// nothing, kept or not).
    #[test]
    fn secrets_are_kept_per_unlock_and_dropped_on_lock_and_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = Store::open(&dir.path().join("postern.db"), Timestamp::from_millis(0)).expect("store");
        let keychain = Arc::new(CountingKeychain::default());
        let v = Vault::open(Arc::new(store), keychain.clone(), Timestamp::from_millis(1)).expect("vault");
        let reads = || keychain.reads.load(std::sync::atomic::Ordering::SeqCst);
        v.add_credential(&bearer("api"), &Sensitive::new("s3cret".into()), Timestamp::from_millis(2)).expect("add");
        let before = reads();
        for _ in 0..5 {
            assert_eq!(v.secret("api").expect("secret").expose(), "s3cret");
        }
        assert_eq!(reads() - before, 1, "one keychain read for five uses");
        assert_eq!(v.secrets_in_memory(), 1);
        // The credentials' metadata is kept per epoch too: a change is seen at once.
        assert!(!v.credential("api").expect("credential").approve_every_use);
        v.set_approve_every_use("api", true, Timestamp::from_millis(2)).expect("flag");
        assert!(v.credential("api").expect("credential").approve_every_use, "the change is seen");
        v.set_approve_every_use("api", false, Timestamp::from_millis(2)).expect("flag");
        v.secret("api").expect("secret");
        let before = reads();

        v.lock("test", Timestamp::from_millis(3)).expect("lock");
        assert_eq!(v.secrets_in_memory(), 0, "lock wipes what is kept");
        assert!(matches!(v.secret("api"), Err(VaultError::Locked)));
        assert_eq!(v.secrets_in_memory(), 0, "nothing is read while locked");
        v.unlock("test", Timestamp::from_millis(4)).expect("unlock");
        assert_eq!(v.secret("api").expect("secret").expose(), "s3cret");
        assert_eq!(reads() - before, 1, "read again after the unlock");

        // A lock that does not go through this vault (the control socket writes the store) is
        // seen at the next use: what was kept is dropped before anything is handed out.
        v.store.set_locked(true, json!({ "by": "control" }), Timestamp::from_millis(5)).expect("lock");
        assert_eq!(v.secrets_in_memory(), 0);
        v.unlock("test", Timestamp::from_millis(6)).expect("unlock");

        v.secret("api").expect("secret");
        v.add_credential(&bearer("other"), &Sensitive::new("x".into()), Timestamp::from_millis(7)).expect("add");
        assert_eq!(v.secrets_in_memory(), 0, "a credential change drops what is kept");
        v.remove_credential("api", Timestamp::from_millis(8)).expect("remove");
        assert!(v.secret("api").is_err(), "a removed credential is gone from memory too");
    }

    #[test]
    fn a_locked_vault_hands_out_no_secret() {
        let (_dir, v) = vault();
        v.add_credential(&bearer("api"), &Sensitive::new("s3cret".into()), Timestamp::from_millis(2)).expect("add");
        assert_eq!(v.secret("api").expect("secret").expose(), "s3cret");
        v.lock("test", Timestamp::from_millis(3)).expect("lock");
        assert!(matches!(v.secret("api"), Err(VaultError::Locked)));
        v.unlock("test", Timestamp::from_millis(4)).expect("unlock");
        assert!(v.secret("api").is_ok());
    }

    #[test]
    fn keys_are_created_once_and_kept() {
        let (_dir, v) = vault();
        let a = v.fingerprint_key().expect("key").fingerprint(b"x");
        let b = v.fingerprint_key().expect("key").fingerprint(b"x");
        assert_eq!(a, b);
        assert_eq!(v.journal_public_key().expect("pk"), v.journal_public_key().expect("pk"));
    }
}
