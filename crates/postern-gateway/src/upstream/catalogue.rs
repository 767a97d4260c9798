//! What the running upstream servers offer, as agents see it: each tool namespaced
//! (`<server>__<tool>`) with the replay contract Postern holds it to (derived from its
//! annotations unless the owner overrides them), resources as `postern://<server>/<uri>`,
//! prompts as `<server>__<prompt>`. A hostile server names things to deceive: a tool, resource
//! or prompt whose name is not made of the MCP name characters, or a resource whose URI holds
//! anything but visible ASCII, is not offered.

use super::{RESOURCE_PREFIX, Running, SEPARATOR, ToolOverride, UpstreamTool};
use crate::redaction::CallSecrets;
use postern_core::{AttachWindow, ReplayClass, ReplayContract};
use postern_vault::Vault;
use rmcp::model::Tool as RmcpTool;
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

/// Clients refuse tool names longer than this.
pub const MAX_TOOL_NAME: usize = 64;

/// What one server offers, listed at its start and again after it said its tools changed.
#[derive(Clone, Default)]
pub(super) struct Listing {
    pub(super) tools: Vec<RmcpTool>,
    pub(super) resources: Vec<rmcp::model::Resource>,
    pub(super) resource_templates: Vec<rmcp::model::ResourceTemplate>,
    pub(super) prompts: Vec<rmcp::model::Prompt>,
}

impl Listing {
    /// The listing with every secret the server was given masked wherever it shows (names,
    /// descriptions, schemas, URIs): a server can put its own token in a tool's description, and
    /// what it lists reaches every agent. An item that no longer reads after masking is dropped.
    pub(super) fn masked(self, secrets: &CallSecrets) -> Listing {
        fn each<T: serde::Serialize + serde::de::DeserializeOwned>(secrets: &CallSecrets, items: Vec<T>) -> Vec<T> {
            items
                .into_iter()
                .filter_map(|item| {
                    let mut value = serde_json::to_value(&item).ok()?;
                    if !secrets.mask_json(&mut value) {
                        return Some(item);
                    }
                    serde_json::from_value(value).ok()
                })
                .collect()
        }
        if secrets.is_empty() {
            return self;
        }
        Listing {
            tools: each(secrets, self.tools),
            resources: each(secrets, self.resources),
            resource_templates: each(secrets, self.resource_templates),
            prompts: each(secrets, self.prompts),
        }
    }
}

/// What the running servers offer, for the synchronous paths (lists, call preparation).
#[derive(Default)]
pub(super) struct Catalogue {
    pub(super) tools: HashMap<String, UpstreamTool>,
    /// Namespaced as agents see them.
    pub(super) resources: Vec<rmcp::model::Resource>,
    pub(super) resource_templates: Vec<rmcp::model::ResourceTemplate>,
    pub(super) prompts: Vec<rmcp::model::Prompt>,
}

/// Is a resource's URI (or URI template) one Postern offers? Visible ASCII only, as RFC 3986
/// and 6570 spell them: no control characters, spaces or look-alike Unicode.
pub fn uri_ok(uri: &str) -> bool {
    !uri.is_empty() && uri.bytes().all(|b| b.is_ascii_graphic())
}

