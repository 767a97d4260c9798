//! The canonical action record (docs/src/design.md, the action record): the effect an agent asked for, with everything that
//! does not change the effect stripped away, and nothing secret in it.
//!
//! The record is what gets fingerprinted and journaled. Request ids, `_meta` and progress tokens
//! have no field here at all, so they cannot leak into a fingerprint.

use crate::{
    ErrorCode,
    canonical::{CanonicalError, canonical_bytes},
    channel::Channel,
    contract::ReplayContract,
    fingerprint::{Fingerprint, FingerprintKey},
    id::SessionId,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Version of the record layout; bumping it deliberately changes every fingerprint.
pub const RECORD_VERSION: u32 = 1;

/// Who asked: derived from the kernel (process path + executable hash) or from an agent token,
/// never from what the client claims about itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Actor(String);

impl Actor {
    /// `process:<executable path>@sha256:<hex>`.
    pub fn process(executable: &str, sha256_hex: &str) -> Self {
        Actor(format!("process:{executable}@sha256:{sha256_hex}"))
    }

    /// `agent:<name>` for a Streamable HTTP client holding a Postern-issued token.
    pub fn token_agent(name: &str) -> Self {
        Actor(format!("agent:{name}"))
    }

    /// An actor read back from the journal.
    pub fn from_recorded(s: impl Into<String>) -> Self {
        Actor(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A process actor's executable path and SHA-256 (hex), read back from its one spelling;
    /// `None` for a token agent or anything else.
    pub fn process_parts(&self) -> Option<(&str, &str)> {
        self.0.strip_prefix("process:").and_then(|a| a.rsplit_once("@sha256:"))
    }
}

/// The set of calls inside which a matching fingerprint counts as a retry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IntentScope(String);

impl IntentScope {
    /// The default scope: one agent run.
    pub fn agent_run(session: SessionId) -> Self {
        IntentScope(format!("run:{session}"))
    }

    /// A scope named by a person (`postern call --scope NAME`): calls sharing the name are one
    /// intent, so a repeated command is a retry rather than a second action.
    pub fn named(name: &str) -> Self {
        IntentScope(format!("named:{name}"))
    }

    /// A scope that outlives agent runs (e.g. credential rotation, until verified).
    pub fn durable() -> Self {
        IntentScope("durable".into())
    }

    pub fn from_recorded(s: impl Into<String>) -> Self {
        IntentScope(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An HTTP action as requested, before normalisation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAction {
    pub method: String,
    pub url: String,
    /// All request headers the tool would send (names in any case). Only the ones the contract
    /// declares semantic enter the record. Credential headers are added later by the vault and
    /// are never here.
    pub headers: Vec<(String, String)>,
}

/// An SSH action: the host is identified by its pinned host key, not by its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshAction {
    /// e.g. `SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s`
    pub host_key_fingerprint: String,
    pub account: String,
    pub working_dir: Option<String>,
    pub command: String,
}

/// A request forwarded to an upstream MCP server: which server (by its vault name), which
/// operation, and for a `tools/call` which of its tools (its own name, not the namespaced one
/// agents see).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpAction {
    pub server: String,
    pub tool: String,
    pub operation: McpOperation,
}

/// What a request to an upstream server does: call one of its tools, or one of the reads agents
/// reach through `resources/read` and `prompts/get`. A kind of its own, never a tool's name: an
/// upstream may offer a tool called `resources/read`, and calling it is still a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum McpOperation {
    CallTool,
    ReadResource,
    GetPrompt,
}

impl McpOperation {
    /// The MCP method.
    pub const fn as_str(self) -> &'static str {
        match self {
            McpOperation::CallTool => "tools/call",
            McpOperation::ReadResource => "resources/read",
            McpOperation::GetPrompt => "prompts/get",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionTarget {
    Http(HttpAction),
    Ssh(SshAction),
    Mcp(McpAction),
}

impl ActionTarget {
    pub fn channel(&self) -> Channel {
        match self {
            ActionTarget::Http(_) => Channel::Http,
            ActionTarget::Ssh(_) => Channel::Ssh,
            ActionTarget::Mcp(_) => Channel::Mcp,
        }
    }
}

/// Everything that decides the effect of one requested action.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionRequest {
    pub actor: Actor,
    pub tool: String,
    pub target: ActionTarget,
    /// Name of the vault credential the action uses (never its value).
    pub credential_ref: Option<String>,
    /// The tool arguments as the agent sent them (a JSON object).
    pub arguments: Value,
    pub intent_scope: IntentScope,
}

/// The canonical record and its RFC 8785 bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct CanonicalAction {
    record: Value,
    bytes: Vec<u8>,
}

impl CanonicalAction {
    /// Builds the canonical record of `request` under `contract` (defaults, field selection,
    /// secret digests) and its canonical bytes.
    pub fn build(
        request: &ActionRequest,
        contract: &ReplayContract,
        key: &FingerprintKey,
    ) -> Result<Self, RecordError> {
        let arguments = canonical_arguments(&request.arguments, contract, key)?;
        let mut record = Map::new();
        record.insert("record_version".into(), json!(RECORD_VERSION));
        record.insert("actor".into(), json!(request.actor));
        record.insert("tool".into(), json!(request.tool));
        record.insert("channel".into(), json!(request.target.channel()));
        record.insert("credential_ref".into(), json!(request.credential_ref));
        record.insert("intent_scope".into(), json!(request.intent_scope));
        record.insert("arguments".into(), Value::Object(arguments));
        match &request.target {
            ActionTarget::Http(http) => {
                record.insert("method".into(), json!(normalise_method(&http.method)?));
                record.insert("target".into(), json!(normalise_url(&http.url)?));
                record.insert("headers".into(), json!(semantic_headers(&http.headers, contract)));
            }
            ActionTarget::Ssh(ssh) => {
                if ssh.host_key_fingerprint.trim().is_empty() {
                    return Err(RecordError::MissingHostKey);
                }
                record.insert(
                    "target".into(),
                    json!({
                        "host_key": ssh.host_key_fingerprint,
                        "account": ssh.account,
                        "working_dir": ssh.working_dir,
                        "command": ssh.command,
                    }),
                );
            }
            // A tool call's target is as it always was (its fingerprints unchanged); a read names
            // its operation, so it never matches a call of a tool with the operation's name.
            ActionTarget::Mcp(mcp) if mcp.operation == McpOperation::CallTool => {
                record.insert("target".into(), json!({ "server": mcp.server, "tool": mcp.tool }));
            }
            ActionTarget::Mcp(mcp) => {
                record.insert("target".into(), json!({ "server": mcp.server, "operation": mcp.operation.as_str() }));
            }
        }
        let record = Value::Object(record);
        let bytes = canonical_bytes(&record).map_err(|e| RecordError::from_canonical(e, ""))?;
        Ok(CanonicalAction { record, bytes })
    }

    pub fn record(&self) -> &Value {
        &self.record
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn fingerprint(&self, key: &FingerprintKey) -> Fingerprint {
        key.fingerprint(&self.bytes)
    }

    /// The *effect* fingerprint: the record without its intent scope, so the same effect asked
    /// for by the same actor in another run (a restarted agent's repeat) has the same one. It
    /// links related executions for a reviewer and the incident record; it never decides a retry
    /// (a new run is a new intent). Never equal to an intent fingerprint: every record has a
    /// scope, so no record's bytes are these.
    pub fn effect_fingerprint(&self, key: &FingerprintKey) -> Fingerprint {
        let mut effect = self.record.clone();
        if let Some(record) = effect.as_object_mut() {
            record.remove("intent_scope");
        }
        // The record canonicalised once already; without a member it cannot fail.
        key.fingerprint(&canonical_bytes(&effect).unwrap_or_default())
    }
}

fn canonical_arguments(
    raw: &Value,
    contract: &ReplayContract,
    key: &FingerprintKey,
) -> Result<Map<String, Value>, RecordError> {
    let mut args = match raw {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(RecordError::ArgumentsNotObject { found: json_kind(other) });
        }
    };
    // Protocol metadata (progress tokens, tracing) never changes the effect.
    args.remove("_meta");
    for (name, default) in &contract.defaults {
        args.entry(name.clone()).or_insert_with(|| default.clone());
    }
    if let Some(fields) = &contract.fingerprint_fields {
        args.retain(|name, _| fields.contains(name));
    }
    for name in &contract.secret_fields {
        if let Some(value) = args.get_mut(name) {
            let bytes =
                canonical_bytes(value).map_err(|e| RecordError::from_canonical(e, &format!("/arguments/{name}")))?;
            *value = json!({ "secret_digest": key.secret_digest(&bytes) });
        }
    }
    Ok(args)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn normalise_method(method: &str) -> Result<String, RecordError> {
    let upper = method.trim().to_ascii_uppercase();
    if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(RecordError::InvalidMethod { method: method.chars().take(32).collect() });
    }
    Ok(upper)
}

/// Scheme and host lower-cased, default port dropped, dot-segments resolved, fragment dropped,
/// query parameters sorted by name (stable, so repeated names keep their relative order).
pub fn normalise_url(raw: &str) -> Result<String, RecordError> {
    let mut url = url::Url::parse(raw.trim()).map_err(|e| RecordError::InvalidUrl { reason: e.to_string() })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(RecordError::InvalidUrl { reason: format!("scheme {:?} is not http or https", url.scheme()) });
    }
    if !url.username().is_empty() || url.password().is_some() {
        // Credentials come from the vault, never from the URL an agent passes.
        return Err(RecordError::CredentialsInUrl);
    }
    url.set_fragment(None);
    if let Some(query) = url.query().map(str::to_owned) {
        let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        pairs.sort_by(|a, b| param_name(a).cmp(param_name(b)));
        let sorted = pairs.join("&");
        url.set_query(if sorted.is_empty() { None } else { Some(&sorted) });
    }
    Ok(url.to_string())
}

fn param_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name)
}

