//! The control protocol: the typed contract between the CLI (and the app) and a running
//! gateway — every request the socket understands (`ControlRequest`, tagged by `op`), the
//! answers and refusal codes, and `SecretText`, a secret carried by a request.

use postern_vault::{Credential, McpServer, Sensitive, ServerStart, SshHost, ToolOverride, VaultError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A secret carried by a control request (a credential's value, a private key), read by the CLI
/// from a hidden prompt or standard input and sent over the owner-only socket: it prints as
/// `<redacted>` and is wiped when dropped.
pub struct SecretText(pub Sensitive<String>);

impl SecretText {
    pub fn new(text: String) -> Self {
        SecretText(Sensitive::new(text))
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for SecretText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.expose())
    }
}

impl<'de> Deserialize<'de> for SecretText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(SecretText::new)
    }
}

/// One control request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum ControlRequest {
    #[serde(rename = "agents.add")]
    AddAgent { name: String, token_sha256: String },
    #[serde(rename = "agents.revoke")]
    RevokeAgent { name: String },
    #[serde(rename = "vault.lock")]
    LockVault { by: String },
    #[serde(rename = "sessions.revoke")]
    RevokeSession { id: postern_core::SessionId },
    /// Read-only: each upstream MCP server's state (running, stopped, crashed) as the gateway sees it.
    #[serde(rename = "servers.status")]
    ServersStatus,
    /// Stops an upstream MCP server and starts it again.
    #[serde(rename = "servers.restart")]
    RestartServer { name: String },
    /// Read-only: the running gateway (pid, since when, its approver, where it listens).
    #[serde(rename = "gateway.status")]
    GatewayStatus,
    #[serde(rename = "vault.add")]
    AddCredential { credential: Credential, secret: SecretText },
    #[serde(rename = "vault.add_ssh")]
    AddSshHost { host: SshHost, key: SecretText, passphrase: Option<SecretText> },
    /// Removes a credential, an SSH host or an MCP server (and its keychain items).
    #[serde(rename = "vault.remove")]
    Remove { name: String },
    #[serde(rename = "servers.add")]
    AddServer { server: McpServer, secrets: Vec<(String, SecretText)> },
    #[serde(rename = "servers.set")]
    SetServerStart { name: String, start: ServerStart },
    #[serde(rename = "servers.contract")]
    SetToolContract { server: String, tool: String, contract: Option<ToolOverride> },
    /// Read-only: a server's tools as agents see them, each with its contract (started if needed).
    #[serde(rename = "servers.tools")]
    ServerTools { name: String },
    /// A signed checkpoint of the journal's head (the truth about the journal, which anyone may
    /// ask for).
    #[serde(rename = "audit.checkpoint")]
    Checkpoint,
    #[serde(rename = "audit.pubkey")]
    PublicKey,
    /// Removes marker directories older than `older_than_days` (at least 1) on an SSH host, of
    /// executions the journal shows settled only.
    #[serde(rename = "ssh.gc")]
    SshGc { host: String, older_than_days: u32 },
    /// Journals an import of agent configs (`servers import` beside a running gateway) or its undo.
    #[serde(rename = "import.record")]
    RecordImport { event: postern_store::ImportEvent, detail: Value },
    /// Keeps what `servers login` obtained (the grant, as one secret) and journals
    /// `oauth_signed_in`; a running gateway reconnects the server with it.
    #[serde(rename = "servers.signed_in")]
    KeepSignIn { name: String, grant: SecretText },
    /// Forgets a server's OAuth grant, revoking it where the server offers RFC 7009.
    #[serde(rename = "servers.sign_out")]
    SignOut { name: String },
    /// Journals a redirect the sign-in's listener refused (`oauth_redirect_refused`).
    #[serde(rename = "servers.redirect_refused")]
    RedirectRefused { name: String, why: String },
}

