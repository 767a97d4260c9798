//! Journal rows as OpenTelemetry data: a log record for every row (one per step of a folded row), and for every execution one
//! span from its `accepted` row to its first outcome (completed, outcome unknown, failed before
//! dispatch, denied, needs review, not executed) with an event per step; the steps after it
//! (delivery, a verification) are log records in the span's trace. Ids are derived from the
//! execution id, so a span sent twice is the same span. Only fields on a fixed list leave the
//! machine: never a target, a message or an upstream's words, and arguments only for the tools
//! the owner named.

use opentelemetry::logs::{AnyValue, LogRecord as _, Severity};
use opentelemetry::trace::{Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::logs::SdkLogRecord;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use postern_core::{ExecutionId, ExecutionState, trace::TraceParent};
use postern_store::{Event as RowEvent, JournalEntry, VaultEvent};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The ids of an execution's span: its own, its trace's, and the agent's span it was called
/// under (from the `traceparent` the agent sent, journaled on the `accepted` row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ids {
    pub trace: TraceId,
    pub span: SpanId,
    pub parent: Option<SpanContext>,
}

fn digest(label: &str, id: ExecutionId) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(label.as_bytes());
    h.update(id.to_string().as_bytes());
    h.finalize().into()
}

impl Ids {
    pub(crate) fn of(id: ExecutionId, accepted: Option<&JournalEntry>) -> Ids {
        let traceparent =
            accepted.and_then(|a| a.row.detail["correlation"]["traceparent"].as_str()).and_then(TraceParent::parse);
        let own = |label: &str| digest(label, id);
        let mut span: [u8; 8] = own("postern span ")[..8].try_into().unwrap_or([1; 8]);
        if span == [0; 8] {
            span[7] = 1;
        }
        match traceparent {
            Some(t) => Ids {
                trace: TraceId::from_bytes(t.trace_id),
                span: SpanId::from_bytes(span),
                parent: Some(SpanContext::new(
                    TraceId::from_bytes(t.trace_id),
                    SpanId::from_bytes(t.parent_id),
                    TraceFlags::new(t.flags) & TraceFlags::SAMPLED,
                    true,
                    TraceState::NONE,
                )),
            },
            None => {
                let mut trace: [u8; 16] = own("postern trace ")[..16].try_into().unwrap_or([1; 16]);
                if trace == [0; 16] {
                    trace[15] = 1;
                }
                Ids { trace: TraceId::from_bytes(trace), span: SpanId::from_bytes(span), parent: None }
            }
        }
    }
}

fn time_of(entry: &JournalEntry) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(entry.row.at.as_millis()).unwrap_or(0))
}

/// Most events a span carries (a stream of retries can make a timeline long): the first ones,
/// and always the row that ends it.
pub(crate) const MAX_EVENTS: usize = 128;

/// The longest text attribute sent (a tool name, an actor); longer ones are cut, marked.
const MAX_TEXT: usize = 512;

/// The longest arguments sent for a tool the owner named.
const MAX_ARGUMENTS: usize = 8 * 1024;

/// `text`, cut to at most `max` bytes on a character boundary (marked when cut).
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[cut]", &text[..end])
}

/// An MCP protocol revision as the spec spells them (`2026-07-28`); anything an agent made up
/// is not one.
fn revision(value: &Value) -> Option<&str> {
    let text = value.as_str()?;
    let b = text.as_bytes();
    (b.len() == 10 && b.iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() }))
        .then_some(text)
}

