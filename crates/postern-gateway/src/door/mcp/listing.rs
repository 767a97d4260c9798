//! The tools agents list: the manifest's, the built-ins and the upstream servers', each with
//! annotations and a description derived from its replay contract.

use postern_core::{ReplayClass, ReplayContract};
use postern_engine::{
    Engine,
    catalog::manifest::{EXECUTION_STATUS, HTTP_REQUEST, SSH_EXEC, Tool as ManifestTool},
};
use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Value, json};
use std::sync::Arc;

/// The contract, summarised for a tool's description.
fn contract_summary(c: &ReplayContract) -> String {
    match c.class {
        ReplayClass::ReadOnly => "Replay contract: read_only (no side effect; retried freely).".into(),
        ReplayClass::IdempotencyKey => format!(
            "Replay contract: idempotency_key (a retry re-sends with the same {} so the target applies it once).",
            c.idempotency_header.as_deref().or(c.idempotency_argument.as_deref()).unwrap_or("idempotency key")
        ),
        ReplayClass::Idempotent => "Replay contract: idempotent (a repeat has no additional effect, so an uncertain \
                                    attempt is re-sent)."
            .into(),
        ReplayClass::StatusQuery => {
            "Replay contract: status_query (an uncertain attempt is checked at the target, never re-sent blindly)."
                .into()
        }
        ReplayClass::SshMarker => {
            "Replay contract: ssh_marker (an uncertain attempt is checked through its marker on the host).".into()
        }
        ReplayClass::Irreversible => "Replay contract: irreversible (an uncertain attempt is never re-sent; a \
                                      person reviews it)."
            .into(),
    }
}

/// The MCP annotations an agent sees, derived from the contract (never from the manifest text).
pub fn annotations(c: &ReplayContract) -> ToolAnnotations {
    let read_only = c.class == ReplayClass::ReadOnly;
    // `idempotentHint` promises that a repeat has no further effect. An idempotency key does not
    // promise that to an agent: a repeat once the result was delivered is a new execution.
    let idempotent = matches!(c.class, ReplayClass::ReadOnly | ReplayClass::Idempotent);
    ToolAnnotations::new()
        .read_only(read_only)
        .idempotent(idempotent)
        .destructive(c.class == ReplayClass::Irreversible)
        .open_world(true)
}

fn schema_object(schema: &Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(schema.as_object().cloned().unwrap_or_default())
}

fn manifest_tool(t: &ManifestTool) -> Tool {
    let summary = if t.read_only_by_verb {
        format!(
            "Replay contract: read_only, by its {} verb (trusted to have no side effect; retried freely).",
            t.method
        )
    } else {
        contract_summary(&t.contract)
    };
    let description = format!("{} {}", t.description.trim(), summary).trim().to_owned();
    Tool::new(t.name.clone(), description, schema_object(&t.input_schema)).with_annotations(annotations(&t.contract))
}

/// An upstream server's tool as agents see it: its own schema and description, the contract
/// Postern derived (annotations are only the server's hints) and annotations from that contract.
fn upstream_tool(t: &postern_engine::channel::upstream::UpstreamTool) -> Tool {
    let hinted = t.hinted.map_or("", |c| c.as_str());
    let unconfirmed =
        format!("Postern's default: the server's hints suggest {hinted}, which its owner has not confirmed");
    let source = match t.contract_source {
        postern_engine::catalog::upstream_contract::HINTS_UNCONFIRMED => unconfirmed.as_str(),
        "tools.toml" => "set by the owner in tools.toml",
        "owner" => "set by the owner",
        _ => "Postern's default: no annotation says it is safe to repeat",
    };
    let description = format!(
        "{} [via MCP server {}] {} (Contract {source}.)",
        t.description.trim(),
        t.server,
        contract_summary(&t.contract)
    );
    Tool::new(t.name.clone(), description, schema_object(&t.input_schema)).with_annotations(annotations(&t.contract))
}

/// Every tool an agent may call.
pub fn tool_list(engine: &Engine) -> Vec<Tool> {
    let mut tools: Vec<Tool> = engine.manifest().tools().map(manifest_tool).collect();
    if let Some(upstreams) = engine.upstreams() {
        tools.extend(upstreams.tools().iter().filter(|t| engine.manifest().tool(&t.name).is_none()).map(upstream_tool));
    }
    tools.push(
        Tool::new(
            HTTP_REQUEST,
            "Send an HTTP request; the credential bound to the URL's host is added by Postern (the agent never \
             sees it). GET and HEAD are read_only by their verb, unless the credential declares that its reads have \
             effects; other methods (and those reads) are idempotency_key when the credential declares \
             an idempotency header, else irreversible (an uncertain attempt is never re-sent).",
            schema_object(&postern_engine::catalog::manifest::http_request_schema()),
        )
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(true).open_world(true)),
    );
    if engine.manifest().tool(SSH_EXEC).is_none() {
        tools.push(
            Tool::new(
                SSH_EXEC,
                "Run one command on an SSH host from Postern's vault; the private key never leaves Postern. Replay \
                 contract: ssh_marker (the command runs inside a marker wrapper on the host, so an uncertain attempt \
                 is checked there and never run twice).",
                schema_object(&postern_engine::catalog::manifest::ssh_exec_schema()),
            )
            .with_annotations(
                ToolAnnotations::new().read_only(false).destructive(true).idempotent(false).open_world(true),
            ),
        );
    }
    tools.push(
        Tool::new(
            EXECUTION_STATUS,
            "Look up one of your executions by ID (state, timestamps, outcome, result when available). Call this \
             instead of repeating a call whose outcome is unknown.",
            schema_object(&json!({
                "type": "object",
                "properties": { "execution_id": { "type": "string", "description": "e.g. act_01J…" } },
                "required": ["execution_id"],
                "additionalProperties": false,
            })),
        )
        .with_annotations(ToolAnnotations::new().read_only(true).idempotent(true).open_world(false)),
    );
    tools
}
