//! The replay contract an upstream MCP tool is held to: the owner's word (`tools.toml`, the app,
//! `postern servers contract`) where there is one, else `irreversible`. A server's annotations
//! are suggestions until the owner confirms them, and its arguments named like secrets are the
//! contract's secrets. Here, beside the manifest, because `tools.toml` overrides are checked
//! against it when the manifest loads.

use postern_core::{AttachWindow, ReplayClass, ReplayContract};
use postern_vault::ToolOverride;
use rmcp::model::Tool as RmcpTool;
use serde_json::Value;
use std::collections::BTreeSet;

/// What [`derive_contract`] says when an override decided the class; the catalogue names which
/// (`tools.toml` or `owner`).
pub(crate) const OVERRIDE: &str = "override";

/// The contract source of a tool whose server hints at a class the owner has not confirmed.
pub const HINTS_UNCONFIRMED: &str = "hints_unconfirmed";

/// The class an upstream tool's annotations suggest, if any: `readOnlyHint` → `read_only`,
/// `idempotentHint` → `idempotent`. Only a suggestion: the server (hostile or wrong, like any
/// upstream) makes the claim, and a wrong claim would turn an uncertain outcome into a second
/// effect. It takes effect once the owner confirms it ([`derive_contract`]).
pub fn hinted_class(tool: &RmcpTool) -> Option<ReplayClass> {
    let a = tool.annotations.as_ref();
    let hint = |f: fn(&rmcp::model::ToolAnnotations) -> Option<bool>| a.and_then(f) == Some(true);
    if hint(|a| a.read_only_hint) {
        Some(ReplayClass::ReadOnly)
    } else if hint(|a| a.idempotent_hint) {
        Some(ReplayClass::Idempotent)
    } else {
        None
    }
}

/// Where an upstream tool's contract comes from: the owner's override (`tools.toml`, the app,
/// `postern servers contract`), else `irreversible`. The server's annotations never decide by
/// themselves: until the owner confirms what they suggest ([`hinted_class`]), an uncertain
/// outcome is never re-sent and a repeat is matched like an irreversible call (the source then
/// says [`HINTS_UNCONFIRMED`], so every listing can ask the owner to confirm).
pub fn derive_contract(tool: &RmcpTool, over: Option<&ToolOverride>) -> (ReplayContract, &'static str) {
    let key_argument = over.and_then(|o| o.idempotency_argument.as_deref());
    let mut secret_fields: BTreeSet<String> = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().filter(|k| secret_argument_name(k)).cloned().collect())
        .unwrap_or_default();
    secret_fields.extend(over.map(|o| o.secret_arguments.iter().cloned()).into_iter().flatten());
    secret_fields.retain(|k| Some(k.as_str()) != key_argument);
    let base = ReplayContract {
        attach_window: AttachWindow::Millis(15 * 60 * 1000),
        secret_fields,
        ..ReplayContract::read_only()
    };
    if let Some(o) = over
        && let Some(class) = o.class
    {
        return (ReplayContract { class, idempotency_argument: o.idempotency_argument.clone(), ..base }, OVERRIDE);
    }
    if let Some(argument) = over.and_then(|o| o.idempotency_argument.clone()) {
        let c = ReplayContract { class: ReplayClass::IdempotencyKey, idempotency_argument: Some(argument), ..base };
        return (c, OVERRIDE);
    }
    let source = if hinted_class(tool).is_some() { HINTS_UNCONFIRMED } else { "default" };
    (ReplayContract { class: ReplayClass::Irreversible, ..base }, source)
}

/// Is an upstream tool's argument with this name a secret by its name? Narrower than the header
/// rule (`key` alone is a map key, a sort key, a Redis key): tokens, secrets, passwords, API,
/// access and private keys, credentials, authorization values and cookies.
pub fn secret_argument_name(name: &str) -> bool {
    let flat: String = name.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    SECRET_ARGUMENT_PARTS.iter().any(|part| flat.contains(part))
}