/// A value that is a code (`outcome_unknown`, `session`, `oauth_login_required`), never prose
/// or outside text.
fn code(value: &Value) -> Option<&str> {
    let text = value.as_str()?;
    (!text.is_empty()
        && text.len() <= 64
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'))
    .then_some(text)
}

/// Where an execution's span ends: its first row in one of these states (its outcome).
pub(crate) const OUTCOMES: [ExecutionState; 6] = [
    ExecutionState::Completed,
    ExecutionState::OutcomeUnknown,
    ExecutionState::FailedBeforeDispatch,
    ExecutionState::Denied,
    ExecutionState::NeedsReview,
    ExecutionState::NotExecuted,
];

/// The attributes every row carries (span events and log records alike): its place in the
/// journal, and the fields of its detail that are on the list.
fn row_attributes(entry: &JournalEntry) -> Vec<KeyValue> {
    let row = &entry.row;
    let d = &row.detail;
    let mut out = vec![
        KeyValue::new("postern.journal.seq", i64::try_from(row.seq).unwrap_or(i64::MAX)),
        KeyValue::new("postern.journal.row_hash", entry.row_hash.to_string()),
    ];
    if let Some(state) = row.state {
        out.push(KeyValue::new("postern.execution.state", state.as_str()));
    }
    // Only fields Postern itself writes as codes: never `reason` or `by` (words a reviewer or
    // an error chose, even when they are one word).
    if let Some(rung) = code(&d["rung"]) {
        out.push(KeyValue::new("postern.approval.rung", rung.to_owned()));
    }
    if let Some(decision) = code(&d["decision"]) {
        out.push(KeyValue::new("postern.retry.decision", decision.to_owned()));
    }
    if let Some(recovery) = code(&d["recovery"]) {
        out.push(KeyValue::new("postern.recovery", recovery.to_owned()));
    }
    if let Some(err) = code(&d["code"]) {
        out.push(KeyValue::new("error.type", err.to_owned()));
    }
    if let Some(status) = d["outcome"]["http_status"].as_i64() {
        out.push(KeyValue::new("http.response.status_code", status));
    }
    if let Some(status) = d["outcome"]["exit_status"].as_i64() {
        out.push(KeyValue::new("postern.ssh.exit_status", status));
    }
    out
}

/// MCP's `network.transport` for how the agent reached Postern (the bridge is a pipe).
fn network_transport(transport: &str) -> &'static str {
    if transport == "streamable_http" { "tcp" } else { "pipe" }
}

/// What the `accepted` row says of the call (the span's attributes, and its log record's).
fn call_attributes(accepted: &JournalEntry, arguments: bool) -> Vec<KeyValue> {
    let d = &accepted.row.detail;
    let c = &d["correlation"];
    let mut out =
        vec![KeyValue::new("mcp.method.name", "tools/call"), KeyValue::new("gen_ai.operation.name", "execute_tool")];
    let text = |v: &Value| v.as_str().map(|t| bounded(t, MAX_TEXT));
    if let Some(tool) = text(&d["tool"]) {
        out.push(KeyValue::new("gen_ai.tool.name", tool));
    }
    if let Some(channel) = code(&d["channel"]) {
        out.push(KeyValue::new("postern.channel", channel.to_owned()));
    }
    if let Some(actor) = text(&d["actor"]) {
        out.push(KeyValue::new("postern.actor", actor));
    }
    if let Some(fp) = text(&d["fingerprint"]) {
        out.push(KeyValue::new("postern.intent.fingerprint", fp));
    }
    if let Some(class) = code(&d["contract"]["class"]) {
        out.push(KeyValue::new("postern.contract", class.to_owned()));
    }
    let decision = if d["dispatched_anew"].is_null() { "new_execution" } else { "dispatched_anew" };
    out.push(KeyValue::new("postern.retry.decision", decision));
    let protocol = revision(&c["protocol_version"]);
    if let Some(p) = protocol {
        out.push(KeyValue::new("mcp.protocol.version", p.to_owned()));
    }
    // The agent chooses its request ids: a long one is not sent (it is in the journal).
    match &c["jsonrpc_id"] {
        Value::String(id) if id.len() <= 128 => out.push(KeyValue::new("jsonrpc.request.id", id.clone())),
        Value::Number(id) => out.push(KeyValue::new("jsonrpc.request.id", id.to_string())),
        _ => {}
    }
    if let Some(transport) = text(&c["transport"]) {
        out.push(KeyValue::new("network.transport", network_transport(&transport)));
    }
    // The MCP conventions: a session id only before 2026-07-28 (which has no sessions).
    if let (Some(session), Some(p)) = (text(&c["mcp_session_id"]), protocol)
        && p < "2026-07-28"
    {
        out.push(KeyValue::new("mcp.session.id", session));
    }
    if arguments {
        // As the journal's record holds them: secret arguments are keyed digests there.
        out.push(KeyValue::new(
            "postern.tool.arguments",
            bounded(&d["record"]["arguments"].to_string(), MAX_ARGUMENTS),
        ));
    }
    out
}

