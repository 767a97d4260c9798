//! What can go wrong in the vault, each with a code the CLI, the app and MCP results can use.

use postern_core::ErrorCode;

/// How to get a Secret Service on a headless Linux machine; shown whenever none is reachable.
pub const HEADLESS_RECIPE: &str = "Postern keeps secrets only in the OS keychain and never falls back to a file. \
On a Linux desktop, make sure a Secret Service provider is running (GNOME Keyring or KeePassXC). \
Headless: dbus-run-session -- sh -c 'printf %s \"$KEYRING_PASSWORD\" | gnome-keyring-daemon --unlock --components=secrets; postern ...' \
(see docs/src/guide/vault.md: \"Linux without a desktop\")";

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("the OS keychain is not available ({detail}). {HEADLESS_RECIPE}")]
    KeychainUnavailable { detail: String },
    #[error("the OS keychain refused the operation on {item:?}: {detail}")]
    Keychain { item: String, detail: String },
    #[error("the vault is locked; run `postern vault unlock` to allow actions again")]
    Locked,
    #[error("no credential named {0:?} (see `postern vault list`)")]
    UnknownCredential(String),
    #[error("no SSH host named {0:?} (see `postern vault list`; add one with `postern vault add-ssh`)")]
    UnknownSshHost(String),
    #[error("no MCP server named {0:?} (see `postern servers list`; add one with `postern servers add`)")]
    UnknownMcpServer(String),
    #[error("the keychain has no secret for credential {0:?}; remove it and add it again")]
    MissingSecret(String),
    #[error("a credential named {0:?} already exists; remove it first")]
    DuplicateCredential(String),
    #[error("SSH host {0:?} was changed while its first key was being pinned; nothing was pinned, call again")]
    SshHostChanged(String),
    #[error("invalid credential: {0}")]
    InvalidCredential(String),
    #[error("the secret is empty")]
    EmptySecret,
    #[error("keychain item {item:?} does not hold a valid key ({detail})")]
    CorruptKey { item: String, detail: String },
    #[error("no randomness from the operating system: {0}")]
    Randomness(String),
    #[error(transparent)]
    Store(#[from] postern_store::StoreError),
}

impl ErrorCode for VaultError {
    fn code(&self) -> &'static str {
        match self {
            VaultError::KeychainUnavailable { .. } => "keychain_unavailable",
            VaultError::Keychain { .. } => "keychain_error",
            VaultError::Locked => "vault_locked",
            VaultError::UnknownCredential(_) => "unknown_credential",
            VaultError::UnknownSshHost(_) => "unknown_ssh_host",
            VaultError::UnknownMcpServer(_) => "unknown_mcp_server",
            VaultError::MissingSecret(_) => "missing_secret",
            VaultError::DuplicateCredential(_) => "duplicate_credential",
            VaultError::SshHostChanged(_) => "ssh_host_changed",
            VaultError::InvalidCredential(_) => "invalid_credential",
            VaultError::EmptySecret => "empty_secret",
            VaultError::CorruptKey { .. } => "corrupt_key",
            VaultError::Randomness(_) => "no_randomness",
            VaultError::Store(e) => e.code(),
        }
    }
}
