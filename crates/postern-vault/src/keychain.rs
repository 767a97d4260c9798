//! Where secrets live: the OS keychain behind a small trait, so tests of the logic around it can
//! use an in-memory fake while end-to-end tests use the real Secret Service.

use crate::{VaultError, sensitive::Sensitive};
use std::{collections::HashMap, fmt, sync::Mutex};

/// The service name of every keychain item Postern creates; the item's account name carries the
/// installation id, so two data directories never share a secret.
pub const SERVICE: &str = "postern";

pub trait SecretStore: Send + Sync + fmt::Debug {
    fn get(&self, item: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError>;
    fn set(&self, item: &str, secret: &[u8]) -> Result<(), VaultError>;
    /// Returns whether there was an item to delete.
    fn delete(&self, item: &str) -> Result<bool, VaultError>;
}

/// The vault's keychain: every item written or deleted through it moves its count, after the
/// keychain answered, so what the vault kept in memory from before a write is not served after
/// it (whatever called the write: a new credential, a rolled-back one, an OAuth grant).
#[derive(Debug)]
pub(crate) struct VaultKeychain {
    inner: std::sync::Arc<dyn SecretStore>,
    writes: std::sync::atomic::AtomicU64,
}

impl VaultKeychain {
    pub(crate) fn new(inner: std::sync::Arc<dyn SecretStore>) -> Self {
        VaultKeychain { inner, writes: Default::default() }
    }

    /// The keychain itself (for the file backups, whose items the vault never keeps in memory).
    pub(crate) fn inner(&self) -> std::sync::Arc<dyn SecretStore> {
        std::sync::Arc::clone(&self.inner)
    }

    /// How many writes and deletes went through this vault.
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn get(&self, item: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError> {
        self.inner.get(item)
    }

    pub(crate) fn set(&self, item: &str, secret: &[u8]) -> Result<(), VaultError> {
        let set = self.inner.set(item, secret);
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        set
    }

    pub(crate) fn delete(&self, item: &str) -> Result<bool, VaultError> {
        let deleted = self.inner.delete(item);
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        deleted
    }
}

/// The operating system's keychain (Secret Service on Linux).
pub struct OsKeychain {
    store: std::sync::Arc<keyring_core::CredentialStore>,
}

impl fmt::Debug for OsKeychain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OsKeychain")
    }
}

impl OsKeychain {
    /// Connects to the platform keychain. Fails with [`VaultError::KeychainUnavailable`] (and the
    /// headless recipe) when there is none; there is no plaintext fallback.
    pub fn connect() -> Result<Self, VaultError> {
        #[cfg(target_os = "linux")]
        {
            let store = zbus_secret_service_keyring_store::Store::new()
                .map_err(|e| VaultError::KeychainUnavailable { detail: e.to_string() })?;
            let keychain = OsKeychain { store };
            // Connecting succeeds even with no unlocked collection; probe so the user hears it now.
            keychain.get("probe").map_err(|e| match e {
                VaultError::Keychain { detail, .. } => VaultError::KeychainUnavailable { detail },
                other => other,
            })?;
            Ok(keychain)
        }
        #[cfg(not(target_os = "linux"))]
        {
            Err(VaultError::KeychainUnavailable { detail: "only the Linux Secret Service is wired up so far".into() })
        }
    }

    fn entry(&self, item: &str) -> Result<keyring_core::Entry, VaultError> {
        keyring_core::Entry::new_in_store(&self.store, SERVICE, item).map_err(|e| keychain_error(item, &e))
    }
}

fn keychain_error(item: &str, e: &keyring_core::Error) -> VaultError {
    match e {
        keyring_core::Error::NoStorageAccess(_) | keyring_core::Error::NoDefaultStore => {
            VaultError::KeychainUnavailable { detail: e.to_string() }
        }
        _ => VaultError::Keychain { item: item.to_owned(), detail: e.to_string() },
    }
}

impl SecretStore for OsKeychain {
    fn get(&self, item: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError> {
        match self.entry(item)?.get_secret() {
            Ok(bytes) => Ok(Some(Sensitive::new(bytes))),
            Err(keyring_core::Error::NoEntry) => Ok(None),
            Err(e) => Err(keychain_error(item, &e)),
        }
    }

    fn set(&self, item: &str, secret: &[u8]) -> Result<(), VaultError> {
        self.entry(item)?.set_secret(secret).map_err(|e| keychain_error(item, &e))
    }

    fn delete(&self, item: &str) -> Result<bool, VaultError> {
        match self.entry(item)?.delete_credential() {
            Ok(()) => Ok(true),
            Err(keyring_core::Error::NoEntry) => Ok(false),
            Err(e) => Err(keychain_error(item, &e)),
        }
    }
}

/// An in-memory keychain for unit tests of the logic around the keychain.
#[derive(Default)]
pub struct MemoryKeychain {
    items: Mutex<HashMap<String, Vec<u8>>>,
}

impl fmt::Debug for MemoryKeychain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemoryKeychain(<redacted>)")
    }
}

impl SecretStore for MemoryKeychain {
    fn get(&self, item: &str) -> Result<Option<Sensitive<Vec<u8>>>, VaultError> {
        let items =
            self.items.lock().map_err(|_| VaultError::Keychain { item: item.into(), detail: "poisoned".into() })?;
        Ok(items.get(item).cloned().map(Sensitive::new))
    }

    fn set(&self, item: &str, secret: &[u8]) -> Result<(), VaultError> {
        let mut items =
            self.items.lock().map_err(|_| VaultError::Keychain { item: item.into(), detail: "poisoned".into() })?;
        items.insert(item.to_owned(), secret.to_vec());
        Ok(())
    }

    fn delete(&self, item: &str) -> Result<bool, VaultError> {
        let mut items =
            self.items.lock().map_err(|_| VaultError::Keychain { item: item.into(), detail: "poisoned".into() })?;
        Ok(items.remove(item).is_some())
    }
}
