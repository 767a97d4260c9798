//! From a call to an execution-to-be: arguments validated, templates rendered, the credential
//! chosen by the URL's bindings, the target checked, the call's secrets collected, and the
//! canonical record and fingerprint the store admits or matches.

use super::*;

impl Engine {
    /// `upstream`: the upstream tool `call.tool` names, as resolved once for this call.
    pub(super) fn prepare(
        &self,
        call: &Call,
        upstream: Option<crate::channel::upstream::UpstreamTool>,
    ) -> Result<(Prepared<'_>, Value), EngineError> {
        let tool = match self.manifest.tool(&call.tool) {
            Some(tool) => tool,
            None if call.tool == crate::catalog::manifest::HTTP_REQUEST => {
                return self.prepare_http_request(&call.arguments);
            }
            None if call.tool == crate::catalog::manifest::SSH_EXEC => {
                let timeout = call.arguments.get("timeout_s").and_then(Value::as_u64).unwrap_or(60);
                let contract = postern_core::ReplayContract {
                    class: postern_core::ReplayClass::SshMarker,
                    attach_window: postern_core::AttachWindow::Millis(
                        crate::catalog::manifest::DEFAULT_ATTACH_WINDOW.as_millis() as u64,
                    ),
                    ..postern_core::ReplayContract::read_only()
                };
                let tool = Tool::ssh_exec(contract, Duration::from_secs(timeout.clamp(1, 3600)));
                return self.prepare_ssh(ToolRef::Builtin(Box::new(tool)), &call.arguments);
            }
            None => match upstream {
                Some(t) => return self.prepare_upstream(t, &call.arguments),
                None => return Err(EngineError::UnknownTool(call.tool.clone())),
            },
        };
        if tool.ssh.is_some() {
            return self.prepare_ssh(ToolRef::Manifest(tool), &call.arguments);
        }
        let arguments = tool.validate_arguments(&call.arguments)?;
        let rendered = tool.render(&arguments)?;
        let url = url::Url::parse(&rendered.url)
            .map_err(|e| RecordError::InvalidUrl { reason: format!("{}: {e}", rendered.url) })?;
        http::check_target(&url)?;
        let credential = match &tool.credential {
            None => None,
            Some(name) => {
                let c = self.vault.credential(name)?;
                if !c.allows(&url) {
                    return Err(EngineError::CredentialNotBound { credential: name.clone(), url: url.to_string() });
                }
                if c.reads_have_effects && tool.read_only_by_verb {
                    return Err(postern_core::ContractError::EffectfulRead {
                        tool: tool.name.clone(),
                        declared_read_only: false,
                    }
                    .into());
                }
                Some(c)
            }
        };
        let secrets = contract_secrets(&tool.contract, &arguments, &self.key);
        let prepared = Prepared {
            tool: ToolRef::Manifest(tool),
            shown_url: secrets.mask(url.as_str()),
            target: Target::Http(HttpPlan {
                url,
                method: rendered.method,
                headers: rendered.headers,
                body: rendered.body,
                credential,
            }),
            secrets,
        };
        Ok((prepared, arguments))
    }

    /// A call to an upstream MCP server's tool: checked against the upstream's own schema, sent
    /// as the agent wrote it (the idempotency argument, if the contract names one, is Postern's).
    fn prepare_upstream(
        &self,
        t: crate::channel::upstream::UpstreamTool,
        arguments: &Value,
    ) -> Result<(Prepared<'_>, Value), EngineError> {
        let tool = Tool::upstream(
            &t.name,
            &t.description,
            &t.input_schema,
            t.contract.clone(),
            crate::channel::upstream::CALL_TIMEOUT,
            std::sync::Arc::clone(&t.validator),
        );
        let mut arguments = match arguments {
            Value::Null => json!({}),
            other => other.clone(),
        };
        if let (Some(argument), Value::Object(map)) = (&t.contract.idempotency_argument, &mut arguments) {
            // Postern fills the key; what the agent put there is not sent and not fingerprinted.
            map.remove(argument);
        }
        let checked = tool.validate_upstream_arguments(&arguments, t.contract.idempotency_argument.as_deref())?;
        let Value::Object(map) = checked.clone() else {
            return Err(RecordError::ArgumentsNotObject { found: "non-object" }.into());
        };
        let prepared = Prepared {
            shown_url: format!("mcp://{}/{}", t.server, t.tool),
            target: Target::Mcp(McpPlan {
                server: t.server,
                tool: t.tool,
                operation: t.operation,
                arguments: map,
                approve_every_use: t.approve_every_use,
            }),
            secrets: contract_secrets(&t.contract, &checked, &self.key),
            tool: ToolRef::Builtin(Box::new(tool)),
        };
        Ok((prepared, checked))
    }

