//! Replay contracts (docs/src/design.md): what a tool promises about retries after a lost response.
//!
//! Every side-effecting tool must carry one; a tool without one is refused when it is loaded,
//! never guessed at when it is called.

use crate::{ErrorCode, channel::Channel};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// How an execution whose outcome is unknown can be recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayClass {
    /// No side effect: retry freely (still journaled).
    ReadOnly,
    /// The target honours an idempotency header (HTTP) or argument (an upstream MCP tool): re-send
    /// with the same key (the execution ID).
    IdempotencyKey,
    /// Sending the same request again has no additional effect (an upstream tool's
    /// `idempotentHint`, an HTTP PUT the owner vouches for): an unknown outcome is re-sent.
    Idempotent,
    /// The target exposes a status endpoint: query it, never re-send blindly.
    StatusQuery,
    /// The remote command runs under the SSH marker protocol: read the marker record.
    SshMarker,
    /// None of the above: an unknown outcome needs human review.
    Irreversible,
}

impl ReplayClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayClass::ReadOnly => "read_only",
            ReplayClass::IdempotencyKey => "idempotency_key",
            ReplayClass::Idempotent => "idempotent",
            ReplayClass::StatusQuery => "status_query",
            ReplayClass::SshMarker => "ssh_marker",
            ReplayClass::Irreversible => "irreversible",
        }
    }
}

/// How long after acceptance a matching call is treated as a retry of the prior execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachWindow {
    /// A retry must arrive within this many milliseconds of the prior's acceptance.
    Millis(u64),
    /// Attach for as long as the prior is unresolved (e.g. credential rotation).
    UntilResolved,
}

impl AttachWindow {
    /// Whether `elapsed_ms` since acceptance is still inside the window (strictly less than).
    pub fn contains(self, elapsed_ms: u64) -> bool {
        match self {
            AttachWindow::Millis(window) => elapsed_ms < window,
            AttachWindow::UntilResolved => true,
        }
    }
}

/// Which calls share an intent scope (docs/src/design.md): by default one agent run; a contract may
/// widen it so that a later run of the same agent still finds the prior execution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopePolicy {
    #[default]
    AgentRun,
    Durable,
}

/// How to ask a target whether an execution happened (class `status_query`), and what its
/// answers mean. The target's word is evidence only where the contract says what it proves: an
/// answer none of `done`, `in_flight` and `never_received` names (or that two of them name) is
/// inconclusive, and a person decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusQuery {
    /// HTTP method of the status request (normally `GET`).
    pub method: String,
    /// URL template; `{execution_id}` (the key the original request carried in its
    /// `idempotency_header`) is substituted by the engine.
    pub url_template: String,
    /// Answers that mean the request was received and done: the answer is its result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done: Vec<StatusAnswer>,
    /// Answers that mean the target has the request and is still working on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<StatusAnswer>,
    /// Answers that mean the target never received the request: the only ones that allow the
    /// same execution to be sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub never_received: Vec<StatusAnswer>,
}

/// One answer a status route gives: an HTTP status, or a status whose JSON body holds `equals`
/// at `pointer` (RFC 6901), e.g. `{ status = 200, pointer = "/state", equals = "succeeded" }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StatusAnswer {
    Status(u16),
    Body { status: u16, pointer: String, equals: serde_json::Value },
}

/// What a status route's answer proves, by the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusMeaning {
    Done,
    InFlight,
    NeverReceived,
    /// Named by no meaning, or by more than one.
    Inconclusive,
}

impl StatusAnswer {
    fn matches(&self, status: u16, body: Option<&serde_json::Value>) -> bool {
        match self {
            StatusAnswer::Status(s) => *s == status,
            StatusAnswer::Body { status: s, pointer, equals } => {
                *s == status && body.and_then(|b| b.pointer(pointer)) == Some(equals)
            }
        }
    }
}