fn semantic_headers(headers: &[(String, String)], contract: &ReplayContract) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let name = name.trim().to_ascii_lowercase();
        if !contract.semantic_headers.contains(&name) {
            continue;
        }
        let value = value.trim();
        out.entry(name)
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("tool arguments must be a JSON object, got {found}")]
    ArgumentsNotObject { found: &'static str },
    #[error(
        "argument at {path} is an integer beyond ±(2^53 − 1); it cannot be fingerprinted without \
         losing precision (send it as a string if the target accepts one)"
    )]
    IntegerOutOfRange { path: String },
    #[error("action could not be canonicalised: {0}")]
    Canonical(String),
    #[error("invalid target URL: {reason}")]
    InvalidUrl { reason: String },
    #[error("target URL carries credentials (user:password@); credentials come from the vault")]
    CredentialsInUrl,
    #[error("invalid HTTP method {method:?}")]
    InvalidMethod { method: String },
    #[error("SSH action has no pinned host-key fingerprint")]
    MissingHostKey,
}

impl RecordError {
    fn from_canonical(e: CanonicalError, prefix: &str) -> Self {
        match e {
            CanonicalError::IntegerOutOfRange { path } => RecordError::IntegerOutOfRange {
                path: if prefix.is_empty() {
                    path
                } else if path == "/" {
                    prefix.to_owned()
                } else {
                    format!("{prefix}{path}")
                },
            },
            CanonicalError::Serialise(m) => RecordError::Canonical(m),
        }
    }
}