/// The operations the control socket offers, by their `op` tag. [`ControlRequest::op`] maps
/// every request to one (an exhaustive match: a new request cannot be left out), and a test
/// checks that the tags agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlOp {
    #[serde(rename = "agents.add")]
    AddAgent,
    #[serde(rename = "agents.revoke")]
    RevokeAgent,
    #[serde(rename = "vault.lock")]
    LockVault,
    #[serde(rename = "sessions.revoke")]
    RevokeSession,
    #[serde(rename = "servers.status")]
    ServersStatus,
    #[serde(rename = "servers.restart")]
    RestartServer,
    #[serde(rename = "gateway.status")]
    GatewayStatus,
    #[serde(rename = "vault.add")]
    AddCredential,
    #[serde(rename = "vault.add_ssh")]
    AddSshHost,
    #[serde(rename = "vault.remove")]
    Remove,
    #[serde(rename = "servers.add")]
    AddServer,
    #[serde(rename = "servers.set")]
    SetServerStart,
    #[serde(rename = "servers.contract")]
    SetToolContract,
    #[serde(rename = "servers.tools")]
    ServerTools,
    #[serde(rename = "audit.checkpoint")]
    Checkpoint,
    #[serde(rename = "audit.pubkey")]
    PublicKey,
    #[serde(rename = "ssh.gc")]
    SshGc,
    #[serde(rename = "import.record")]
    RecordImport,
    #[serde(rename = "servers.signed_in")]
    KeepSignIn,
    #[serde(rename = "servers.sign_out")]
    SignOut,
    #[serde(rename = "servers.redirect_refused")]
    RedirectRefused,
}

impl ControlOp {
    /// Whether `op` names an operation the socket offers.
    pub fn offered(op: &str) -> bool {
        serde_json::from_value::<ControlOp>(serde_json::Value::String(op.to_owned())).is_ok()
    }

    /// Whether it changes the vault or the journal (journaled with its peer when it came over
    /// the socket); the others only read.
    pub fn changes(self) -> bool {
        !matches!(
            self,
            ControlOp::ServersStatus
                | ControlOp::GatewayStatus
                | ControlOp::ServerTools
                | ControlOp::PublicKey
                | ControlOp::RestartServer
        )
    }
}

impl ControlRequest {
    pub fn op(&self) -> ControlOp {
        match self {
            ControlRequest::AddAgent { .. } => ControlOp::AddAgent,
            ControlRequest::RevokeAgent { .. } => ControlOp::RevokeAgent,
            ControlRequest::LockVault { .. } => ControlOp::LockVault,
            ControlRequest::RevokeSession { .. } => ControlOp::RevokeSession,
            ControlRequest::ServersStatus => ControlOp::ServersStatus,
            ControlRequest::RestartServer { .. } => ControlOp::RestartServer,
            ControlRequest::GatewayStatus => ControlOp::GatewayStatus,
            ControlRequest::AddCredential { .. } => ControlOp::AddCredential,
            ControlRequest::AddSshHost { .. } => ControlOp::AddSshHost,
            ControlRequest::Remove { .. } => ControlOp::Remove,
            ControlRequest::AddServer { .. } => ControlOp::AddServer,
            ControlRequest::SetServerStart { .. } => ControlOp::SetServerStart,
            ControlRequest::SetToolContract { .. } => ControlOp::SetToolContract,
            ControlRequest::ServerTools { .. } => ControlOp::ServerTools,
            ControlRequest::Checkpoint => ControlOp::Checkpoint,
            ControlRequest::PublicKey => ControlOp::PublicKey,
            ControlRequest::SshGc { .. } => ControlOp::SshGc,
            ControlRequest::RecordImport { .. } => ControlOp::RecordImport,
            ControlRequest::KeepSignIn { .. } => ControlOp::KeepSignIn,
            ControlRequest::SignOut { .. } => ControlOp::SignOut,
            ControlRequest::RedirectRefused { .. } => ControlOp::RedirectRefused,
        }
    }