impl StatusQuery {
    /// What the answer `status` with `body` (its JSON, if it is JSON) proves.
    pub fn meaning(&self, status: u16, body: Option<&serde_json::Value>) -> StatusMeaning {
        let named = |answers: &[StatusAnswer]| answers.iter().any(|a| a.matches(status, body));
        let meanings = [
            (named(&self.done), StatusMeaning::Done),
            (named(&self.in_flight), StatusMeaning::InFlight),
            (named(&self.never_received), StatusMeaning::NeverReceived),
        ];
        let mut matched = meanings.iter().filter(|(m, _)| *m).map(|(_, meaning)| *meaning);
        match (matched.next(), matched.next()) {
            (Some(only), None) => only,
            _ => StatusMeaning::Inconclusive,
        }
    }
}

/// The replay contract of one tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayContract {
    pub class: ReplayClass,
    /// Arguments that enter the fingerprint; `None` means all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_fields: Option<BTreeSet<String>>,
    /// Values filled in for absent arguments, always, before fingerprinting and dispatch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub defaults: BTreeMap<String, Value>,
    /// Arguments replaced by a keyed digest in the canonical record.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub secret_fields: BTreeSet<String>,
    /// Request headers (lower-case names) whose values change the effect and so enter the record.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub semantic_headers: BTreeSet<String>,
    pub attach_window: AttachWindow,
    #[serde(default)]
    pub scope: ScopePolicy,
    /// Header carrying the idempotency key (class `idempotency_key`, HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_header: Option<String>,
    /// Argument Postern fills with the idempotency key (class `idempotency_key`, upstream MCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_argument: Option<String>,
    /// Status endpoint (class `status_query`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_query: Option<StatusQuery>,
    /// How long the target remembers an idempotency key (classes `idempotency_key` and
    /// `status_query`: the key is what it de-duplicates or reports on); `None`:
    /// [`DEFAULT_KEY_RETENTION_MS`]. Past it, an uncertain outcome is never re-sent or verified
    /// by the key on its own: a re-send the target no longer recognises would run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_retention_ms: Option<u64>,
}

/// 24 hours: how long many APIs keep an idempotency key (Stripe's is 24 h), when a contract
/// does not say.
pub const DEFAULT_KEY_RETENTION_MS: u64 = 24 * 3_600_000;

/// Ten minutes: the default attach window of the built-in read-only contract.
pub const DEFAULT_ATTACH_WINDOW_MS: u64 = 10 * 60 * 1000;

impl ReplayContract {
    /// The contract implied for a read-only tool that declares none.
    pub fn read_only() -> Self {
        ReplayContract {
            class: ReplayClass::ReadOnly,
            fingerprint_fields: None,
            defaults: BTreeMap::new(),
            secret_fields: BTreeSet::new(),
            semantic_headers: BTreeSet::new(),
            attach_window: AttachWindow::Millis(DEFAULT_ATTACH_WINDOW_MS),
            scope: ScopePolicy::AgentRun,
            idempotency_header: None,
            idempotency_argument: None,
            status_query: None,
            key_retention_ms: None,
        }
    }

    /// How long the target remembers this contract's key (see [`ReplayContract::key_retention_ms`]).
    pub fn key_retention(&self) -> u64 {
        self.key_retention_ms.unwrap_or(DEFAULT_KEY_RETENTION_MS)
    }