    /// An SSH tool's call: the host from the vault (the manifest's, or the agent's pick for
    /// `ssh_exec`), the command with its arguments quoted.
    pub(super) fn prepare_ssh<'a>(
        &'a self,
        tool: ToolRef<'a>,
        raw: &Value,
    ) -> Result<(Prepared<'a>, Value), EngineError> {
        let arguments = tool.validate_arguments(raw)?;
        let spec = tool.ssh.clone().ok_or_else(|| EngineError::Internal("not an SSH tool".into()))?;
        let host_name = match &spec.host {
            Some(h) => h.clone(),
            None => arguments["host"].as_str().unwrap_or_default().to_owned(),
        };
        let host = self.vault.ssh_host(&host_name)?;
        let command = tool.render_ssh(&arguments)?;
        let working_dir = match &spec.host {
            Some(_) => spec.working_dir.clone(),
            None => arguments.get("working_dir").and_then(Value::as_str).map(str::to_owned),
        };
        let url = url::Url::parse(&format!("ssh://{}@{}:{}/", host.account, host.address, host.port))
            .map_err(|e| RecordError::InvalidUrl { reason: e.to_string() })?;
        let secrets = contract_secrets(&tool.contract, &arguments, &self.key);
        let prepared = Prepared {
            tool,
            shown_url: url.to_string(),
            target: Target::Ssh(SshPlan { host, command, working_dir }),
            secrets,
        };
        Ok((prepared, arguments))
    }

    /// An `accept-new` host without a pinned key: connect and authenticate once, and pin the key
    /// it presented only after authentication succeeded. Happens before the call becomes an
    /// execution (its record names the pinned key).
    pub(super) async fn pin_first_key(&self, plan: &mut SshPlan) -> Result<(), EngineError> {
        let (key, passphrase) = self.vault.ssh_key_of(&plan.host)?;
        let connection = crate::channel::ssh::connect(&plan.host, &key, passphrase.as_ref()).await?;
        let line = connection.presented.to_openssh().map_err(|e| EngineError::Internal(e.to_string()))?;
        let fingerprint = crate::channel::ssh::fingerprint(&connection.presented);
        connection.close().await;
        let (vault, connected, at) = (Arc::clone(&self.vault), plan.host.clone(), self.now());
        plan.host = tokio::task::spawn_blocking(move || vault.pin_host_key(&connected, &line, &fingerprint, at))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        Ok(())
    }

    /// The built-in `http_request`: GET/HEAD are read-only; other methods are `irreversible`
    /// unless the credential bound to the URL declares an idempotency header. The credential is
    /// chosen by the URL's bindings, never by the agent (a `credential` argument only picks
    /// between several that are bound to the URL).
    pub(super) fn prepare_http_request(&self, raw: &Value) -> Result<(Prepared<'_>, Value), EngineError> {
        let probe = Tool::http_request(
            "GET",
            "",
            postern_core::ReplayContract::read_only(),
            crate::catalog::manifest::DEFAULT_TIMEOUT,
        );
        let mut args = probe.validate_arguments(raw)?;
        let field_error =
            |field: &str, message: String| ArgumentError { tool: probe.name.clone(), field: field.into(), message };
        let method = args["method"].as_str().unwrap_or("GET").to_owned();
        let url = url::Url::parse(args["url"].as_str().unwrap_or(""))
            .map_err(|e| field_error("/url", format!("not an absolute URL: {e}")))?;
        http::check_target(&url)?;
        let mut headers = Vec::new();
        for (name, value) in args.get("headers").and_then(Value::as_object).into_iter().flatten() {
            if crate::catalog::manifest::RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(field_error(
                    &format!("/headers/{name}"),
                    "credentials come from the vault; this header cannot be set".into(),
                )
                .into());
            }
            let value = value.as_str().unwrap_or_default();
            // Checked here, before anything is journaled: a header the HTTP stack would refuse
            // must not become an execution that fails after `dispatched`.
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(field_error(&format!("/headers/{name}"), "not a valid HTTP header name".into()).into());
            }
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                return Err(field_error(
                    &format!("/headers/{name}"),
                    "not a valid HTTP header value (visible ASCII, no line breaks)".into(),
                )
                .into());
            }
            headers.push((name.to_ascii_lowercase(), value.to_owned()));
        }
        let bound: Vec<postern_vault::Credential> =
            self.vault.credentials()?.into_iter().filter(|c| c.allows(&url)).collect();
        let credential = match args.get("credential").and_then(Value::as_str) {
            Some(name) => Some(bound.iter().find(|c| c.name == name).cloned().ok_or_else(|| {
                EngineError::CredentialNotBound { credential: name.to_owned(), url: url.to_string() }
            })?),
            None if bound.len() > 1 => {
                let names: Vec<&str> = bound.iter().map(|c| c.name.as_str()).collect();
                return Err(field_error(
                    "/credential",
                    format!("several credentials are bound to this URL; choose one of {names:?}"),
                )
                .into());
            }
            None => bound.into_iter().next(),
        };
        let mut contract = postern_core::ReplayContract::read_only();
        contract.semantic_headers = headers.iter().map(|(k, _)| k.clone()).collect();
        let reads_have_effects = credential.as_ref().is_some_and(|c| c.reads_have_effects);
        if reads_have_effects || !postern_core::contract::is_safe_method(&method) {
            match credential.as_ref().and_then(|c| c.idempotency_header.clone()) {
                Some(header) => {
                    contract.class = postern_core::ReplayClass::IdempotencyKey;
                    contract.idempotency_header = Some(header);
                }
                None => contract.class = postern_core::ReplayClass::Irreversible,
            }
        }
        let (body, content_type) = crate::catalog::manifest::http_request_body(args.get("body"));
        // Several Content-Type headers (names differing in case): none is normalised away, and
        // the body is taken byte for byte (which one a target reads is its own business).
        let types: Vec<&str> = headers.iter().filter(|(k, _)| k == "content-type").map(|(_, v)| v.trim()).collect();
        let several_types = types.len() > 1;
        let given_type = types.first().map(|t| (*t).to_owned());
        if let (Some(_), Some(content_type)) = (&body, content_type) {
            match &given_type {
                // The header the gateway would add anyway: what is sent is the same without it.
                Some(given) if !several_types && given.eq_ignore_ascii_case(content_type) => {
                    contract.semantic_headers.remove("content-type");
                    if let Some(Value::Object(given)) = args.get_mut("headers") {
                        given.retain(|name, _| !name.eq_ignore_ascii_case("content-type"));
                    }
                }
                Some(_) => {}
                None => headers.push(("content-type".into(), content_type.into())),
            }
        }
        // Header names are case-insensitive: the record spells them in lower case (unless two
        // names differ only in case, which is then kept as given), and no headers is `{}`.
        if let Some(Value::Object(given)) = args.get_mut("headers") {
            let lower: serde_json::Map<String, Value> =
                given.iter().map(|(name, value)| (name.to_ascii_lowercase(), value.clone())).collect();
            if lower.len() == given.len() {
                *given = lower;
            }
            if given.is_empty() {
                args.as_object_mut().map(|a| a.remove("headers"));
            }
        }
        // Headers and query parameters named like secrets (an agent's own API key, a signed URL)
        // are kept out of the record, the journal and the approval text.
        let mut secrets = CallSecrets::default();
        for (name, value) in headers.iter().filter(|(name, _)| crate::catalog::redaction::sensitive_name(name)) {
            secrets.add(name, &Value::String(value.clone()), &self.key);
        }
        for (name, value) in url.query_pairs().filter(|(name, _)| crate::catalog::redaction::sensitive_name(name)) {
            secrets.add(&name, &Value::String(value.into_owned()), &self.key);
        }
        // A string body that is JSON enters the record as its value (models write a body out
        // again when they retry); the bytes sent are still the agent's own. Not when a secret
        // the call carries is spelled in it: the record masks secrets in strings only, so the
        // body stays one (masked) string.
        if let Some(Value::String(text)) = args.get("body") {
            let json_type = given_type.as_deref().map_or(content_type == Some("application/json"), is_json_media_type);
            let holds_secret = !secrets.is_empty() && secrets.mask(text) != *text;
            if let Some(value) = (json_type && !holds_secret && !several_types)
                .then(|| postern_core::canonical::json_text(text))
                .flatten()
            {
                args["body"] = value;
            }
        }
        let tool = Tool::http_request(&method, url.as_str(), contract, crate::catalog::manifest::DEFAULT_TIMEOUT);
        let shown_url = secrets.mask(url.as_str());
        let prepared = Prepared {
            tool: ToolRef::Builtin(Box::new(tool)),
            target: Target::Http(HttpPlan { url, method, headers, body, credential }),
            secrets,
            shown_url,
        };
        Ok((prepared, args))
    }

    /// The execution a new call would become (its canonical record and fingerprint).
    pub(super) fn admission(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        arguments: Value,
    ) -> Result<NewExecution, EngineError> {
        // A contract may widen the scope beyond the agent run (docs/src/design.md, the intent scope: e.g. a rotation).
        let intent_scope = match p.tool.contract.scope {
            postern_core::contract::ScopePolicy::Durable => IntentScope::durable(),
            postern_core::contract::ScopePolicy::AgentRun => call.intent_scope.clone(),
        };
        let target = match &p.target {
            Target::Ssh(plan) => ActionTarget::Ssh(postern_core::SshAction {
                host_key_fingerprint: plan.host.host_key_fingerprint.clone().unwrap_or_default(),
                account: plan.host.account.clone(),
                working_dir: plan.working_dir.clone(),
                command: p.shown_command(plan),
            }),
            Target::Mcp(plan) => ActionTarget::Mcp(postern_core::McpAction {
                server: plan.server.clone(),
                tool: plan.tool.clone(),
                operation: plan.operation,
            }),
            Target::Http(plan) => ActionTarget::Http(HttpAction {
                method: plan.method.clone(),
                url: p.shown_url.clone(),
                headers: plan.headers.iter().map(|(k, v)| (k.clone(), p.secrets.mask(v))).collect(),
            }),
        };
        // Secrets the agent put elsewhere in its arguments (a URL, a header of `http_request`)
        // are masked there too; the contract's secret fields are digested by the record itself.
        let arguments = mask_arguments(&arguments, &p.secrets, &p.tool.contract.secret_fields);
        let action = CanonicalAction::build(
            &ActionRequest {
                actor: call.actor.clone(),
                tool: p.tool.name.clone(),
                target,
                credential_ref: p.credential().map(|c| c.name.clone()),
                arguments,
                intent_scope: intent_scope.clone(),
            },
            &p.tool.contract,
            &self.key,
        )?;
        let at = self.now();
        let mut random = [0u8; 16];
        getrandom_fill(&mut random)?;
        Ok(NewExecution {
            id: ExecutionId::from_parts(at, u128::from_le_bytes(random)),
            fingerprint: action.fingerprint(&self.key),
            // Side-effecting executions only: a read costs the effect index nothing.
            effect_fingerprint: (p.tool.contract.class != postern_core::ReplayClass::ReadOnly)
                .then(|| action.effect_fingerprint(&self.key)),
            actor: call.actor.clone(),
            intent_scope,
            session_id: call.session,
            tool: p.tool.name.clone(),
            channel: p.channel(),
            contract: p.tool.contract.clone(),
            record: action.record().clone(),
            correlation: call.correlation.clone(),
            at,
        })
    }
}