/// The parts of a name (lower-cased, punctuation removed) that make an argument a secret.
pub const SECRET_ARGUMENT_PARTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "apikey",
    "accesskey",
    "privatekey",
    "credential",
    "authorization",
    "cookie",
];

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ToolAnnotations;
    use serde_json::{Map, json};
    use std::sync::Arc;

    fn tool(annotations: Option<ToolAnnotations>) -> RmcpTool {
        let mut t = RmcpTool::new("t", "a tool", Arc::new(Map::new()));
        t.annotations = annotations;
        t
    }

    #[test]
    fn contracts_follow_annotations_unless_the_owner_overrides_them() {
        let class = |t: &RmcpTool, o: Option<&ToolOverride>| derive_contract(t, o).0.class;
        let derived = |t: &RmcpTool| {
            let (c, source) = derive_contract(t, None);
            (c.class, source, hinted_class(t))
        };
        assert_eq!(derived(&tool(None)), (ReplayClass::Irreversible, "default", None));
        // Hints are suggestions until the owner confirms them: irreversible meanwhile.
        let read_only = tool(Some(ToolAnnotations::new().read_only(true)));
        assert_eq!(derived(&read_only), (ReplayClass::Irreversible, HINTS_UNCONFIRMED, Some(ReplayClass::ReadOnly)));
        let idempotent = tool(Some(ToolAnnotations::new().idempotent(true)));
        assert_eq!(derived(&idempotent), (ReplayClass::Irreversible, HINTS_UNCONFIRMED, Some(ReplayClass::Idempotent)));
        // A destructive hint alongside idempotent still suggests idempotent.
        let both = tool(Some(ToolAnnotations::new().idempotent(true).destructive(true)));
        assert_eq!(hinted_class(&both), Some(ReplayClass::Idempotent));
        // Confirming is the owner setting the class the hints suggest.
        let confirmed = ToolOverride { class: Some(ReplayClass::ReadOnly), ..Default::default() };
        assert_eq!(
            derive_contract(&read_only, Some(&confirmed)),
            (ReplayContract { class: ReplayClass::ReadOnly, ..derive_contract(&read_only, None).0 }, "override")
        );
        // An override that says nothing of the class (every use approved) confirms nothing.
        let every_use = ToolOverride { approve_every_use: true, ..Default::default() };
        assert_eq!(derive_contract(&read_only, Some(&every_use)).1, HINTS_UNCONFIRMED);
        // The owner's word beats the server's hints, both ways.
        let keyed = ToolOverride { idempotency_argument: Some("idempotencyKey".into()), ..Default::default() };
        let (c, source) = derive_contract(&tool(Some(ToolAnnotations::new().read_only(true))), Some(&keyed));
        assert_eq!(
            (c.class, c.idempotency_argument.as_deref(), source),
            (ReplayClass::IdempotencyKey, Some("idempotencyKey"), "override")
        );
        let distrust = ToolOverride { class: Some(ReplayClass::Irreversible), ..Default::default() };
        assert_eq!(
            class(&tool(Some(ToolAnnotations::new().read_only(true))), Some(&distrust)),
            ReplayClass::Irreversible
        );
        for (name, secret) in [
            ("api_key", true),
            ("GITHUB_TOKEN", true),
            ("private-key", true),
            ("key", false),
            ("keyword", false),
            ("sort_key", false),
            ("passwd", true),
        ] {
            assert_eq!(secret_argument_name(name), secret, "{name}");
        }
        // Arguments named like secrets, and those the owner names, are the contract's secrets.
        let mut with_token = tool(None);
        with_token.input_schema = Arc::new(
            json!({ "properties": { "api_token": {}, "amount": {}, "memo": {}, "idempotencyKey": {} } })
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let memo = ToolOverride { secret_arguments: ["memo".into()].into(), ..keyed.clone() };
        let (c, _) = derive_contract(&with_token, Some(&memo));
        assert_eq!(c.secret_fields, ["api_token".to_owned(), "memo".to_owned()].into(), "the key is not a secret");
        for (t, o) in [(tool(None), None), (tool(None), Some(&keyed))] {
            let (c, _) = derive_contract(&t, o);
            c.validate("t", postern_core::Channel::Mcp).expect("derived contracts are valid");
        }
    }
}
