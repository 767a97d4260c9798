//! SSH hosts: where an SSH command may go, as whom, and which host key it must present. The
//! private key (and its passphrase, if it has one) is a keychain item; the metadata is a row of
//! the vault's credentials table (`kind = ssh_host`), journaled like every vault change.

use crate::VaultError;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// When a host key is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostKeyPolicy {
    /// The key must have been pinned when the host was added.
    Strict,
    /// The first key seen is pinned, only after authentication succeeded; later keys must match.
    AcceptNew,
}

impl HostKeyPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            HostKeyPolicy::Strict => "strict",
            HostKeyPolicy::AcceptNew => "accept-new",
        }
    }
}

/// The default directory of execution markers on a host (`sh` expands `$HOME`).
pub const DEFAULT_MARKER_ROOT: &str = "$HOME/.postern/executions";

/// An SSH host's metadata (its private key is in the keychain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshHost {
    pub name: String,
    pub address: String,
    pub port: u16,
    pub account: String,
    pub policy: HostKeyPolicy,
    /// The pinned host key, OpenSSH public-key format (`ssh-ed25519 AAAA…`).
    pub host_key: Option<String>,
    /// SHA-256 fingerprint of the pinned key (`SHA256:…`), as shown to people.
    pub host_key_fingerprint: Option<String>,
    /// Where the marker protocol keeps execution records on the host.
    pub marker_root: String,
    pub approve_every_use: bool,
}

pub const KIND: &str = "ssh_host";

impl SshHost {
    pub fn validate(&self) -> Result<(), VaultError> {
        let invalid = |m: String| Err(VaultError::InvalidCredential(m));
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return invalid(format!(
                "name {:?} must be 1–64 characters of letters, digits, '-', '_' or '.'",
                self.name
            ));
        }
        if self.address.is_empty() || self.address.contains(['/', '@', ' ']) {
            return invalid(format!("{:?} is not a host address (give a name or IP, no user or path)", self.address));
        }
        if self.account.is_empty() || self.account.contains([' ', '@', ':']) {
            return invalid(format!("{:?} is not an account name", self.account));
        }
        if self.policy == HostKeyPolicy::Strict && self.host_key.is_none() {
            return invalid("host-key policy strict needs the host's key (--host-key or --host-key-file)".into());
        }
        // The marker directory goes into a shell script inside double quotes: only `$HOME` may
        // expand, and nothing else that `sh` would interpret.
        let rest = self.marker_root.strip_prefix("$HOME").unwrap_or(&self.marker_root);
        let plain = rest.starts_with('/')
            && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
            && !rest.contains("/../");
        if !plain {
            return invalid(format!(
                "marker directory {:?} must be an absolute path or start with $HOME/, of letters, digits, '.', '_', \
                 '-' and '/'",
                self.marker_root
            ));
        }
        Ok(())
    }

    pub(crate) fn to_record(&self, created_at: i64) -> postern_store::CredentialRecord {
        postern_store::CredentialRecord {
            name: self.name.clone(),
            kind: KIND.into(),
            spec: self.spec(),
            bindings: json!([]),
            approve_every_use: self.approve_every_use,
            created_at,
        }
    }

    pub(crate) fn spec(&self) -> Value {
        json!({
            "address": self.address, "port": self.port, "account": self.account, "policy": self.policy,
            "host_key": self.host_key, "host_key_fingerprint": self.host_key_fingerprint,
            "marker_root": self.marker_root,
        })
    }

    /// Read from a credentials-table row (readers without a vault use it on a read-only view).
    pub fn from_record(r: &postern_store::CredentialRecord) -> Result<Self, VaultError> {
        let corrupt = |what: &str| VaultError::InvalidCredential(format!("stored SSH host {:?}: {what}", r.name));
        let text = |key: &str| r.spec.get(key).and_then(Value::as_str).map(str::to_owned);
        Ok(SshHost {
            name: r.name.clone(),
            address: text("address").ok_or_else(|| corrupt("address"))?,
            port: r
                .spec
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| corrupt("port"))?,
            account: text("account").ok_or_else(|| corrupt("account"))?,
            policy: serde_json::from_value(r.spec["policy"].clone()).map_err(|_| corrupt("policy"))?,
            host_key: text("host_key"),
            host_key_fingerprint: text("host_key_fingerprint"),
            marker_root: text("marker_root").unwrap_or_else(|| DEFAULT_MARKER_ROOT.into()),
            approve_every_use: r.approve_every_use,
        })
    }
}