/// The span of one execution, from its timeline's first rows (at most [`MAX_EVENTS`], read up
/// to `end`) and its first outcome `end`.
pub(crate) fn span(
    timeline: &[JournalEntry],
    end: &JournalEntry,
    ids: &Ids,
    arguments_of: &std::collections::BTreeSet<String>,
    scope: &InstrumentationScope,
) -> SpanData {
    let accepted = timeline.first();
    let tool = bounded(accepted.and_then(|a| a.row.detail["tool"].as_str()).unwrap_or("unknown"), MAX_TEXT);
    let arguments = arguments_of.contains(&tool);
    let mut attributes = accepted.map(|a| call_attributes(a, arguments)).unwrap_or_default();
    if let Some(id) = end.row.execution_id {
        attributes.push(KeyValue::new("postern.execution.id", id.to_string()));
    }
    let state = end.row.state.map_or("unknown", ExecutionState::as_str);
    attributes.push(KeyValue::new("postern.execution.state", state));
    attributes.push(KeyValue::new("postern.journal.seq", i64::try_from(end.row.seq).unwrap_or(i64::MAX)));
    attributes.push(KeyValue::new("postern.journal.row_hash", end.row_hash.to_string()));
    if let Some(rung) = timeline.iter().find_map(|e| code(&e.row.detail["rung"])) {
        attributes.push(KeyValue::new("postern.approval.rung", rung.to_owned()));
    }
    if let Some(status) = end.row.detail["outcome"]["http_status"].as_i64() {
        attributes.push(KeyValue::new("http.response.status_code", status));
    }
    if arguments && let Some(sha) = &end.row.result_sha256 {
        attributes.push(KeyValue::new("postern.result.sha256", sha.clone()));
    }
    let completed = end.row.state == Some(ExecutionState::Completed);
    if !completed {
        let err = code(&end.row.detail["code"]).unwrap_or(state).to_owned();
        attributes.push(KeyValue::new("error.type", err));
    }
    let mut events = SpanEvents::default();
    let before: Vec<&JournalEntry> = timeline.iter().filter(|e| e.row.seq < end.row.seq).take(MAX_EVENTS - 1).collect();
    events.dropped_count =
        u32::try_from(timeline.iter().filter(|e| e.row.seq < end.row.seq).count() - before.len()).unwrap_or(u32::MAX);
    events.events = before
        .into_iter()
        .chain(std::iter::once(end))
        .map(|e| Event::new(e.row.event.as_str(), time_of(e), row_attributes(e), 0))
        .collect();
    SpanData {
        span_context: SpanContext::new(ids.trace, ids.span, TraceFlags::SAMPLED, false, TraceState::NONE),
        parent_span_id: ids.parent.as_ref().map_or(SpanId::INVALID, SpanContext::span_id),
        parent_span_is_remote: ids.parent.is_some(),
        span_kind: SpanKind::Server,
        name: format!("tools/call {tool}").into(),
        start_time: accepted.map_or_else(|| time_of(end), time_of),
        end_time: time_of(end),
        attributes,
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status: if completed { Status::Ok } else { Status::error(state) },
        instrumentation_scope: scope.clone(),
    }
}

/// An attribute's value as a log record holds it.
fn any(value: opentelemetry::Value) -> AnyValue {
    use opentelemetry::Value as V;
    match value {
        V::Bool(b) => AnyValue::Boolean(b),
        V::I64(i) => AnyValue::Int(i),
        V::F64(f) => AnyValue::Double(f),
        other => AnyValue::from(other.as_str().into_owned()),
    }
}

/// How loud a row is.
fn severity(entry: &JournalEntry) -> (Severity, &'static str) {
    use ExecutionState as S;
    match entry.row.event {
        RowEvent::Vault(VaultEvent::AuthorityTampered) => (Severity::Error, "ERROR"),
        RowEvent::Step(S::OutcomeUnknown | S::NeedsReview | S::Denied | S::FailedBeforeDispatch)
        | RowEvent::Vault(VaultEvent::RequestRefused | VaultEvent::OAuthRefreshFailed) => (Severity::Warn, "WARN"),
        _ => (Severity::Info, "INFO"),
    }
}

