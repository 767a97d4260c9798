//! A call forwarded to a running server, classified for the journal: never written, answered
//! (a result or a JSON-RPC error), too large, or lost in flight; and the read-only operations
//! (`resources/read`, `prompts/get`) sent the same way.

use super::*;

impl Upstreams {
    /// Forwards one call. `arguments` are what the agent sent (with the idempotency argument
    /// filled); `execution` goes into `_meta`. What comes back is as the server sent it.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        operation: McpOperation,
        arguments: Map<String, Value>,
        execution: &str,
        timeout: Duration,
    ) -> UpstreamSent {
        let running = {
            let Ok(def) = self.vault.mcp_server(server) else {
                return UpstreamSent::NotSent { reason: format!("no MCP server named {server:?} in the vault") };
            };
            if def.oauth.is_some() {
                match self.vault.oauth_grant(&def) {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        let why = crate::channel::oauth::SignInNeeded::not_signed_in(server);
                        return UpstreamSent::SignInNeeded { reason: why.to_string() };
                    }
                    Err(e) => return UpstreamSent::NotSent { reason: format!("{server:?} cannot start: {e}") },
                }
            }
            match self.ensure(&def).await {
                Ok((r, _)) => r,
                Err(reason) => return UpstreamSent::NotSent { reason },
            }
        };
        let meta = json!({ EXECUTION_META: execution });
        if operation != McpOperation::CallTool {
            return read(&running, server, operation, arguments, meta, timeout).await;
        }
        let params = json!({ "name": tool, "arguments": arguments, "_meta": meta });
        let params: CallToolRequestParams = match serde_json::from_value(params) {
            Ok(p) => p,
            Err(e) => return UpstreamSent::NotSent { reason: format!("the request could not be built: {e}") },
        };
        let answer = tokio::time::timeout(timeout, running.service.peer().call_tool(params)).await;
        let answered = |upstream_result: Value, is_error: bool| {
            UpstreamSent::Answered(UpstreamResult::new(server, tool, upstream_result, is_error))
        };
        match answer {
            Ok(Ok(result)) => {
                let is_error = result.is_error == Some(true);
                answered(serde_json::to_value(&result).unwrap_or(Value::Null), is_error)
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) if too_large(&e) => {
                UpstreamSent::TooLarge(UpstreamResult::new(server, tool, Value::Null, false))
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) if sign_in_needed(&e) => {
                UpstreamSent::SignInNeeded { reason: e.message.to_string() }
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => answered(json!({ "error": e }), true),
            Ok(Err(rmcp::ServiceError::UnexpectedResponse)) => answered(
                json!({ "error": { "message": "the server asked for input or started a task; Postern forwards only \
                                               final tool results" } }),
                true,
            ),
            Ok(Err(e)) => {
                UpstreamSent::Lost { reason: format!("the connection to {server:?} ended before it answered: {e}") }
            }
            Err(_) => {
                UpstreamSent::Lost { reason: format!("{server:?} did not answer within {} s", timeout.as_secs()) }
            }
        }
    }
}

impl Upstreams {
    /// Why the tool `name` names is not offered, when it belongs to a server that signs in with
    /// OAuth and needs a sign-in (none yet, or its refresh failed): the door answers with this
    /// (`oauth_login_required`) instead of "unknown tool".
    pub async fn sign_in_needed(&self, name: &str) -> Option<crate::channel::oauth::SignInNeeded> {
        let (server, _) = name.split_once(SEPARATOR)?;
        let def = self.vault.mcp_server(server).ok().filter(|d| d.oauth.is_some())?;
        if matches!(self.vault.oauth_grant(&def), Ok(None)) {
            return Some(crate::channel::oauth::SignInNeeded::not_signed_in(server));
        }
        let slot = self.slot(server);
        let slot = slot.lock().await;
        slot.last_error.as_deref().filter(|e| e.contains(crate::channel::oauth::SIGN_IN_NEEDED_PHRASE)).map(|_| {
            crate::channel::oauth::SignInNeeded {
                server: server.into(),
                why: "its last connection could not get a token".into(),
            }
        })
    }
}

/// Is this error the answer that stands in for one larger than the limit ([`frames`])?
fn too_large(e: &rmcp::ErrorData) -> bool {
    e.code.0 == frames::TOO_LARGE_CODE && e.data.as_ref().is_some_and(|d| d["postern"] == frames::TOO_LARGE_MARKER)
}

/// Is this error the answer that stands in for a request not sent for want of a sign-in
/// ([`remote`])? It carries this process's random marker, which no server ever sees: a server
/// that answers with the same code and shape cannot make a request it received read as unsent.
fn sign_in_needed(e: &rmcp::ErrorData) -> bool {
    e.code.0 == remote::SIGN_IN_NEEDED_CODE
        && e.data
            .as_ref()
            .is_some_and(|d| d["postern"] == "oauth_login_required" && d["not_sent"] == remote::not_sent_marker())
}

/// `resources/read` (`arguments.uri`) or `prompts/get` (`arguments.name`, `arguments.arguments`).
async fn read(
    running: &Running,
    server: &str,
    operation: McpOperation,
    arguments: Map<String, Value>,
    meta: Value,
    timeout: Duration,
) -> UpstreamSent {
    let mut params = Value::Object(arguments);
    params["_meta"] = meta;
    let answer = if operation == McpOperation::ReadResource {
        match serde_json::from_value::<rmcp::model::ReadResourceRequestParams>(params) {
            Ok(p) => tokio::time::timeout(timeout, running.service.read_resource(p)).await.map(|r| r.map(|r| json!(r))),
            Err(e) => return UpstreamSent::NotSent { reason: format!("the request could not be built: {e}") },
        }
    } else {
        match serde_json::from_value::<rmcp::model::GetPromptRequestParams>(params) {
            Ok(p) => tokio::time::timeout(timeout, running.service.get_prompt(p)).await.map(|r| r.map(|r| json!(r))),
            Err(e) => return UpstreamSent::NotSent { reason: format!("the request could not be built: {e}") },
        }
    };
    let answered = |upstream_result: Value, is_error: bool| {
        UpstreamSent::Answered(UpstreamResult::new(server, operation.as_str(), upstream_result, is_error))
    };
    match answer {
        Ok(Ok(result)) => answered(result, false),
        Ok(Err(rmcp::ServiceError::McpError(e))) if too_large(&e) => {
            UpstreamSent::TooLarge(UpstreamResult::new(server, operation.as_str(), Value::Null, false))
        }
        Ok(Err(rmcp::ServiceError::McpError(e))) if sign_in_needed(&e) => {
            UpstreamSent::SignInNeeded { reason: e.message.to_string() }
        }
        Ok(Err(rmcp::ServiceError::McpError(e))) => answered(json!({ "error": e }), true),
        Ok(Err(e)) => {
            UpstreamSent::Lost { reason: format!("the connection to {server:?} ended before it answered: {e}") }
        }
        Err(_) => UpstreamSent::Lost { reason: format!("{server:?} did not answer within {} s", timeout.as_secs()) },
    }
}
