//! A write command's route, chosen once by `postern-host`: the journal itself, or the running
//! gateway's control socket — with the same output either way.

use crate::Failure;
use anyhow::{Context, anyhow};
use serde_json::Value;
use std::path::Path;

/// Asks the running gateway for `op`, which its control socket does not offer: the gateway
/// journals the attempt and answers where to do it instead, which becomes this command's error.
pub fn refused_by_gateway(data_dir: &Path, op: &str) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the runtime")?;
    let line = serde_json::to_vec(&serde_json::json!({ "op": op, "by": "cli" })).context("encode")?;
    let reply = runtime
        .block_on(postern_gateway::door::control::request_line(data_dir, line))
        .map_err(|e| anyhow!("the journal is held by a running gateway, and its control socket did not answer: {e}"))?;
    match reply {
        postern_gateway::door::control::ControlReply::Refused { message, .. } => {
            Err(Failure { code: 1, error: anyhow!("{message}") })
        }
        _ => Err(Failure { code: 1, error: anyhow!("the gateway carried out a request it should have refused") }),
    }
}

/// Performs an operation on `data_dir`: on the journal itself, or — when a gateway holds it —
/// through that gateway's control socket (the route is chosen once, in `postern-host`). Returns
/// the answer of a question (`Value::Null` for a change).
pub fn perform(data_dir: &Path, request: postern_gateway::door::control::ControlRequest) -> Result<Value, Failure> {
    perform_with(data_dir, request, &postern_host::operations::Overrides::new())
}

/// [`perform`] with the contract overrides of the manifest the command found (used when no
/// gateway runs and this process starts an upstream server itself).
pub fn perform_with(
    data_dir: &Path,
    request: postern_gateway::door::control::ControlRequest,
    overrides: &postern_host::operations::Overrides,
) -> Result<Value, Failure> {
    use postern_gateway::door::control::{ControlCode, ControlReply};
    let now = postern_host::now();
    match postern_host::operations::Route::of(data_dir, now)?.perform_with(request, now, overrides) {
        ControlReply::Done | ControlReply::Servers { .. } => Ok(Value::Null),
        ControlReply::Answer { answer } => Ok(answer),
        ControlReply::Refused { code, message } => {
            let code = match code {
                ControlCode::UnknownAgent
                | ControlCode::DuplicateAgent
                | ControlCode::InvalidRequest
                | ControlCode::Invalid => 2,
                _ => 1,
            };
            Err(Failure { code, error: anyhow!("{message}") })
        }
    }
}