/// `application/json`, or a structured `+json` type (RFC 6839), whatever its parameters.
fn is_json_media_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The contract's secret arguments of a call (every string and number inside them).
fn contract_secrets(contract: &postern_core::ReplayContract, arguments: &Value, key: &FingerprintKey) -> CallSecrets {
    let mut secrets = CallSecrets::default();
    for name in &contract.secret_fields {
        if let Some(value) = arguments.get(name) {
            secrets.add(name, value, key);
        }
    }
    secrets
}

/// `arguments` with every string (outside the contract's secret fields, which the record digests)
/// masked by `secrets`.
fn mask_arguments(arguments: &Value, secrets: &CallSecrets, secret_fields: &BTreeSet<String>) -> Value {
    fn mask(value: &Value, secrets: &CallSecrets) -> Value {
        match value {
            Value::String(text) => Value::String(secrets.mask(text)),
            Value::Array(items) => Value::Array(items.iter().map(|v| mask(v, secrets)).collect()),
            Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), mask(v, secrets))).collect()),
            other => other.clone(),
        }
    }
    if secrets.is_empty() {
        return arguments.clone();
    }
    match arguments {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), if secret_fields.contains(k) { v.clone() } else { mask(v, secrets) }))
                .collect(),
        ),
        other => mask(other, secrets),
    }
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), EngineError> {
    getrandom::fill(buf).map_err(|e| EngineError::Internal(format!("no randomness: {e}")))
}