    /// Checks the contract is complete and consistent for a tool on `channel`.
    pub fn validate(&self, tool: &str, channel: Channel) -> Result<(), ContractError> {
        let err = |problem: ContractProblem| ContractError::Invalid { tool: tool.to_owned(), problem };
        match (self.class, channel) {
            (ReplayClass::IdempotencyKey | ReplayClass::StatusQuery | ReplayClass::Idempotent, Channel::Ssh)
            | (ReplayClass::StatusQuery, Channel::Mcp) => {
                return Err(err(ContractProblem::ClassNeedsHttp(self.class)));
            }
            (ReplayClass::SshMarker, Channel::Http | Channel::Mcp) => {
                return Err(err(ContractProblem::ClassNeedsSsh));
            }
            _ => {}
        }
        let keyed = self.class == ReplayClass::IdempotencyKey;
        match (channel, &self.idempotency_argument) {
            (Channel::Mcp, None) if keyed => return Err(err(ContractProblem::MissingIdempotencyArgument)),
            (Channel::Mcp, _) => {}
            (_, Some(_)) => return Err(err(ContractProblem::ArgumentKeyNeedsMcp)),
            (_, None) => {}
        }
        match &self.idempotency_header {
            None if keyed && channel != Channel::Mcp => {
                return Err(err(ContractProblem::MissingIdempotencyHeader));
            }
            Some(_) if channel == Channel::Mcp => return Err(err(ContractProblem::HeaderKeyNeedsHttp)),
            Some(h) if !is_header_token(h) => {
                return Err(err(ContractProblem::InvalidHeaderName(h.clone())));
            }
            _ => {}
        }
        if self.class == ReplayClass::StatusQuery {
            let Some(query) = &self.status_query else { return Err(err(ContractProblem::MissingStatusQuery)) };
            // The status route is asked about the execution ID: it must have reached the target.
            if self.idempotency_header.is_none() {
                return Err(err(ContractProblem::StatusKeyNeverSent));
            }
            if query.done.is_empty() {
                return Err(err(ContractProblem::StatusMeaningsMissing));
            }
        }
        if self.key_retention_ms.is_some()
            && !matches!(self.class, ReplayClass::IdempotencyKey | ReplayClass::StatusQuery)
        {
            return Err(err(ContractProblem::RetentionWithoutKey(self.class)));
        }
        if self.attach_window == AttachWindow::Millis(0) {
            return Err(err(ContractProblem::ZeroAttachWindow));
        }
        if let Some(h) = self.semantic_headers.iter().find(|h| !is_header_token(h) || h.to_ascii_lowercase() != **h) {
            return Err(err(ContractProblem::InvalidHeaderName(h.clone())));
        }
        if let Some(f) = self.secret_fields.iter().find(|f| self.defaults.contains_key(*f)) {
            return Err(err(ContractProblem::SecretWithDefault(f.clone())));
        }
        // A default that never enters the fingerprint is harmless but almost always a typo.
        if let Some(fields) = &self.fingerprint_fields
            && let Some(f) = self.defaults.keys().find(|f| !fields.contains(*f))
        {
            return Err(err(ContractProblem::DefaultOutsideFingerprint(f.clone())));
        }
        Ok(())
    }
}

/// HTTP methods that are safe by definition (RFC 9110 §9.2.1) and so need no contract.
pub fn is_safe_method(method: &str) -> bool {
    matches!(method.to_ascii_uppercase().as_str(), "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

/// The contract a tool runs under: its own (validated), or the read-only contract for a tool
/// that can have no side effect. A side-effecting tool without a contract is refused.
///
/// A safe verb is trusted by default; `reads_have_effects` (the tool's or its credential's
/// declaration that a GET through it changes something: a counter, a one-time link, an export
/// job) withdraws that trust, and then the tool needs a contract other than `read_only`.
pub fn effective_contract(
    tool: &str,
    channel: Channel,
    http_method: Option<&str>,
    declared: Option<&ReplayContract>,
    reads_have_effects: bool,
) -> Result<ReplayContract, ContractError> {
    match declared {
        Some(contract) if reads_have_effects && contract.class == ReplayClass::ReadOnly => {
            Err(ContractError::EffectfulRead { tool: tool.to_owned(), declared_read_only: true })
        }
        Some(contract) => {
            contract.validate(tool, channel)?;
            Ok(contract.clone())
        }
        None => match (channel, http_method) {
            (Channel::Http, Some(m)) if is_safe_method(m) && reads_have_effects => {
                Err(ContractError::EffectfulRead { tool: tool.to_owned(), declared_read_only: false })
            }
            (Channel::Http, Some(m)) if is_safe_method(m) => Ok(ReplayContract::read_only()),
            _ => Err(ContractError::MissingContract {
                tool: tool.to_owned(),
                channel,
                method: http_method.map(str::to_owned),
            }),
        },
    }
}

fn is_header_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractProblem {
    #[error("class {} only applies to HTTP tools", .0.as_str())]
    ClassNeedsHttp(ReplayClass),
    #[error("class ssh_marker only applies to SSH tools")]
    ClassNeedsSsh,
    #[error("class idempotency_key needs `idempotency_header` (e.g. \"Idempotency-Key\")")]
    MissingIdempotencyHeader,
    #[error(
        "class idempotency_key on an upstream MCP tool needs `idempotency_argument` (the argument Postern fills with the key)"
    )]
    MissingIdempotencyArgument,
    #[error("`idempotency_argument` only applies to upstream MCP tools (HTTP tools name an `idempotency_header`)")]
    ArgumentKeyNeedsMcp,
    #[error("`idempotency_header` only applies to HTTP tools (upstream MCP tools name an `idempotency_argument`)")]
    HeaderKeyNeedsHttp,
    #[error("class status_query needs a `status_query` endpoint")]
    MissingStatusQuery,
    #[error(
        "class status_query needs `idempotency_header`: the status route is asked about the execution ID, \
         which reaches the target only in that header"
    )]
    StatusKeyNeverSent,
    #[error(
        "`status_query` must say what its answers mean: `done` (e.g. [200], or \
         [{{ status = 200, pointer = \"/state\", equals = \"succeeded\" }}]), and where the target can say so, \
         `in_flight` and `never_received`; any other answer is inconclusive"
    )]
    StatusMeaningsMissing,
    #[error("`key_retention` only applies to idempotency_key and status_query (class {} sends no key)", .0.as_str())]
    RetentionWithoutKey(ReplayClass),
    #[error("attach window is zero: no retry could ever be recognised")]
    ZeroAttachWindow,
    #[error("{0:?} is not a valid lower-case HTTP header name")]
    InvalidHeaderName(String),
    #[error("secret argument {0:?} has a default value; secrets are never written into manifests")]
    SecretWithDefault(String),
    #[error("default for {0:?} is not among `fingerprint_fields`")]
    DefaultOutsideFingerprint(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    #[error(
        "tool {tool:?} can change state ({}) but declares no replay contract; add one \
         (read_only, idempotency_key, status_query, ssh_marker or irreversible)",
        describe(*channel, method.as_deref())
    )]
    MissingContract { tool: String, channel: Channel, method: Option<String> },
    #[error("replay contract of tool {tool:?}: {problem}")]
    Invalid { tool: String, problem: ContractProblem },
    #[error(
        "tool {tool:?} declares that its reads have effects (reads_have_effects) {}; declare \
         idempotency_key, status_query or irreversible",
        if *declared_read_only { "yet its contract is read_only" } else { "but declares no replay contract" }
    )]
    EffectfulRead { tool: String, declared_read_only: bool },
}