impl ErrorCode for RecordError {
    fn code(&self) -> &'static str {
        match self {
            RecordError::ArgumentsNotObject { .. } => "invalid_arguments",
            RecordError::IntegerOutOfRange { .. } => "integer_out_of_range",
            RecordError::Canonical(_) => "canonicalisation_failed",
            RecordError::InvalidUrl { .. } => "invalid_url",
            RecordError::CredentialsInUrl => "credentials_in_url",
            RecordError::InvalidMethod { .. } => "invalid_method",
            RecordError::MissingHostKey => "missing_host_key",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_actor_reads_back_into_its_parts() {
        let actor = Actor::process("/opt/my agent@v2/bin/node", "ab12");
        assert_eq!(actor.process_parts(), Some(("/opt/my agent@v2/bin/node", "ab12")));
        assert_eq!(Actor::from_recorded(actor.as_str()).process_parts(), actor.process_parts());
        assert_eq!(Actor::token_agent("ci").process_parts(), None);
        assert_eq!(Actor::from_recorded("cli:uid=1000").process_parts(), None);
    }
    use crate::{
        canonical::MAX_SAFE_INTEGER,
        contract::{AttachWindow, ReplayClass},
        id::SessionId,
        time::Timestamp,
    };
    use proptest::prelude::*;

    fn key() -> FingerprintKey {
        FingerprintKey::from_bytes([0x5a; 32])
    }

    fn session() -> SessionId {
        "ses_01JAZ3NDEKTSV4RRFFQ69G5FAV".parse().expect("valid")
    }

    fn deploy_contract() -> ReplayContract {
        ReplayContract {
            class: ReplayClass::IdempotencyKey,
            idempotency_header: Some("Idempotency-Key".into()),
            defaults: [("region".to_string(), json!("us-east-1"))].into(),
            secret_fields: ["approval_code".to_string()].into(),
            semantic_headers: ["content-type".to_string()].into(),
            attach_window: AttachWindow::Millis(15 * 60 * 1000),
            ..ReplayContract::read_only()
        }
    }

    #[test]
    fn the_effect_fingerprint_links_runs_and_never_meets_an_intent_fingerprint() {
        let build = |scope: IntentScope, amount: u64| {
            let request = ActionRequest { intent_scope: scope, ..deploy_request(json!({ "version": amount })) };
            CanonicalAction::build(&request, &deploy_contract(), &key()).expect("builds")
        };
        let run = |n| IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1), n));
        let (first, restarted, other) = (build(run(1), 7), build(run(2), 7), build(run(2), 8));
        assert_ne!(first.fingerprint(&key()), restarted.fingerprint(&key()), "a new run is a new intent");
        assert_eq!(first.effect_fingerprint(&key()), restarted.effect_fingerprint(&key()), "the same effect");
        assert_ne!(first.effect_fingerprint(&key()), other.effect_fingerprint(&key()));
        for a in [&first, &restarted, &other] {
            for b in [&first, &restarted, &other] {
                assert_ne!(a.effect_fingerprint(&key()), b.fingerprint(&key()));
            }
        }
    }

    fn deploy_request(arguments: Value) -> ActionRequest {
        ActionRequest {
            actor: Actor::process("/usr/bin/claude", "9f2c00aa"),
            tool: "deploy_release".into(),
            target: ActionTarget::Http(HttpAction {
                method: "post".into(),
                url: "HTTPS://Deploy-API.internal.example:443/v1/./x/../releases?b=2&a=1#frag".into(),
                headers: vec![
                    ("Content-Type".into(), " application/json ".into()),
                    ("X-Request-Id".into(), "req-77".into()),
                ],
            }),
            credential_ref: Some("deploy-service".into()),
            arguments,
            intent_scope: IntentScope::agent_run(session()),
        }
    }

    #[test]
    fn an_upstream_read_never_shares_a_record_with_a_tool_of_its_name() {
        let mcp = |tool: &str, operation| ActionRequest {
            tool: "counter__resources/read".into(),
            target: ActionTarget::Mcp(McpAction { server: "counter".into(), tool: tool.into(), operation }),
            credential_ref: None,
            ..deploy_request(json!({ "uri": "counter://effects" }))
        };
        let build =
            |r: &ActionRequest| CanonicalAction::build(r, &ReplayContract::read_only(), &key()).expect("builds");
        let tool = build(&mcp("resources/read", McpOperation::CallTool));
        let read = build(&mcp("resources/read", McpOperation::ReadResource));
        assert_eq!(
            tool.record["target"],
            json!({ "server": "counter", "tool": "resources/read" }),
            "a tool's as before"
        );
        assert_eq!(read.record["target"], json!({ "server": "counter", "operation": "resources/read" }));
        assert_ne!(tool.fingerprint(&key()), read.fingerprint(&key()));
    }

    #[test]
    fn record_shape_is_pinned() {
        let req = deploy_request(json!({
            "service": "catalog", "version": "2026.07.22", "approval_code": "hunter2-canary",
            "_meta": {"progressToken": 12}
        }));
        let action = CanonicalAction::build(&req, &deploy_contract(), &key()).expect("builds");
        insta::assert_snapshot!(String::from_utf8(action.bytes().to_vec()).expect("utf-8"));
        insta::assert_snapshot!("deploy_fingerprint", action.fingerprint(&key()).to_string());
    }

    #[test]
    fn url_normalisation() {
        let cases = [
            ("HTTP://Example.COM:80/a/b/../c/./d?z=1&a=2&a=1#x", "http://example.com/a/c/d?a=2&a=1&z=1"),
            ("https://example.com:443", "https://example.com/"),
            ("https://example.com:8443/x", "https://example.com:8443/x"),
            ("https://example.com/x?", "https://example.com/x"),
            ("https://example.com/x?b&&a=", "https://example.com/x?a=&b"),
            ("https://EXAMPLE.com/%7Euser/a%2Fb", "https://example.com/%7Euser/a%2Fb"),
        ];
        for (raw, expected) in cases {
            assert_eq!(normalise_url(raw).expect(raw), expected, "{raw}");
        }
        assert_eq!(normalise_url("ftp://example.com/").unwrap_err().code(), "invalid_url");
        assert_eq!(normalise_url("not a url").unwrap_err().code(), "invalid_url");
        assert_eq!(normalise_url("https://user:pw@example.com/").unwrap_err(), RecordError::CredentialsInUrl);
    }

    #[test]
    fn only_semantic_headers_enter_and_names_are_lower_cased() {
        let req = deploy_request(json!({"service": "a", "version": "1"}));
        let action = CanonicalAction::build(&req, &deploy_contract(), &key()).expect("builds");
        assert_eq!(action.record()["headers"], json!({"content-type": "application/json"}));
        assert_eq!(action.record()["method"], json!("POST"));
    }

    #[test]
    fn meta_and_non_fingerprint_fields_do_not_change_the_fingerprint() {
        let contract = ReplayContract {
            fingerprint_fields: Some(["service".to_string(), "version".to_string(), "region".to_string()].into()),
            ..deploy_contract()
        };
        let a = CanonicalAction::build(&deploy_request(json!({"service": "a", "version": "1"})), &contract, &key())
            .expect("builds");
        let b = CanonicalAction::build(
            &deploy_request(
                json!({"service": "a", "version": "1", "_meta": {"progressToken": "p"}, "note": "retry #2"}),
            ),
            &contract,
            &key(),
        )
        .expect("builds");
        assert_eq!(a.fingerprint(&key()), b.fingerprint(&key()));
    }

    #[test]
    fn ssh_record_uses_host_key_account_dir_and_command() {
        let req = ActionRequest {
            target: ActionTarget::Ssh(SshAction {
                host_key_fingerprint: "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s".into(),
                account: "deploy".into(),
                working_dir: Some("/srv/app".into()),
                command: "systemctl restart app".into(),
            }),
            credential_ref: Some("prod-ssh".into()),
            ..deploy_request(json!({}))
        };
        let contract = ReplayContract { class: ReplayClass::SshMarker, idempotency_header: None, ..deploy_contract() };
        let action = CanonicalAction::build(&req, &contract, &key()).expect("builds");
        assert_eq!(
            action.record()["target"],
            json!({"host_key": "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s", "account": "deploy",
                   "working_dir": "/srv/app", "command": "systemctl restart app"})
        );
        assert!(action.record().get("method").is_none());
        let no_key = ActionRequest {
            target: ActionTarget::Ssh(SshAction {
                host_key_fingerprint: " ".into(),
                account: "a".into(),
                working_dir: None,
                command: "true".into(),
            }),
            ..req
        };
        assert_eq!(CanonicalAction::build(&no_key, &contract, &key()).unwrap_err(), RecordError::MissingHostKey);
    }

    #[test]
    fn bad_arguments_get_specific_errors() {
        let err = CanonicalAction::build(&deploy_request(json!([1])), &deploy_contract(), &key()).unwrap_err();
        assert_eq!(err, RecordError::ArgumentsNotObject { found: "array" });
        let err = CanonicalAction::build(
            &deploy_request(json!({"amount": MAX_SAFE_INTEGER + 2})),
            &deploy_contract(),
            &key(),
        )
        .unwrap_err();
        assert_eq!(err, RecordError::IntegerOutOfRange { path: "/arguments/amount".into() });
        let err = CanonicalAction::build(
            &deploy_request(json!({"approval_code": MAX_SAFE_INTEGER + 2})),
            &deploy_contract(),
            &key(),
        )
        .unwrap_err();
        assert_eq!(err, RecordError::IntegerOutOfRange { path: "/arguments/approval_code".into() });
    }

    // ---- property tests -------------------------------------------------------------------

    fn json_value() -> impl Strategy<Value = Value> {
        let safe = MAX_SAFE_INTEGER as i64;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-safe..=safe).prop_map(|i| json!(i)),
            // Finite doubles the canonicalizer accepts (not those JCS writes as unsafe integers).
            any::<f64>()
                .prop_filter("finite, in range", |f| {
                    f.is_finite() && !(f.abs() > crate::canonical::MAX_SAFE_INTEGER as f64 && f.abs() < 1e21)
                })
                .prop_map(|f| json!(f)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Renders `v` as JSON text with pseudo-random whitespace and member order.
    fn render_shuffled(v: &Value, seed: &mut u64, out: &mut String) {
        fn next(seed: &mut u64) -> usize {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (*seed >> 33) as usize
        }
        let ws = [" ", "\n", "\t", "  ", "", "\r\n"];
        out.push_str(ws[next(seed) % ws.len()]);
        match v {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                for i in (1..entries.len()).rev() {
                    entries.swap(i, next(seed) % (i + 1));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).expect("key"));
                    out.push_str(ws[next(seed) % ws.len()]);
                    out.push(':');
                    render_shuffled(item, seed, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    render_shuffled(item, seed, out);
                }
                out.push(']');
            }
            leaf => out.push_str(&serde_json::to_string(leaf).expect("leaf")),
        }
        out.push_str(ws[next(seed) % ws.len()]);
    }

    #[derive(Clone, Debug)]
    enum Mutation {
        ArgumentValue,
        Actor,
        CredentialRef,
        Target,
        Method,
        Scope,
        Tool,
        SemanticHeader,
    }

    proptest! {
        #[test]
        fn canonical_bytes_ignore_member_order_and_whitespace(v in json_value(), seed in any::<u64>()) {
            let mut text = String::new();
            let mut s = seed;
            render_shuffled(&v, &mut s, &mut text);
            let reparsed: Value = serde_json::from_str(&text).expect("rendered text is JSON");
            // Equal bytes, or the same refusal (a number out of the safe range) at the same path.
            prop_assert_eq!(crate::canonical_bytes(&reparsed), crate::canonical_bytes(&v));
        }

        #[test]
        fn omitted_defaults_and_filled_defaults_fingerprint_identically(
            given in prop::collection::btree_map("[a-m]{1,6}", json_value(), 0..5),
            defaults in prop::collection::btree_map("[n-z]{1,6}", json_value(), 1..5),
            fill_mask in any::<u8>(),
        ) {
            let contract = ReplayContract { defaults: defaults.clone(), ..deploy_contract() };
            let omitted: Map<String, Value> = given.clone().into_iter().collect();
            let mut filled = omitted.clone();
            for (i, (k, v)) in defaults.iter().enumerate() {
                if fill_mask & (1 << (i % 8)) != 0 {
                    filled.insert(k.clone(), v.clone());
                }
            }
            let a = CanonicalAction::build(&deploy_request(Value::Object(omitted)), &contract, &key()).expect("a");
            let b = CanonicalAction::build(&deploy_request(Value::Object(filled)), &contract, &key()).expect("b");
            prop_assert_eq!(a.bytes(), b.bytes());
            prop_assert_eq!(a.fingerprint(&key()), b.fingerprint(&key()));
        }

        #[test]
        fn fingerprint_changes_when_any_effect_field_changes(
            value in "[a-z]{1,10}",
            other in "[a-z]{1,10}",
            mutation in prop_oneof![
                Just(Mutation::ArgumentValue), Just(Mutation::Actor), Just(Mutation::CredentialRef),
                Just(Mutation::Target), Just(Mutation::Method), Just(Mutation::Scope),
                Just(Mutation::Tool), Just(Mutation::SemanticHeader),
            ],
        ) {
            prop_assume!(value != other);
            let base = deploy_request(json!({"service": value, "version": "1"}));
            let mut changed = base.clone();
            let ActionTarget::Http(http) = &mut changed.target else { unreachable!() };
            match mutation {
                Mutation::ArgumentValue => changed.arguments = json!({"service": other, "version": "1"}),
                Mutation::Actor => changed.actor = Actor::process(&format!("/usr/bin/{other}"), "9f2c00aa"),
                Mutation::CredentialRef => changed.credential_ref = Some(other.clone()),
                Mutation::Target => http.url = format!("https://deploy-api.internal.example/v1/{other}"),
                Mutation::Method => http.method = if value.len() % 2 == 0 { "PUT".into() } else { "PATCH".into() },
                Mutation::Scope => {
                    changed.intent_scope = IntentScope::agent_run(SessionId::from_parts(
                        Timestamp::from_millis(other.len() as i64), other.len() as u128 + 99))
                }
                Mutation::Tool => changed.tool = other.clone(),
                Mutation::SemanticHeader => http.headers[0].1 = other.clone(),
            }
            let c = deploy_contract();
            let a = CanonicalAction::build(&base, &c, &key()).expect("base");
            let b = CanonicalAction::build(&changed, &c, &key()).expect("changed");
            prop_assert_ne!(a.fingerprint(&key()), b.fingerprint(&key()));
        }

        #[test]
        fn secret_arguments_never_appear_in_canonical_bytes(
            secret in "[A-Za-z0-9]{16,40}",
            service in "[a-z]{1,10}",
            nested in any::<bool>(),
        ) {
            let secret_value = if nested { json!({"code": secret, "n": [secret]}) } else { json!(secret) };
            let req = deploy_request(json!({"service": service, "version": "1", "approval_code": secret_value}));
            let action = CanonicalAction::build(&req, &deploy_contract(), &key()).expect("builds");
            let bytes = action.bytes();
            prop_assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
            let digest = action.record()["arguments"]["approval_code"]["secret_digest"].as_str().expect("digest");
            prop_assert!(digest.starts_with("hmac-sha256:"));
            let debug = format!("{:?}", action);
            prop_assert!(!debug.contains(&secret));
        }
    }
}
