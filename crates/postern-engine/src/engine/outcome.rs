//! The outcome stage: the one place where what a channel sent back — an HTTP answer, SSH output,
//! an upstream MCP server's result, a stored result returned on a retry — becomes what is
//! answered, journaled or logged. It masks every secret the call carried (the vault credential
//! it injected, an SSH host's key, an upstream server's secret environment, arguments and
//! credential, the contract's secret arguments) in every spelling, flags the result, and caps
//! its size with one limit for every channel.
//!
//! The types say so: a channel hands back an [`Observation`] holding a [`Raw`] result; only this
//! module turns one into a [`Settled`] result (what a [`CallOutcome`] carries) and a
//! [`Completion`] (what the journal stores).

use super::*;
use crate::{channel::ssh::SshResult, channel::upstream::UpstreamResult};
use serde::Serialize;

/// A channel's result as it came back: not yet through the stage, so never answered, journaled
/// or logged as it is.
#[derive(Debug)]
pub(super) enum Raw {
    Http(HttpResult),
    Ssh(SshResult),
    Upstream(UpstreamResult),
}

/// What one send observed, before the stage.
#[derive(Debug)]
pub(super) struct Observation {
    pub(super) state: ExecutionState,
    pub(super) raw: Option<Raw>,
    /// What the `completed` row records beside the result (status, elapsed, how it was
    /// verified).
    pub(super) outcome: Value,
    /// Why, for states without a result. May hold outside text (an upstream's error message).
    pub(super) detail: StepDetail,
    /// The channel stopped reading at the limit: the answer was larger.
    pub(super) over_limit: bool,
}

impl Observation {
    /// A state without a result (denied, failed before dispatch, outcome unknown, …).
    pub(super) fn without_result(state: ExecutionState, detail: StepDetail) -> Observation {
        Observation { state, raw: None, outcome: Value::Null, detail, over_limit: false }
    }

    /// An observed outcome with its result.
    pub(super) fn completed(raw: Raw, outcome: Value) -> Observation {
        Observation {
            state: ExecutionState::Completed,
            raw: Some(raw),
            outcome,
            detail: StepDetail::default(),
            over_limit: false,
        }
    }
}

/// A result that went through the outcome stage: its secrets masked, its size within the limit.
/// Only the stage makes one; read it through `Deref`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Settled<T>(T);

impl<T> std::ops::Deref for Settled<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Settled<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

/// What the stage hands on: the state, what the agent is answered, and what the journal keeps.
#[derive(Debug, Default)]
pub(super) struct Staged {
    pub(super) answer: Option<Settled<ChannelAnswer>>,
    pub(super) detail: StepDetail,
    pub(super) completion: Option<Completion>,
}

/// What a channel sent back: one variant per channel. The stage works on it, and a
/// [`CallOutcome`] carries it as a [`Settled`] (serialized as the result itself).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChannelAnswer {
    Http(HttpResult),
    Ssh(SshResult),
    Upstream(UpstreamResult),
}

impl ChannelAnswer {
    /// Masks every secret in the result in place; whether there was one.
    fn mask(&mut self, secrets: &CallSecrets) -> bool {
        if secrets.is_empty() {
            return false;
        }
        let min = crate::catalog::redaction::MIN_SEARCHED;
        let text = |s: &mut String| {
            let (masked, found) = secrets.mask_bytes(s.as_bytes(), min);
            if found {
                *s = String::from_utf8(masked).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            }
            found
        };
        match self {
            ChannelAnswer::Http(r) => {
                // The body as text first: a target can send text that merely starts with
                // `base64:`. Then, if it is the channel's spelling of a binary body, the bytes.
                let mut found = text(&mut r.body);
                if let Some(encoded) = r.body.strip_prefix("base64:") {
                    use base64::Engine as _;
                    let engine = base64::engine::general_purpose::STANDARD;
                    if let Ok(bytes) = engine.decode(encoded) {
                        let (masked, any) = secrets.mask_bytes(&bytes, min);
                        if any {
                            r.body = format!("base64:{}", engine.encode(masked));
                            found = true;
                        }
                    }
                }
                for (_, value) in &mut r.headers {
                    found |= text(value);
                }
                r.secret_echoed |= found;
                found
            }
            ChannelAnswer::Ssh(r) => {
                let found = text(&mut r.stdout) | text(&mut r.stderr);
                r.secret_echoed |= found;
                found
            }
            ChannelAnswer::Upstream(r) => {
                let found = secrets.mask_json(&mut r.upstream_result);
                r.secret_echoed |= found;
                found
            }
        }
    }