    /// Whether carrying it out needs the vault (the OS keychain), not only the journal.
    pub fn needs_vault(&self) -> bool {
        !matches!(
            self.op(),
            ControlOp::AddAgent
                | ControlOp::RevokeAgent
                | ControlOp::LockVault
                | ControlOp::RevokeSession
                | ControlOp::ServersStatus
                | ControlOp::GatewayStatus
                | ControlOp::RecordImport
                | ControlOp::RedirectRefused
        )
    }

    /// What the journal says was asked (names only: never a secret, an environment value or a
    /// command line).
    pub(crate) fn summary(&self) -> Value {
        let name = match self {
            ControlRequest::AddAgent { name, .. }
            | ControlRequest::RevokeAgent { name }
            | ControlRequest::RestartServer { name }
            | ControlRequest::Remove { name }
            | ControlRequest::SetServerStart { name, .. }
            | ControlRequest::ServerTools { name }
            | ControlRequest::KeepSignIn { name, .. }
            | ControlRequest::SignOut { name }
            | ControlRequest::RedirectRefused { name, .. } => Some(name.clone()),
            ControlRequest::AddCredential { credential, .. } => Some(credential.name.clone()),
            ControlRequest::AddSshHost { host, .. } => Some(host.name.clone()),
            ControlRequest::AddServer { server, .. } => Some(server.name.clone()),
            ControlRequest::SetToolContract { server, tool, .. } => Some(format!("{server}__{tool}")),
            ControlRequest::SshGc { host, .. } => Some(host.clone()),
            ControlRequest::RevokeSession { id } => Some(id.to_string()),
            ControlRequest::RecordImport { event, .. } => Some(event.as_str().to_owned()),
            ControlRequest::LockVault { .. }
            | ControlRequest::ServersStatus
            | ControlRequest::GatewayStatus
            | ControlRequest::Checkpoint
            | ControlRequest::PublicKey => None,
        };
        json!({ "op": self.op(), "name": name })
    }
}

/// The running gateway, as `gateway.status` tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayInfo {
    pub pid: u32,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    /// Who answers approvals: `none`, `terminal`, `desktop app`.
    pub approver: String,
    /// Where to unlock the vault of this gateway (the socket never unlocks).
    pub where_to_unlock: String,
    pub socket: String,
    pub http: Option<String>,
    pub version: String,
    /// Vault secrets the gateway keeps in memory now (none while the vault is locked).
    #[serde(default)]
    pub kept_secrets: usize,
}

/// Why a control request was not carried out, for the caller to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlCode {
    /// Not something the socket offers (approvals, unlocking, grants): journaled.
    NotOffered,
    /// Not a well-formed request.
    InvalidRequest,
    UnknownAgent,
    DuplicateAgent,
    UnknownSession,
    SessionRevoked,
    /// The journal cannot take the write (disk full, I/O error, read-only).
    JournalUnwritable,
    /// The request names something that does not exist or cannot be (an unknown credential, a
    /// duplicate name, a contract that cannot hold): the message says what.
    Invalid,
    /// The vault is locked: unlock it in the approver.
    VaultLocked,
    /// A change that weakens safety, asked for by a process inside an agent run: never done.
    FromAnAgentRun,
    /// A change that weakens safety that the approver's person did not confirm.
    NotConfirmed,
    /// The OS keychain is unreachable or refused.
    Keychain,
    /// Anything else; the message says what.
    Failed,
}

impl ControlCode {
    pub(crate) fn of_vault(e: &VaultError) -> ControlCode {
        match e {
            VaultError::Store(e) => ControlCode::of(e),
            VaultError::Locked => ControlCode::VaultLocked,
            VaultError::KeychainUnavailable { .. } | VaultError::Keychain { .. } => ControlCode::Keychain,
            VaultError::UnknownCredential(_)
            | VaultError::UnknownSshHost(_)
            | VaultError::UnknownMcpServer(_)
            | VaultError::DuplicateCredential(_)
            | VaultError::InvalidCredential(_)
            | VaultError::EmptySecret => ControlCode::Invalid,
            _ => ControlCode::Failed,
        }
    }

