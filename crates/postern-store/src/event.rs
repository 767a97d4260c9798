//! The journal's events as types: one enum per stream, so the writer, `audit verify` and
//! `rederive`, the views and the app name an event by a variant, and a row whose event its
//! stream does not have cannot be read as if it were something else.
//!
//! The stored spelling (`"event"` in a row's head) is unchanged: each variant's `as_str`. A row
//! is read through [`Event::parse`], which takes the row's stream: an event of another stream, or
//! one no version of Postern writes, makes the row unreadable, never a default. `audit verify`
//! checks every row's event this way (`Finding::UnknownEvent`: a granting row moved to another
//! stream or renamed is no longer one the authority view would skip in silence).
//!
//! The rows that grant authority (credentials, agents, session grants, the allowlist) also have
//! typed payloads here ([`Grant`]): the writer builds the row's detail from them and the
//! authority view reads it back into them, so both ends agree on every field by construction.

use postern_core::ExecutionState;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

use crate::journal::Stream;

/// Declares an event enum with its stored spellings and the list of all its variants.
macro_rules! events {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The stored spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The variant stored as `text`, if there is one.
            pub fn from_name(text: &str) -> Option<$name> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

events! {
    /// An activity row about an execution that does not move its state: evidence in the chain
    /// (a retry that arrived, a question asked and its answer, a cancel, a refused recovery).
    ActivityNote {
        RetryReceived => "retry_received",
        ApprovalRequested => "approval_requested",
        ApprovalGranted => "approval_granted",
        ApprovalDenied => "approval_denied",
        ApprovalTimedOut => "approval_timed_out",
        ApprovalWithdrawn => "approval_withdrawn",
        CancelRequested => "cancel_requested",
        StreamResumed => "stream_resumed",
        RecoveryRefused => "recovery_refused",
        RetryReviewRequested => "retry_review_requested",
        RetryReviewTimedOut => "retry_review_timed_out",
        RetryReviewWithdrawn => "retry_review_withdrawn",
        RetryReviewDecided => "retry_review_decided",
    }
}

events! {
    /// The session stream: agent runs and what grants them standing.
    SessionEvent {
        SessionStarted => "session_started",
        SessionEnded => "session_ended",
        SessionAuthorized => "session_authorized",
        SessionRevoked => "session_revoked",
        AllowlistAdded => "allowlist_added",
        AllowlistRemoved => "allowlist_removed",
    }
}

events! {
    /// The vault stream: credentials, agents, the lock, and what was refused or applied from
    /// outside the gateway.
    VaultEvent {
        CredentialAdded => "credential_added",
        CredentialRemoved => "credential_removed",
        ApproveEveryUseChanged => "approve_every_use_changed",
        /// An SSH host's first key pinned (a spec change).
        SshHostKeyPinned => "ssh_host_key_pinned",
        /// An owner's contract for an MCP server's tool (a spec change).
        McpToolContractSet => "mcp_tool_contract_set",
        /// When an MCP server starts (a spec change).
        McpServerStartSet => "mcp_server_start_set",
        AgentAdded => "agent_added",
        AgentRevoked => "agent_revoked",
        VaultLocked => "vault_locked",
        VaultUnlocked => "vault_unlocked",
        AuthorityRederived => "authority_rederived",
        AuthorityTampered => "authority_tampered",
        RequestRefused => "request_refused",
        /// What early development builds wrote for `request_refused`; read, never written.
        ApprovalAttemptRefused => "approval_attempt_refused",
        ImportApplied => "import_applied",
        ImportUndone => "import_undone",
        ControlRequestApplied => "control_request_applied",
        /// A remote MCP server signed in with OAuth (issuer, scopes, expiry, client id; never a
        /// token).
        OAuthSignedIn => "oauth_signed_in",
        /// Its access token was refreshed.
        OAuthRefreshed => "oauth_refreshed",
        /// A refresh failed: the server needs a new sign-in.
        OAuthRefreshFailed => "oauth_refresh_failed",
        OAuthSignedOut => "oauth_signed_out",
        /// The sign-in's loopback listener got a redirect it did not accept (a wrong `state`, an
        /// `error=`, a second request).
        OAuthRedirectRefused => "oauth_redirect_refused",
    }
}

impl ActivityNote {
    /// A question to a person about the call, or its answer.
    pub fn is_approval(self) -> bool {
        use ActivityNote::*;
        matches!(self, ApprovalRequested | ApprovalGranted | ApprovalDenied | ApprovalTimedOut | ApprovalWithdrawn)
    }
}

/// What one journal row records. The stream follows from the event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// An execution moved to this state (activity stream).
    Step(ExecutionState),
    /// Evidence about an execution that leaves its state as it was (activity stream).
    Note(ActivityNote),
    Session(SessionEvent),
    Vault(VaultEvent),
}