    /// The result without its content, saying it was larger than `limit`.
    fn too_large(&mut self, limit: usize) {
        let limit = Some(limit as u64);
        match self {
            ChannelAnswer::Http(r) => {
                r.body = String::new();
                r.result_too_large = limit;
            }
            ChannelAnswer::Ssh(r) => {
                r.stdout = String::new();
                r.stderr = String::new();
                r.truncated = false;
                r.result_too_large = limit;
            }
            ChannelAnswer::Upstream(r) => {
                r.upstream_result = Value::Null;
                r.result_too_large = limit;
            }
        }
    }

    /// The channel read past its limit (an SSH command's output goes on past it).
    fn over_limit(&self) -> bool {
        matches!(self, ChannelAnswer::Ssh(r) if r.truncated)
    }

    fn secret_echoed(&self) -> bool {
        match self {
            ChannelAnswer::Http(r) => r.secret_echoed,
            ChannelAnswer::Ssh(r) => r.secret_echoed,
            ChannelAnswer::Upstream(r) => r.secret_echoed,
        }
    }

    fn to_bytes(&self) -> Result<Vec<u8>, EngineError> {
        let bytes = match self {
            ChannelAnswer::Http(r) => serde_json::to_vec(r),
            ChannelAnswer::Ssh(r) => serde_json::to_vec(r),
            ChannelAnswer::Upstream(r) => serde_json::to_vec(r),
        };
        bytes.map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// A stored result, read back by its shape.
    fn from_stored(id: ExecutionId, body: &[u8]) -> Result<ChannelAnswer, EngineError> {
        let corrupt = |e: serde_json::Error| EngineError::Internal(format!("stored result of {id}: {e}"));
        let value: Value = serde_json::from_slice(body).map_err(corrupt)?;
        Ok(if value.get("status").is_some() {
            ChannelAnswer::Http(serde_json::from_value(value).map_err(corrupt)?)
        } else if value.get("server").is_some() {
            ChannelAnswer::Upstream(serde_json::from_value(value).map_err(corrupt)?)
        } else {
            ChannelAnswer::Ssh(serde_json::from_value(value).map_err(corrupt)?)
        })
    }

    fn settle(self, staged: &mut Staged) {
        staged.answer = Some(Settled(self));
    }
}

impl From<Raw> for ChannelAnswer {
    fn from(raw: Raw) -> ChannelAnswer {
        match raw {
            Raw::Http(r) => ChannelAnswer::Http(r),
            Raw::Ssh(r) => ChannelAnswer::Ssh(r),
            Raw::Upstream(r) => ChannelAnswer::Upstream(r),
        }
    }
}

impl Engine {
    /// The stage: `observed` with every secret in `secrets` masked (its result, its detail) and
    /// its result held to the limit; a completed observation also yields what the journal stores.
    pub(super) fn stage(&self, secrets: &CallSecrets, observed: Observation) -> Result<Staged, EngineError> {
        let Observation { raw, mut outcome, mut detail, over_limit, .. } = observed;
        detail.mask_with(|v| {
            secrets.mask_json(v);
        });
        let mut staged = Staged { detail, ..Staged::default() };
        let Some(raw) = raw else { return Ok(staged) };
        let mut result = ChannelAnswer::from(raw);
        result.mask(secrets);
        let mut bytes = result.to_bytes()?;
        let too_large = over_limit || result.over_limit() || bytes.len() > self.max_result_bytes;
        if too_large {
            result.too_large(self.max_result_bytes);
            bytes = result.to_bytes()?;
        }
        secrets.mask_json(&mut outcome);
        if let Value::Object(fields) = &mut outcome {
            fields.insert("secret_echoed".into(), json!(result.secret_echoed()));
            if too_large {
                fields.insert("result_too_large".into(), json!({ "limit": self.max_result_bytes }));
            }
        }
        staged.completion = Some(Completion { outcome, result: bytes, at: self.now() });
        result.settle(&mut staged);
        Ok(staged)
    }

