//! What a call's `accepted` row keeps of how it arrived: evidence of the transport, the agent
//! run, the MCP session and protocol revision, the JSON-RPC id and the agent's trace — never an
//! input to a decision.

use crate::caller::runs::Caller;
use rmcp::{RoleServer, service::RequestContext};
use serde_json::{Value, json};

/// What a call's `accepted` row keeps of how it arrived (evidence, never an input to a
/// decision): the transport, the agent run, the MCP session and protocol version, the JSON-RPC
/// id, and the agent's W3C `traceparent` (SEP-414) when it sent a well-formed one.
pub(super) fn of(caller: &Caller, run: &crate::caller::runs::AgentRun, context: &RequestContext<RoleServer>) -> Value {
    let protocol = context
        .meta
        .protocol_version()
        .or_else(|| context.peer.peer_info().map(|i| i.protocol_version.clone()))
        .map(|v| v.to_string())
        // A revision is a date (`2026-07-28`); whatever else a client put there is not kept.
        .filter(|v| {
            v.len() == 10
                && v.bytes().enumerate().all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() })
        });
    let traceparent = context.meta.get_traceparent().and_then(postern_core::trace::TraceParent::parse);
    let mut correlation = json!({
        "transport": caller.transport.as_str(),
        "agent_session": run.session.to_string(),
        "mcp_session_id": mcp_session_id(context),
        "jsonrpc_id": serde_json::to_value(&context.id).unwrap_or(Value::Null),
    });
    if let Some(protocol) = protocol {
        correlation["protocol_version"] = json!(protocol);
    }
    if let Some(traceparent) = traceparent {
        correlation["traceparent"] = json!(traceparent.to_string());
    }
    correlation
}

/// The `Mcp-Session-Id` a Streamable HTTP request came with (stdio has none).
fn mcp_session_id(context: &RequestContext<RoleServer>) -> Value {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok())
        .map_or(Value::Null, |s| Value::String(s.to_owned()))
}