impl Event {
    pub fn stream(self) -> Stream {
        match self {
            Event::Step(_) | Event::Note(_) => Stream::Activity,
            Event::Session(_) => Stream::Session,
            Event::Vault(_) => Stream::Vault,
        }
    }

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Step(s) => s.as_str(),
            Event::Note(n) => n.as_str(),
            Event::Session(e) => e.as_str(),
            Event::Vault(e) => e.as_str(),
        }
    }

    /// The event a row of `stream` stores as `text`; `None` when that stream has no such event.
    pub fn parse(stream: Stream, text: &str) -> Option<Event> {
        match stream {
            Stream::Activity => text
                .parse::<ExecutionState>()
                .ok()
                .map(Event::Step)
                .or_else(|| ActivityNote::from_name(text).map(Event::Note)),
            Stream::Session => SessionEvent::from_name(text).map(Event::Session),
            Stream::Vault => VaultEvent::from_name(text).map(Event::Vault),
        }
    }

    /// Every event of every stream, each once.
    pub fn all() -> impl Iterator<Item = Event> {
        let steps = ExecutionState::ALL.into_iter().map(Event::Step);
        let notes = ActivityNote::ALL.iter().map(|n| Event::Note(*n));
        let sessions = SessionEvent::ALL.iter().map(|e| Event::Session(*e));
        steps.chain(notes).chain(sessions).chain(VaultEvent::ALL.iter().map(|e| Event::Vault(*e)))
    }

    /// The state this row moves its execution to, if it is a step.
    pub fn step(self) -> Option<ExecutionState> {
        match self {
            Event::Step(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Written as its stored spelling (listings, results, the app).
impl Serialize for Event {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Tests and listings compare an event with its stored spelling.
impl PartialEq<str> for Event {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Event {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl From<ExecutionState> for Event {
    fn from(s: ExecutionState) -> Event {
        Event::Step(s)
    }
}

impl From<ActivityNote> for Event {
    fn from(n: ActivityNote) -> Event {
        Event::Note(n)
    }
}

impl From<SessionEvent> for Event {
    fn from(e: SessionEvent) -> Event {
        Event::Session(e)
    }
}

impl From<VaultEvent> for Event {
    fn from(e: VaultEvent) -> Event {
        Event::Vault(e)
    }
}

impl From<crate::SpecChange> for VaultEvent {
    fn from(c: crate::SpecChange) -> VaultEvent {
        match c {
            crate::SpecChange::SshHostKeyPinned => VaultEvent::SshHostKeyPinned,
            crate::SpecChange::McpToolContractSet => VaultEvent::McpToolContractSet,
            crate::SpecChange::McpServerStartSet => VaultEvent::McpServerStartSet,
        }
    }
}

impl From<crate::OAuthEvent> for VaultEvent {
    fn from(e: crate::OAuthEvent) -> VaultEvent {
        match e {
            crate::OAuthEvent::OAuthSignedIn => VaultEvent::OAuthSignedIn,
            crate::OAuthEvent::OAuthRefreshed => VaultEvent::OAuthRefreshed,
            crate::OAuthEvent::OAuthRefreshFailed => VaultEvent::OAuthRefreshFailed,
            crate::OAuthEvent::OAuthSignedOut => VaultEvent::OAuthSignedOut,
            crate::OAuthEvent::OAuthRedirectRefused => VaultEvent::OAuthRedirectRefused,
        }
    }
}

impl From<crate::ImportEvent> for VaultEvent {
    fn from(e: crate::ImportEvent) -> VaultEvent {
        match e {
            crate::ImportEvent::ImportApplied => VaultEvent::ImportApplied,
            crate::ImportEvent::ImportUndone => VaultEvent::ImportUndone,
        }
    }
}

/// A spec, which a granting row must carry (a `null` is as absent as a missing field).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Spec(pub Value);

impl<'de> Deserialize<'de> for Spec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Spec, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Err(serde::de::Error::custom("a value, not null")),
            v => Ok(Spec(v)),
        }
    }
}

/// `credential_added`: everything the credential grants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CredentialAdded {
    pub name: String,
    pub kind: String,
    pub spec: Spec,
    pub bindings: Spec,
    pub approve_every_use: bool,
}

/// `credential_removed`, `agent_revoked`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Named {
    pub name: String,
}

/// `approve_every_use_changed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApproveEveryUseChanged {
    pub name: String,
    pub approve_every_use: bool,
}

/// A spec change (`ssh_host_key_pinned`, `mcp_tool_contract_set`, `mcp_server_start_set`): the
/// credential and its new spec, beside the change's own facts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpecChanged {
    pub name: String,
    pub spec: Spec,
}