    /// A stored result on its way back to an agent (a retry answered from the record, a resumed
    /// stream, `execution_status`): through the same stage, with the secrets of the call that
    /// asks and, for an upstream's result, the server's (which may have changed since it was
    /// stored).
    pub(super) fn stage_stored(
        &self,
        id: ExecutionId,
        secrets: &CallSecrets,
        body: &[u8],
    ) -> Result<Staged, EngineError> {
        let mut result = ChannelAnswer::from_stored(id, body)?;
        if let (ChannelAnswer::Upstream(r), Some(u)) = (&result, &self.upstreams) {
            let mut with_server = secrets.clone();
            with_server.extend(&u.secrets_of(&r.server));
            result.mask(&with_server);
        } else {
            result.mask(secrets);
        }
        if result.to_bytes()?.len() > self.max_result_bytes {
            result.too_large(self.max_result_bytes);
        }
        let mut staged = Staged::default();
        result.settle(&mut staged);
        Ok(staged)
    }

    /// The stored result of execution `id` as `execution_status` reports it: through the stage
    /// (it was masked when it was stored; an upstream server's secrets are looked for again).
    pub fn result_on_record(&self, id: ExecutionId) -> Result<Value, EngineError> {
        let Some(stored) = self.store.view().result(id)? else { return Ok(Value::Null) };
        let staged = self.stage_stored(id, &CallSecrets::default(), &stored.body)?;
        Ok(staged.answer.map_or(Value::Null, |a| json!(a)))
    }

    /// Every secret a call carries, for the stage: its secret arguments, and what its channel
    /// adds — the credential injected (`wire` when it was built for sending; otherwise read from
    /// the vault, while it is unlocked), an SSH host's key, an upstream server's secrets.
    pub(super) fn call_secrets(&self, p: &Prepared<'_>, wire: Option<&Wire>) -> CallSecrets {
        let mut secrets = p.secrets.clone();
        match (wire, &p.target) {
            (Some(Wire::Http(out)), _) => {
                if let Some(c) = &out.credential {
                    secrets.extend(c.secrets());
                }
            }
            (Some(Wire::Ssh(out)), _) => {
                secrets.add_vault_secret(out.key.expose());
                if let Some(passphrase) = &out.passphrase {
                    secrets.add_vault_secret(passphrase.expose());
                }
            }
            (Some(Wire::Mcp(out)), _) => {
                if let Some(u) = &self.upstreams {
                    secrets.extend(&u.secrets_of(&out.server));
                }
            }
            (None, Target::Http(plan)) => {
                if let Some(c) = &plan.credential
                    && let Ok(secret) = self.vault.secret_of(c)
                {
                    secrets.add_credential(&c.kind, secret.expose());
                }
            }
            (None, Target::Ssh(plan)) => {
                if let Ok((key, passphrase)) = self.vault.ssh_key_of(&plan.host) {
                    secrets.add_vault_secret(key.expose());
                    if let Some(passphrase) = passphrase {
                        secrets.add_vault_secret(passphrase.expose());
                    }
                }
            }
            (None, Target::Mcp(plan)) => {
                if let Some(u) = &self.upstreams {
                    secrets.extend(&u.secrets_of(&plan.server));
                }
            }
        }
        secrets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target's text that merely starts like the channel's spelling of a binary body is still
    /// searched as text; a real binary body is searched as its bytes.
    #[test]
    fn a_body_is_masked_as_text_whatever_it_starts_with_and_as_bytes_when_binary() {
        use base64::Engine as _;
        let token = "ghp_CANARY0123456789abcdef";
        let mut secrets = CallSecrets::default();
        secrets.add_vault_secret(token);
        let http = |body: String| HttpResult {
            status: 200,
            headers: vec![],
            body,
            truncated: false,
            secret_echoed: false,
            result_too_large: None,
        };
        let binary = format!(
            "base64:{}",
            base64::engine::general_purpose::STANDARD.encode(format!("\u{0}\u{ff}{token}\u{1}").as_bytes())
        );
        for body in [format!("base64:! {token}"), format!("base64:{token}"), binary] {
            let mut result = ChannelAnswer::Http(http(body.clone()));
            assert!(result.mask(&secrets), "{body}");
            let ChannelAnswer::Http(r) = result else { unreachable!() };
            let decoded = r
                .body
                .strip_prefix("base64:")
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .unwrap_or_default();
            assert!(
                !r.body.contains(token) && !String::from_utf8_lossy(&decoded).contains(token),
                "{body} → {}",
                r.body
            );
            assert!(r.secret_echoed);
        }
    }
}