    pub(crate) fn of(e: &postern_store::StoreError) -> ControlCode {
        use postern_store::StoreError as E;
        match e {
            E::UnknownAgent(_) => ControlCode::UnknownAgent,
            E::DuplicateAgent(_) => ControlCode::DuplicateAgent,
            E::UnknownSession(_) => ControlCode::UnknownSession,
            E::SessionRevoked(_) => ControlCode::SessionRevoked,
            e if e.is_unwritable() => ControlCode::JournalUnwritable,
            _ => ControlCode::Failed,
        }
    }
}

/// The answer: done, or refused with a code and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ControlReply {
    Done,
    Refused {
        code: ControlCode,
        message: String,
    },
    /// The answer to `servers.status`.
    Servers {
        servers: Vec<postern_engine::channel::upstream::ServerStatus>,
    },
    /// The answer to a question (`gateway.status`, `servers.tools`, `audit.checkpoint`, …).
    Answer {
        answer: Value,
    },
}

impl ControlReply {
    pub(crate) fn refused(code: ControlCode, message: impl Into<String>) -> Self {
        ControlReply::Refused { code, message: message.into() }
    }

    pub(crate) fn of_vault(e: &VaultError) -> Self {
        ControlReply::refused(ControlCode::of_vault(e), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each request's `op` tag is the tag of its [`ControlOp`], so the offered list cannot drift
    /// from the requests the socket understands.
    #[test]
    fn every_request_is_offered_under_its_own_tag() {
        let session: postern_core::SessionId = "ses_01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap();
        for request in [
            ControlRequest::AddAgent { name: "a".into(), token_sha256: "00".into() },
            ControlRequest::RevokeAgent { name: "a".into() },
            ControlRequest::LockVault { by: "cli".into() },
            ControlRequest::RevokeSession { id: session },
            ControlRequest::GatewayStatus,
            ControlRequest::Remove { name: "a".into() },
            ControlRequest::Checkpoint,
            ControlRequest::PublicKey,
            ControlRequest::ServerTools { name: "a".into() },
            ControlRequest::SshGc { host: "h".into(), older_than_days: 3 },
        ] {
            let tag = serde_json::to_value(&request).unwrap()["op"].clone();
            assert_eq!(tag, serde_json::to_value(request.op()).unwrap());
            assert!(ControlOp::offered(tag.as_str().unwrap()));
        }
        for not in ["vault.unlock", "approvals.grant", "sessions.authorize", ""] {
            assert!(!ControlOp::offered(not), "{not}");
        }
        // A malformed id is refused by the request's type, not passed along as text.
        assert!(serde_json::from_str::<ControlRequest>(r#"{"op":"sessions.revoke","id":"nope"}"#).is_err());
    }

    /// A secret carried by a request never shows in its Debug output or in what the journal
    /// records about it, and survives the trip over the socket intact.
    #[test]
    fn a_carried_secret_stays_out_of_debug_and_the_journal_summary() {
        let canary = "CANARY-control-secret-9d1e";
        let credential = Credential {
            name: "bank".into(),
            kind: postern_vault::CredentialKind::Bearer,
            bindings: vec![postern_vault::Binding::new("api.example", None).unwrap()],
            approve_every_use: false,
            idempotency_header: None,
            reads_have_effects: false,
        };
        let request = ControlRequest::AddCredential { credential, secret: SecretText::new(canary.into()) };
        assert!(!format!("{request:?}").contains(canary));
        assert!(!request.summary().to_string().contains(canary));
        assert_eq!(request.summary(), json!({ "op": "vault.add", "name": "bank" }));
        let wire = serde_json::to_string(&request).unwrap();
        let ControlRequest::AddCredential { secret, .. } = serde_json::from_str(&wire).unwrap() else {
            panic!("round trip");
        };
        assert_eq!(secret.0.expose(), canary);
    }
}