/// `agent_added`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentAdded {
    pub name: String,
    pub token_sha256: String,
}

/// `allowlist_added`, `allowlist_removed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllowlistChanged {
    pub actor: String,
    pub by: String,
}

/// A row that grants or takes away authority, read from its event and its typed payload.
#[derive(Clone, Debug, PartialEq)]
pub enum Grant {
    VaultLocked,
    VaultUnlocked,
    CredentialAdded(CredentialAdded),
    CredentialRemoved(Named),
    ApproveEveryUseChanged(ApproveEveryUseChanged),
    SpecChanged(SpecChanged),
    AgentAdded(AgentAdded),
    AgentRevoked(Named),
    /// A session's standing: `true` authorized, `false` revoked.
    SessionStanding(bool),
    AllowlistAdded(AllowlistChanged),
    AllowlistRemoved(AllowlistChanged),
}

impl Grant {
    /// The grant `event` makes with `detail`: `Ok(None)` for an event that grants nothing, `Err`
    /// naming the field when the payload lacks one the grant needs or has it of another type.
    pub fn read(event: Event, detail: &Value) -> Result<Option<Grant>, String> {
        fn typed<T: serde::de::DeserializeOwned>(detail: &Value) -> Result<T, String> {
            T::deserialize(detail).map_err(|e| e.to_string())
        }
        use VaultEvent as V;
        Ok(Some(match event {
            Event::Vault(V::VaultLocked) => Grant::VaultLocked,
            Event::Vault(V::VaultUnlocked) => Grant::VaultUnlocked,
            Event::Vault(V::CredentialAdded) => Grant::CredentialAdded(typed(detail)?),
            Event::Vault(V::CredentialRemoved) => Grant::CredentialRemoved(typed(detail)?),
            Event::Vault(V::ApproveEveryUseChanged) => Grant::ApproveEveryUseChanged(typed(detail)?),
            // Only these events replace a spec: a row is read by its event, never by its shape,
            // because other vault rows carry details a process of the user chose (an import
            // record over the control socket).
            Event::Vault(V::SshHostKeyPinned | V::McpToolContractSet | V::McpServerStartSet) => {
                Grant::SpecChanged(typed(detail)?)
            }
            Event::Vault(V::AgentAdded) => Grant::AgentAdded(typed(detail)?),
            Event::Vault(V::AgentRevoked) => Grant::AgentRevoked(typed(detail)?),
            Event::Session(SessionEvent::SessionAuthorized) => Grant::SessionStanding(true),
            Event::Session(SessionEvent::SessionRevoked) => Grant::SessionStanding(false),
            Event::Session(SessionEvent::AllowlistAdded) => Grant::AllowlistAdded(typed(detail)?),
            Event::Session(SessionEvent::AllowlistRemoved) => Grant::AllowlistRemoved(typed(detail)?),
            _ => return Ok(None),
        }))
    }
}

/// A typed payload as the row's detail (an object: every payload here is a struct).
pub(crate) fn detail_of<T: Serialize>(payload: &T) -> Value {
    serde_json::to_value(payload).expect("a journal payload serialises to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_event_reads_back_on_its_own_stream_only() {
        let mut names = std::collections::HashSet::new();
        for event in Event::all() {
            assert!(names.insert(event.as_str()), "{event} is spelled twice");
            for stream in Stream::ALL {
                let read = Event::parse(stream, event.as_str());
                if stream == event.stream() {
                    assert_eq!(read, Some(event));
                } else {
                    assert_eq!(read, None, "{event} read on the {stream:?} stream");
                }
            }
        }
        assert_eq!(Event::parse(Stream::Vault, "some_event"), None);
    }

    #[test]
    fn a_granting_payload_names_the_field_it_lacks() {
        let added = Event::Vault(VaultEvent::CredentialAdded);
        let full = json!({"name":"pay","kind":"http","spec":{},"bindings":[],"approve_every_use":true});
        assert!(matches!(Grant::read(added, &full), Ok(Some(Grant::CredentialAdded(_)))));
        for field in ["name", "kind", "spec", "bindings", "approve_every_use"] {
            let mut d = full.clone();
            d.as_object_mut().unwrap().remove(field);
            let err = Grant::read(added, &d).unwrap_err();
            assert!(err.contains(field), "{err}");
        }
        let mut null_spec = full.clone();
        null_spec["spec"] = Value::Null;
        assert!(Grant::read(added, &null_spec).is_err());
        let mut text_flag = full;
        text_flag["approve_every_use"] = json!("false");
        assert!(Grant::read(added, &text_flag).is_err());
        assert_eq!(Grant::read(Event::Vault(VaultEvent::RequestRefused), &json!({"spec":{}})), Ok(None));
    }
}