fn describe(channel: Channel, method: Option<&str>) -> String {
    match (channel, method) {
        (Channel::Http, Some(m)) => format!("HTTP {m}"),
        (Channel::Http, None) => "HTTP".into(),
        (Channel::Ssh, _) => "SSH command".into(),
        (Channel::Mcp, _) => "upstream MCP tool".into(),
    }
}

impl ErrorCode for ContractError {
    fn code(&self) -> &'static str {
        match self {
            ContractError::MissingContract { .. } => "missing_replay_contract",
            ContractError::Invalid { .. } => "invalid_replay_contract",
            ContractError::EffectfulRead { .. } => "effectful_read_needs_contract",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_answer_means_only_what_one_meaning_names() {
        let query: StatusQuery = serde_json::from_value(serde_json::json!({
            "method": "GET", "url_template": "https://t/{execution_id}",
            "done": [{ "status": 200, "pointer": "/state", "equals": "succeeded" }, 201],
            "in_flight": [202, { "status": 200, "pointer": "/state", "equals": "pending" }],
            "never_received": [404],
        }))
        .unwrap();
        let body = |state: &str| serde_json::json!({ "state": state });
        assert_eq!(query.meaning(200, Some(&body("succeeded"))), StatusMeaning::Done);
        assert_eq!(query.meaning(201, None), StatusMeaning::Done);
        assert_eq!(query.meaning(200, Some(&body("pending"))), StatusMeaning::InFlight);
        assert_eq!(query.meaning(202, None), StatusMeaning::InFlight);
        assert_eq!(query.meaning(404, None), StatusMeaning::NeverReceived);
        // A 2xx the contract does not name, a failure body, no body, a 410, a 500: inconclusive.
        for (status, b) in [(200, Some(body("failed"))), (200, None), (204, None), (410, None), (500, None)] {
            assert_eq!(query.meaning(status, b.as_ref()), StatusMeaning::Inconclusive, "{status} {b:?}");
        }
        // Named by two meanings: the contract contradicts itself, so nothing is proven.
        let both = StatusQuery { never_received: vec![StatusAnswer::Status(201)], ..query };
        assert_eq!(both.meaning(201, None), StatusMeaning::Inconclusive);
    }

    fn keyed() -> ReplayContract {
        ReplayContract {
            class: ReplayClass::IdempotencyKey,
            idempotency_header: Some("Idempotency-Key".into()),
            ..ReplayContract::read_only()
        }
    }

    #[test]
    fn side_effecting_tools_without_a_contract_are_refused() {
        for method in ["POST", "PUT", "PATCH", "DELETE", "post"] {
            let err = effective_contract("deploy", Channel::Http, Some(method), None, false).unwrap_err();
            assert_eq!(err.code(), "missing_replay_contract");
            assert!(err.to_string().contains("deploy"), "{err}");
        }
        let err = effective_contract("restart", Channel::Ssh, None, None, false).unwrap_err();
        assert!(err.to_string().contains("SSH command"));
        for method in ["GET", "head", "OPTIONS"] {
            let c = effective_contract("list", Channel::Http, Some(method), None, false).expect("safe method");
            assert_eq!(c.class, ReplayClass::ReadOnly);
        }
    }

    #[test]
    fn a_read_declared_to_have_effects_needs_a_contract_other_than_read_only() {
        let err = effective_contract("export", Channel::Http, Some("GET"), None, true).unwrap_err();
        assert_eq!(err.code(), "effectful_read_needs_contract");
        assert!(err.to_string().contains("declares no replay contract"), "{err}");
        let read_only = ReplayContract::read_only();
        let err = effective_contract("export", Channel::Http, Some("GET"), Some(&read_only), true).unwrap_err();
        assert!(err.to_string().contains("yet its contract is read_only"), "{err}");
        let c = effective_contract("export", Channel::Http, Some("GET"), Some(&keyed()), true).expect("keyed");
        assert_eq!(c.class, ReplayClass::IdempotencyKey);
    }

    #[test]
    fn incomplete_contracts_are_refused_with_the_reason() {
        let cases: Vec<(ReplayContract, Channel, ContractProblem)> = vec![
            (
                ReplayContract { idempotency_header: None, ..keyed() },
                Channel::Http,
                ContractProblem::MissingIdempotencyHeader,
            ),
            (keyed(), Channel::Ssh, ContractProblem::ClassNeedsHttp(ReplayClass::IdempotencyKey)),
            (
                ReplayContract { class: ReplayClass::SshMarker, ..ReplayContract::read_only() },
                Channel::Http,
                ContractProblem::ClassNeedsSsh,
            ),
            (
                ReplayContract { class: ReplayClass::StatusQuery, ..ReplayContract::read_only() },
                Channel::Http,
                ContractProblem::MissingStatusQuery,
            ),
            (
                ReplayContract { attach_window: AttachWindow::Millis(0), ..keyed() },
                Channel::Http,
                ContractProblem::ZeroAttachWindow,
            ),
            (
                ReplayContract { idempotency_header: Some("Bad Header".into()), ..keyed() },
                Channel::Http,
                ContractProblem::InvalidHeaderName("Bad Header".into()),
            ),
            (
                ReplayContract {
                    secret_fields: ["token".to_string()].into(),
                    defaults: [("token".to_string(), Value::from("x"))].into(),
                    ..keyed()
                },
                Channel::Http,
                ContractProblem::SecretWithDefault("token".into()),
            ),
            (
                ReplayContract {
                    fingerprint_fields: Some(["a".to_string()].into()),
                    defaults: [("b".to_string(), Value::from(1))].into(),
                    ..keyed()
                },
                Channel::Http,
                ContractProblem::DefaultOutsideFingerprint("b".into()),
            ),
        ];
        for (contract, channel, problem) in cases {
            let err = contract.validate("t", channel).unwrap_err();
            assert_eq!(err, ContractError::Invalid { tool: "t".into(), problem });
        }
        keyed().validate("t", Channel::Http).expect("complete contract is accepted");
    }

    #[test]
    fn attach_window_is_strict() {
        assert!(AttachWindow::Millis(100).contains(99));
        assert!(!AttachWindow::Millis(100).contains(100));
        assert!(AttachWindow::UntilResolved.contains(u64::MAX));
    }
}
