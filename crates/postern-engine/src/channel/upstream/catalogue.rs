//! What the running upstream servers offer, as agents see it: each tool namespaced
//! (`<server>__<tool>`) with the replay contract Postern holds it to (derived from its
//! annotations unless the owner overrides them), resources as `postern://<server>/<uri>`,
//! prompts as `<server>__<prompt>`. A hostile server names things to deceive: a tool, resource
//! or prompt whose name is not made of the MCP name characters, or a resource whose URI holds
//! anything but visible ASCII, is not offered.

use super::{RESOURCE_PREFIX, Running, SEPARATOR, ToolOverride, UpstreamTool};
use crate::catalog::redaction::CallSecrets;
use crate::catalog::upstream_contract::{OVERRIDE, derive_contract, hinted_class};
use postern_core::{McpOperation, ReplayContract};
use postern_vault::Vault;
use rmcp::model::Tool as RmcpTool;
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashMap},
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

/// What the running servers offer, for the synchronous paths (lists, the door's lookup).
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
    /// Fails when the servers' records cannot be read: the caller keeps the catalogue it has,
    /// rather than one whose tools lost the owner's settings.
    pub(super) fn build(
        running: &[(String, Arc<Running>)],
        overrides: &BTreeMap<String, BTreeMap<String, ToolOverride>>,
        vault: &Vault,
    ) -> Result<Catalogue, postern_vault::VaultError> {
        // One read of the records for the whole rebuild.
        let records: HashMap<String, postern_vault::McpServer> =
            vault.mcp_servers()?.into_iter().map(|s| (s.name.clone(), s)).collect();
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
            // The owner's settings (a contract, approve-every-use) are part of what a tool is: a
            // running server whose record is gone (removed meanwhile) offers nothing.
            let Some(server_def) = records.get(server) else { continue };
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
                        operation: McpOperation::CallTool,
                    },
                );
            }
        }
        resources.sort_by(|a, b| a.uri.cmp(&b.uri));
        resource_templates.sort_by(|a, b| a.uri_template.cmp(&b.uri_template));
        prompts.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Catalogue { tools: catalogue, resources, resource_templates, prompts })
    }
}

/// Is an upstream tool's name one Postern offers? The MCP tool-name characters only (letters,
/// digits, `_`, `-`, `.`, `/`): a hostile server cannot put control characters, spaces or
/// look-alike Unicode into the names agents and reviewers read.
pub fn tool_name_ok(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
}

/// The read-only operation `operation` on `server`, as the engine runs it.
pub(super) fn read_operation(server: &str, operation: McpOperation) -> UpstreamTool {
    static ANY: std::sync::LazyLock<Arc<jsonschema::Validator>> = std::sync::LazyLock::new(|| {
        Arc::new(jsonschema::validator_for(&json!({})).expect("the empty schema compiles"))
    });
    UpstreamTool {
        server: server.to_owned(),
        tool: operation.as_str().to_owned(),
        name: format!("{server}{SEPARATOR}{}", operation.as_str()),
        description: format!("{} on MCP server {server}", operation.as_str()),
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
    #[test]
    fn only_names_of_the_mcp_name_characters_are_offered() {
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
    }
}