/// The log record of one row; `ids` places an execution's row in its span's trace, `accepted`
/// (the execution's `accepted` row, when this is it) adds what the call was.
pub(crate) fn log_record(
    mut record: SdkLogRecord,
    entry: &JournalEntry,
    ids: Option<&Ids>,
    arguments: bool,
    observed: SystemTime,
) -> SdkLogRecord {
    let row = &entry.row;
    let event = row.event.as_str();
    record.set_timestamp(time_of(entry));
    record.set_observed_timestamp(observed);
    let (number, text) = severity(entry);
    record.set_severity_number(number);
    record.set_severity_text(text);
    record.set_event_name(event);
    record.set_body(AnyValue::from(event));
    record.add_attribute("postern.journal.stream", row.stream().as_str());
    record.add_attribute("postern.event", event);
    for kv in row_attributes(entry) {
        record.add_attribute(kv.key, any(kv.value));
    }
    if let Some(id) = row.execution_id {
        record.add_attribute("postern.execution.id", id.to_string());
    }
    if let Some(session) = row.session_id {
        record.add_attribute("postern.session.id", session.to_string());
    }
    if row.event == RowEvent::Step(ExecutionState::Accepted) {
        for kv in call_attributes(entry, arguments) {
            record.add_attribute(kv.key, any(kv.value));
        }
    }
    if let Some(ids) = ids {
        record.set_trace_context(ids.trace, ids.span, Some(TraceFlags::SAMPLED));
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use postern_core::Timestamp;
    use postern_store::{HashHex, JournalRow};
    use serde_json::json;

    fn entry(seq: u64, event: RowEvent, state: Option<ExecutionState>, detail: Value) -> JournalEntry {
        JournalEntry {
            row: JournalRow {
                v: 1,
                seq,
                at: Timestamp::from_millis(1_764_445_000_000 + seq as i64),
                event,
                execution_id: Some(ExecutionId::from_parts(Timestamp::from_millis(1_764_445_000_000), 7)),
                session_id: None,
                state,
                result_sha256: None,
                detail,
            },
            row_hash: HashHex([seq as u8; 32]),
        }
    }

    fn accepted(correlation: Value) -> JournalEntry {
        entry(
            1,
            RowEvent::Step(ExecutionState::Accepted),
            Some(ExecutionState::Accepted),
            json!({ "tool": "pay", "channel": "http", "actor": "process:/usr/bin/agent@sha256:ab",
                    "fingerprint": "hmac-sha256:00", "contract": { "class": "irreversible" },
                    "record": { "arguments": { "amount": 5, "memo": "canary-argument" } },
                    "correlation": correlation }),
        )
    }

    #[test]
    fn a_span_names_the_call_and_only_listed_fields_leave() {
        let first = accepted(json!({ "transport": "stdio", "jsonrpc_id": 3, "protocol_version": "2026-07-28",
                                     "mcp_session_id": "sess-1",
                                     "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }));
        let timeline = vec![
            first.clone(),
            entry(
                2,
                RowEvent::Step(ExecutionState::Authorized),
                Some(ExecutionState::Authorized),
                json!({ "rung": "session", "by": "reviewer" }),
            ),
            entry(
                3,
                RowEvent::Step(ExecutionState::Dispatched),
                Some(ExecutionState::Dispatched),
                json!({ "target": "https://pay.example/v1?token=canary-target", "method": "POST" }),
            ),
            entry(
                4,
                RowEvent::Step(ExecutionState::FailedBeforeDispatch),
                Some(ExecutionState::FailedBeforeDispatch),
                json!({ "code": "connect_refused", "message": "canary-message from upstream", "reason": "the target refused: canary-reason" }),
            ),
        ];
        let ids = Ids::of(timeline[0].row.execution_id.unwrap(), Some(&first));
        assert_eq!(ids.trace, TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(), "the agent's trace");
        assert_eq!(ids.parent.as_ref().map(SpanContext::span_id), Some(SpanId::from_hex("b7ad6b7169203331").unwrap()));
        let scope = InstrumentationScope::builder("postern").build();
        let span = span(&timeline, &timeline[3], &ids, &Default::default(), &scope);
        let shown = format!("{:?}", span);
        for canary in ["canary-argument", "canary-target", "canary-message", "canaryreason", "canaryreviewer", "sess-1"]
        {
            assert!(!shown.contains(canary), "{canary} left in {shown}");
        }
        let attr = |k: &str| span.attributes.iter().find(|kv| kv.key.as_str() == k).map(|kv| kv.value.to_string());
        assert_eq!(attr("gen_ai.tool.name").as_deref(), Some("pay"));
        assert_eq!(attr("mcp.method.name").as_deref(), Some("tools/call"));
        assert_eq!(attr("jsonrpc.request.id").as_deref(), Some("3"));
        assert_eq!(attr("network.transport").as_deref(), Some("pipe"));
        assert_eq!(attr("error.type").as_deref(), Some("connect_refused"));
        assert_eq!(attr("postern.approval.rung").as_deref(), Some("session"));
        assert_eq!(attr("mcp.session.id"), None, "no session id at 2026-07-28");
        assert_eq!(span.events.events.len(), 4);
        assert_eq!(span.name, "tools/call pay");
        // Named by the owner, the arguments go as the record holds them.
        let named = ["pay".to_owned()].into();
        let with_args = super::span(&timeline, &timeline[3], &ids, &named, &scope);
        assert!(format!("{:?}", with_args.attributes).contains("canary-argument"));
    }

    #[test]
    fn ids_are_the_executions_own_without_a_traceparent_and_stable() {
        let first = accepted(json!({ "traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01" }));
        let id = first.row.execution_id.unwrap();
        let a = Ids::of(id, Some(&first));
        assert_eq!(a, Ids::of(id, Some(&first)));
        assert_eq!(a.parent, None, "an invalid traceparent parents nothing");
        assert_ne!(a.trace, TraceId::INVALID);
        assert_ne!(a.span, SpanId::INVALID);
    }
}

#[cfg(test)]
mod bounds {
    use super::*;
    use postern_core::Timestamp;
    use postern_store::{HashHex, JournalRow};
    use serde_json::json;

    fn row(seq: u64, event: RowEvent, detail: Value) -> JournalEntry {
        JournalEntry {
            row: JournalRow {
                v: 1,
                seq,
                at: Timestamp::from_millis(1_764_445_000_000),
                event,
                execution_id: Some(ExecutionId::from_parts(Timestamp::from_millis(1_764_445_000_000), 9)),
                session_id: None,
                state: None,
                result_sha256: None,
                detail,
            },
            row_hash: HashHex([0; 32]),
        }
    }

    /// What an agent controls (its request ids, `_meta`'s protocol version, retries without
    /// end) cannot make a span or a record grow without bound.
    #[test]
    fn what_an_agent_controls_is_bounded() {
        let huge = "x".repeat(1 << 20);
        let accepted = row(
            1,
            RowEvent::Step(ExecutionState::Accepted),
            json!({ "tool": huge, "actor": huge, "correlation": { "jsonrpc_id": huge, "protocol_version": huge,
                    "mcp_session_id": "s", "transport": "streamable_http" } }),
        );
        let mut timeline = vec![accepted];
        for seq in 2..1_000 {
            timeline.push(row(
                seq,
                RowEvent::Note(postern_store::ActivityNote::RetryReceived),
                json!({ "decision": "attach" }),
            ));
        }
        let end = row(1_000, RowEvent::Step(ExecutionState::Denied), json!({}));
        let ids = Ids::of(end.row.execution_id.unwrap(), timeline.first());
        let scope = InstrumentationScope::builder("postern").build();
        let span = span(&timeline, &end, &ids, &Default::default(), &scope);
        assert_eq!(span.events.events.len(), MAX_EVENTS);
        assert_eq!(span.events.events.last().map(|e| e.name.as_ref()), Some("denied"));
        assert_eq!(span.events.dropped_count, 999 - (MAX_EVENTS as u32 - 1));
        let size: usize = span.attributes.iter().map(|kv| kv.value.as_str().len()).sum();
        assert!(size < 4 * MAX_TEXT, "{size}");
        let attr = |k: &str| span.attributes.iter().any(|kv| kv.key.as_str() == k);
        assert!(!attr("jsonrpc.request.id") && !attr("mcp.protocol.version") && !attr("mcp.session.id"));
    }
}