impl Catalogue {
    /// The catalogue of `running` servers (by name), with the owner's `overrides` from
    /// `tools.toml` and the contracts kept on each server's vault record.
    pub(super) fn build(
        running: &[(String, Arc<Running>)],
        overrides: &BTreeMap<String, BTreeMap<String, ToolOverride>>,
        vault: &Vault,
    ) -> Catalogue {
        let mut catalogue = HashMap::new();
        let (mut resources, mut resource_templates, mut prompts) = (Vec::new(), Vec::new(), Vec::new());
        let offered = |server: &str, what: &str, name: &str| {
            let ok = tool_name_ok(name) && server.len() + SEPARATOR.len() + name.len() <= MAX_TOOL_NAME;
            if !ok {
                tracing::warn!(%server, name = %postern_core::Outside::line(name), "upstream {what} not offered: its name is not 1–64 characters of letters, digits, `_`, `-`, `.` or `/` once namespaced");
            }
            ok
        };
        for (server, running) in running {
            // The owner's settings (a contract, approve-every-use) are part of what a tool is:
            // a server whose record cannot be read offers nothing, rather than tools that
            // silently lost them.
            let server_def = match vault.mcp_server(server) {
                Ok(def) => def,
                Err(e) => {
                    tracing::warn!(%server, error = %e, "upstream tools not offered: the server's record could not be read");
                    continue;
                }
            };
            let listing = running.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for r in &listing.resources {
                if !offered(server, "resource", &r.name) || !uri_ok(&r.uri) {
                    continue;
                }
                let mut r = r.clone();
                r.uri = format!("{RESOURCE_PREFIX}{server}/{}", r.uri);
                r.name = format!("{server}{SEPARATOR}{}", r.name);
                resources.push(r);
            }
            for t in &listing.resource_templates {
                if !offered(server, "resource template", &t.name) || !uri_ok(&t.uri_template) {
                    continue;
                }
                let mut t = t.clone();
                t.uri_template = format!("{RESOURCE_PREFIX}{server}/{}", t.uri_template);
                t.name = format!("{server}{SEPARATOR}{}", t.name);
                resource_templates.push(t);
            }
            for p in &listing.prompts {
                if !offered(server, "prompt", &p.name) {
                    continue;
                }
                let mut p = p.clone();
                p.name = format!("{server}{SEPARATOR}{}", p.name);
                prompts.push(p);
            }
            let overrides = overrides.get(server);
            for t in &listing.tools {
                if !offered(server, "tool", &t.name) {
                    continue;
                }
                let name = format!("{server}{SEPARATOR}{}", t.name);
                // tools.toml is the file the owner keeps under version control: it wins over a
                // setting made in the app, which refuses to edit a tool the file decides.
                let (over, source) = match overrides.and_then(|o| o.get(t.name.as_ref())) {
                    Some(o) => (Some(o), "tools.toml"),
                    None => (server_def.tools.get(t.name.as_ref()), "owner"),
                };
                let (contract, contract_source) = derive_contract(t, over);
                let contract_source = if contract_source == OVERRIDE { source } else { contract_source };
                let input_schema = Value::Object((*t.input_schema).clone());
                let validator = jsonschema::validator_for(&input_schema).unwrap_or_else(|e| {
                    tracing::warn!(%server, tool = %t.name, error = %postern_core::Outside::line(&e.to_string()), "upstream input schema does not compile; arguments are not checked");
                    jsonschema::validator_for(&json!({})).expect("the empty schema compiles")
                });
                catalogue.insert(
                    name.clone(),
                    UpstreamTool {
                        server: server.clone(),
                        tool: t.name.to_string(),
                        name,
                        description: t.description.as_deref().unwrap_or_default().to_owned(),
                        input_schema,
                        contract,
                        contract_source,
                        hinted: hinted_class(t),
                        approve_every_use: over.is_some_and(|o| o.approve_every_use) || server_def.approve_every_use,
                        validator: Arc::new(validator),
                        operation: "tools/call",
                    },
                );
            }
        }
        resources.sort_by(|a, b| a.uri.cmp(&b.uri));
        resource_templates.sort_by(|a, b| a.uri_template.cmp(&b.uri_template));
        prompts.sort_by(|a, b| a.name.cmp(&b.name));
        Catalogue { tools: catalogue, resources, resource_templates, prompts }
    }
}

/// What [`derive_contract`] says when an override decided the class; [`Upstreams`] names which
/// (`tools.toml` or `owner`).
const OVERRIDE: &str = "override";

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

/// Is an upstream tool's name one Postern offers? The MCP tool-name characters only (letters,
/// digits, `_`, `-`, `.`, `/`): a hostile server cannot put control characters, spaces or
/// look-alike Unicode into the names agents and reviewers read.
pub fn tool_name_ok(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
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

/// The read-only operation `operation` on `server`, as the engine runs it.
pub(super) fn read_operation(server: &str, operation: &'static str) -> UpstreamTool {
    static ANY: std::sync::LazyLock<Arc<jsonschema::Validator>> = std::sync::LazyLock::new(|| {
        Arc::new(jsonschema::validator_for(&json!({})).expect("the empty schema compiles"))
    });
    UpstreamTool {
        server: server.to_owned(),
        tool: operation.to_owned(),
        name: format!("{server}{SEPARATOR}{operation}"),
        description: format!("{operation} on MCP server {server}"),
        input_schema: json!({ "type": "object" }),
        contract: ReplayContract::read_only(),
        contract_source: "default",
        hinted: None,
        approve_every_use: false,
        validator: Arc::clone(&ANY),
        operation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ToolAnnotations;
    use serde_json::Map;

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
        for (name, ok) in [
            ("create_issue", true),
            ("files/read.v2", true),
            ("", false),
            ("pay\u{1b}[2J", false),
            ("pay now", false),
            ("p\u{430}y", false),
            ("a\u{202e}b", false),
            ("$(id)", false),
        ] {
            assert_eq!(tool_name_ok(name), ok, "{name:?}");
        }
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
