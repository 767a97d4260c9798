//! Tool manifests: the TOML file that declares which tools agents may call, how each becomes an
//! HTTP request, and its replay contract. A manifest is checked completely when it is loaded —
//! every problem is reported with file and line — so nothing about a tool is guessed at call time.
//!
//! ```toml
//! [[tool]]
//! name = "create_payment"
//! description = "Create a payment"
//! method = "POST"
//! url = "https://pay.example/v1/payments"
//! credential = "pay-api"
//! timeout = "10s"
//! input_schema = { type = "object", required = ["amount"], properties = { amount = { type = "integer" } } }
//! contract = { class = "idempotency_key", idempotency_header = "Idempotency-Key", attach_window = "15m" }
//! ```

mod render;

pub use render::{MAX_ARGUMENT_DEPTH, RenderedRequest};

use crate::catalog::template::{Segment, Template};
use postern_core::{
    AttachWindow, Channel, ErrorCode, ReplayClass, ReplayContract, ScopePolicy, StatusQuery, effective_contract,
};
use serde::Deserialize;
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

/// Default request timeout when a tool names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default attach window when a contract names none.
pub const DEFAULT_ATTACH_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Headers a manifest may never set: credentials come from the vault, routing from the URL.
pub const RESERVED_HEADERS: [&str; 5] = ["authorization", "proxy-authorization", "cookie", "host", "content-length"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default, rename = "tool")]
    tools: Vec<toml::Spanned<ToolSpec>>,
    /// `[servers.<server>.tools.<tool>]`: the owner's word on an upstream MCP server's tools.
    #[serde(default)]
    servers: BTreeMap<String, ServerSpec>,
    /// `[export]`: what an OpenTelemetry export may carry beyond the default.
    #[serde(default)]
    export: ExportSpec,
}

/// `[export] arguments = ["tool", …]`: the tools whose arguments an OpenTelemetry export carries
/// (as the journal's record holds them, secret arguments digested). None by default; where the
/// export goes is never set here (a manifest may come with a cloned repository).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ExportSpec {
    #[serde(default)]
    arguments: BTreeSet<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSpec {
    #[serde(default)]
    tools: BTreeMap<String, postern_vault::ToolOverride>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolSpec {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    method: String,
    #[serde(default)]
    url: String,
    /// An SSH tool: `{ host = "prod", command = "systemctl restart {service}", working_dir = "/srv" }`.
    ssh: Option<SshToolSpec>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<toml::Value>,
    credential: Option<String>,
    timeout: Option<String>,
    input_schema: Option<toml::Value>,
    contract: Option<ContractSpec>,
    /// The owner's word that a GET/HEAD of this tool changes something; then a contract other
    /// than `read_only` is required.
    #[serde(default)]
    reads_have_effects: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SshToolSpec {
    host: String,
    command: String,
    working_dir: Option<String>,
}

/// What an SSH tool runs: on which vault host, which command (placeholders become single-quoted
/// `sh` words, so an argument can never become shell syntax), in which directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTool {
    /// The vault's SSH host name; `None` for the built-in `ssh_exec` (the agent names it).
    pub host: Option<String>,
    /// The command, parsed once; checked at load so that every placeholder is one inert word.
    pub command: Template,
    pub working_dir: Option<String>,
    /// The placeholders standing where a value that starts with `-` would be read as an option
    /// (`tar -xf a.tar {m}`): such a value is refused at call time.
    pub option_words: BTreeSet<String>,
}

/// Name of the built-in SSH tool (a manifest tool of the same name replaces it).
pub const SSH_EXEC: &str = "ssh_exec";

/// Arguments of the built-in `ssh_exec` tool.
pub fn ssh_exec_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "required": ["host", "command"],
        "additionalProperties": false,
        "properties": {
            "host": { "type": "string", "description": "an SSH host's name in Postern's vault" },
            "command": { "type": "string", "minLength": 1, "description": "the command, run by sh on the host" },
            "working_dir": { "type": "string", "description": "directory to run it in" },
            "timeout_s": { "type": "integer", "minimum": 1, "maximum": 3600, "description": "default 60" }
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContractSpec {
    class: ReplayClass,
    fingerprint_fields: Option<BTreeSet<String>>,
    #[serde(default)]
    defaults: BTreeMap<String, toml::Value>,
    #[serde(default)]
    secret_fields: BTreeSet<String>,
    #[serde(default)]
    semantic_headers: BTreeSet<String>,
    /// `"15m"`, `"90s"`, … or `"until_resolved"`.
    attach_window: Option<String>,
    #[serde(default)]
    scope: ScopePolicy,
    idempotency_header: Option<String>,
    status_query: Option<StatusQuery>,
    /// `"24h"`, `"30m"`, …: how long the target remembers an idempotency key.
    key_retention: Option<String>,
}

/// Name of the built-in generic tool (a manifest tool of the same name replaces it).
pub const HTTP_REQUEST: &str = "http_request";

/// The built-in tool that looks an execution up (answered from the journal, never dispatched).
pub const EXECUTION_STATUS: &str = "execution_status";

/// Arguments of the built-in `http_request` tool.
pub fn http_request_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "required": ["method", "url"],
        "additionalProperties": false,
        "properties": {
            "method": { "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] },
            "url": { "type": "string", "minLength": 1 },
            "headers": { "type": "object", "additionalProperties": { "type": "string" } },
            "body": {
                "description": "The request body. An object or array is sent as JSON. A string is sent as its own bytes, as written (a JSON text, a form, plain text): give its Content-Type in headers, else it is application/json when the string is valid JSON and text/plain otherwise. A retry is matched on the body's value when it is JSON (an object, or a string holding a JSON object or array: other spacing or key order is the same body), and on its exact text otherwise."
            },
            "credential": { "type": "string", "description": "only to choose between several credentials bound to the URL" }
        }
    })
}

/// The bytes `http_request` sends for the `body` an agent gave, and the content type they get
/// unless the agent set one: an object, array, number or boolean goes as JSON; a string goes as
/// its own bytes (what most models send for a JSON body, and the only way to send a form or
/// plain text), as `application/json` when it parses as JSON, else `text/plain; charset=utf-8`.
/// No body, or `null`: nothing is sent.
pub fn http_request_body(body: Option<&Value>) -> (Option<Vec<u8>>, Option<&'static str>) {
    match body {
        None | Some(Value::Null) => (None, None),
        Some(Value::String(text)) => {
            let json = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
            (Some(text.as_bytes().to_vec()), Some(if json { "application/json" } else { "text/plain; charset=utf-8" }))
        }
        Some(other) => (Some(serde_json::to_vec(other).unwrap_or_default()), Some("application/json")),
    }
}

/// One tool, fully checked.
pub struct Tool {
    pub name: String,
    pub description: String,
    pub method: String,
    pub url_template: String,
    /// `url_template`, parsed once (a literal for the built-in `http_request`).
    url: Template,
    pub headers: BTreeMap<String, String>,
    pub body_template: Option<Value>,
    pub credential: Option<String>,
    pub timeout: Duration,
    pub input_schema: Value,
    pub contract: ReplayContract,
    /// The contract is `read_only` only because the verb is safe (GET/HEAD): no contract was
    /// declared, and the owner did not say that reads have effects.
    pub read_only_by_verb: bool,
    /// Set for SSH tools (then `method` is `EXEC` and `url_template` is empty).
    pub ssh: Option<SshTool>,
    validator: std::sync::Arc<jsonschema::Validator>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("method", &self.method)
            .field("url_template", &self.url_template)
            .field("contract", &self.contract.class)
            .finish_non_exhaustive()
    }
}

/// A problem in a manifest, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub file: PathBuf,
    pub line: usize,
    pub tool: Option<String>,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if let Some(tool) = &self.tool {
            write!(f, "tool {tool:?}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ManifestError {}

impl ErrorCode for ManifestError {
    fn code(&self) -> &'static str {
        "invalid_manifest"
    }
}

/// Why a call's arguments were refused, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid arguments for tool {tool:?}: {field}: {message}")]
pub struct ArgumentError {
    pub tool: String,
    /// JSON Pointer of the failing value (`/` for the whole object).
    pub field: String,
    pub message: String,
}

impl ErrorCode for ArgumentError {
    fn code(&self) -> &'static str {
        "invalid_arguments"
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

fn to_json(value: toml::Value) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

impl ContractSpec {
    /// The contract as written, durations parsed (`effective_contract` checks it).
    fn contract(self) -> Result<ReplayContract, String> {
        let attach_window = match self.attach_window.as_deref() {
            None => AttachWindow::Millis(DEFAULT_ATTACH_WINDOW.as_millis() as u64),
            Some("until_resolved") => AttachWindow::UntilResolved,
            Some(s) => AttachWindow::Millis(parse_duration(s)?.as_millis() as u64),
        };
        let key_retention_ms = self.key_retention.as_deref().map(parse_duration).transpose()?;
        Ok(ReplayContract {
            class: self.class,
            fingerprint_fields: self.fingerprint_fields,
            defaults: self.defaults.into_iter().map(|(k, v)| (k, to_json(v))).collect(),
            secret_fields: self.secret_fields,
            semantic_headers: self.semantic_headers.into_iter().map(|h| h.to_ascii_lowercase()).collect(),
            attach_window,
            scope: self.scope,
            idempotency_header: self.idempotency_header,
            idempotency_argument: None,
            status_query: self.status_query,
            key_retention_ms: key_retention_ms.map(|d| d.as_millis() as u64),
        })
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like \"30s\" or \"10m\" ({e})"))
}

impl Tool {
    fn from_spec(spec: ToolSpec) -> Result<Tool, String> {
        if spec.ssh.is_some() {
            return Tool::from_ssh_spec(spec);
        }
        let method = spec.method.trim().to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!("{:?} is not an HTTP method", spec.method));
        }
        let name_ok = !spec.name.is_empty()
            && spec.name.len() <= 64
            && spec.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(format!("tool name {:?} must be 1–64 letters, digits, '_' or '-'", spec.name));
        }
        // The template must be a URL once its placeholders are filled in.
        let url = Template::parse(&spec.url);
        let probe = url.render(|_| Ok::<_, std::convert::Infallible>("x".to_owned())).unwrap_or_default();
        let parsed = url::Url::parse(&probe).map_err(|e| format!("url {:?} is not a URL: {e}", spec.url))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("url {:?} must be http or https", spec.url));
        }
        if let Some(h) = spec.headers.keys().find(|h| RESERVED_HEADERS.contains(&h.to_ascii_lowercase().as_str())) {
            return Err(format!("header {h:?} cannot be set in a manifest (credentials come from the vault)"));
        }
        if let Some((h, _)) = spec.headers.iter().find(|(h, v)| {
            reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(v).is_err()
        }) {
            return Err(format!("header {h:?} is not a valid HTTP header name and value"));
        }
        let input_schema = spec.input_schema.map(to_json).unwrap_or_else(|| serde_json::json!({"type": "object"}));
        let validator = jsonschema::validator_for(&input_schema)
            .map_err(|e| format!("input_schema is not a valid JSON Schema: {e}"))?;
        if let Some(props) = input_schema.get("properties").and_then(Value::as_object)
            && let Some(p) = url.placeholders().find(|p| !props.contains_key(*p))
        {
            return Err(format!("url placeholder {{{p}}} is not a property of input_schema"));
        }
        let contract = spec.contract.map(ContractSpec::contract).transpose()?;
        let read_only_by_verb = contract.is_none() && !spec.reads_have_effects;
        let contract =
            effective_contract(&spec.name, Channel::Http, Some(&method), contract.as_ref(), spec.reads_have_effects)
                .map_err(|e| match e {
                    // The tool is already named in the location prefix.
                    postern_core::ContractError::Invalid { problem, .. } => format!("replay contract: {problem}"),
                    other => other.to_string(),
                })?;
        Ok(Tool {
            name: spec.name,
            description: spec.description,
            method,
            url_template: spec.url,
            url,
            headers: spec.headers,
            body_template: spec.body.map(to_json),
            credential: spec.credential,
            timeout: spec.timeout.as_deref().map(parse_duration).transpose()?.unwrap_or(DEFAULT_TIMEOUT),
            input_schema,
            contract,
            read_only_by_verb,
            ssh: None,
            validator: std::sync::Arc::new(validator),
        })
    }

    fn from_ssh_spec(spec: ToolSpec) -> Result<Tool, String> {
        let Some(ssh) = spec.ssh else { return Err("not an SSH tool".into()) };
        if !spec.method.is_empty() || !spec.url.is_empty() || spec.body.is_some() || !spec.headers.is_empty() {
            return Err("an SSH tool has no method, url, body or headers".into());
        }
        if spec.credential.is_some() {
            return Err("an SSH tool's credential is its host's key: name the host in ssh.host, not credential".into());
        }
        let name_ok = !spec.name.is_empty()
            && spec.name.len() <= 64
            && spec.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(format!("tool name {:?} must be 1–64 letters, digits, '_' or '-'", spec.name));
        }
        if ssh.command.trim().is_empty() {
            return Err("ssh.command is empty".into());
        }
        let input_schema = spec.input_schema.map(to_json).unwrap_or_else(|| serde_json::json!({"type": "object"}));
        let validator = jsonschema::validator_for(&input_schema)
            .map_err(|e| format!("input_schema is not a valid JSON Schema: {e}"))?;
        let props = input_schema.get("properties").and_then(Value::as_object);
        let command = Template::parse(&ssh.command);
        if let Some(p) = command.placeholders().find(|p| !props.is_some_and(|m| m.contains_key(*p))) {
            return Err(format!("ssh.command placeholder {{{p}}} is not a property of input_schema"));
        }
        let option_words = command.check_shell_positions()?;
        // SSH has no headers: a `semantic_headers` list means nothing here.
        let contract = spec
            .contract
            .map(|c| c.contract().map(|c| ReplayContract { semantic_headers: BTreeSet::new(), ..c }))
            .transpose()?;
        let contract =
            effective_contract(&spec.name, Channel::Ssh, None, contract.as_ref(), false).map_err(|e| match e {
                postern_core::ContractError::Invalid { problem, .. } => format!("replay contract: {problem}"),
                other => other.to_string(),
            })?;
        Ok(Tool {
            name: spec.name,
            description: spec.description,
            method: "EXEC".into(),
            url_template: String::new(),
            url: Template::literal(""),
            headers: BTreeMap::new(),
            body_template: None,
            credential: None,
            timeout: spec.timeout.as_deref().map(parse_duration).transpose()?.unwrap_or(DEFAULT_TIMEOUT),
            input_schema,
            contract,
            read_only_by_verb: false,
            ssh: Some(SshTool { host: Some(ssh.host), command, working_dir: ssh.working_dir, option_words }),
            validator: std::sync::Arc::new(validator),
        })
    }

    /// The built-in `ssh_exec` tool: any command on a vault host, under the marker protocol (an
    /// uncertain run is checked on the host, never repeated blindly).
    pub fn ssh_exec(contract: ReplayContract, timeout: Duration) -> Tool {
        use std::sync::LazyLock;
        static VALIDATOR: LazyLock<std::sync::Arc<jsonschema::Validator>> = LazyLock::new(|| {
            std::sync::Arc::new(jsonschema::validator_for(&ssh_exec_schema()).expect("the built-in schema is valid"))
        });
        let description = "Run one command on an SSH host from Postern's vault (the private key never leaves Postern)";
        let mut tool = Tool::upstream(
            SSH_EXEC,
            description,
            &ssh_exec_schema(),
            contract,
            timeout,
            std::sync::Arc::clone(&VALIDATOR),
        );
        tool.method = "EXEC".into();
        // The agent's command is used as it is (`render_ssh`): this template is never rendered.
        tool.ssh = Some(SshTool {
            host: None,
            command: Template::literal(""),
            working_dir: None,
            option_words: BTreeSet::new(),
        });
        tool
    }

    /// An upstream MCP server's tool as Postern runs it: the upstream's schema (compiled once,
    /// when the server's tools were listed) and the contract derived for it. (Also the base of
    /// the built-in `ssh_exec`: a tool with no URL to render.)
    pub fn upstream(
        name: &str,
        description: &str,
        input_schema: &Value,
        contract: ReplayContract,
        timeout: Duration,
        validator: std::sync::Arc<jsonschema::Validator>,
    ) -> Tool {
        Tool {
            name: name.into(),
            description: description.into(),
            method: "CALL".into(),
            url_template: String::new(),
            url: Template::literal(""),
            headers: BTreeMap::new(),
            body_template: None,
            credential: None,
            timeout,
            input_schema: input_schema.clone(),
            contract,
            read_only_by_verb: false,
            ssh: None,
            validator,
        }
    }

    /// The built-in generic `http_request` tool for one call: its contract depends on the
    /// method and on the credential the URL selects (see `Engine`).
    pub fn http_request(method: &str, url: &str, contract: ReplayContract, timeout: Duration) -> Tool {
        use std::sync::LazyLock;
        static VALIDATOR: LazyLock<std::sync::Arc<jsonschema::Validator>> = LazyLock::new(|| {
            std::sync::Arc::new(
                jsonschema::validator_for(&http_request_schema()).expect("the built-in schema is valid"),
            )
        });
        Tool {
            name: HTTP_REQUEST.into(),
            description: "Send one HTTP request with the credential bound to its URL".into(),
            method: method.to_owned(),
            url_template: url.to_owned(),
            url: Template::literal(url),
            headers: BTreeMap::new(),
            body_template: None,
            credential: None,
            timeout,
            input_schema: http_request_schema(),
            read_only_by_verb: contract.class == ReplayClass::ReadOnly,
            contract,
            ssh: None,
            validator: std::sync::Arc::clone(&VALIDATOR),
        }
    }
}

/// A loaded, fully checked manifest.
#[derive(Debug, Default)]
pub struct Manifest {
    tools: BTreeMap<String, Tool>,
    /// Per upstream server, per tool (its own name): contract overrides.
    server_overrides: BTreeMap<String, BTreeMap<String, postern_vault::ToolOverride>>,
    /// The tools whose arguments an OpenTelemetry export carries (`[export] arguments`).
    export_arguments: BTreeSet<String>,
}

impl Manifest {
    /// Parses `text` (read from `file`), reporting every problem found, each with its line.
    pub fn parse(text: &str, file: &Path) -> Result<Manifest, Vec<ManifestError>> {
        let at = |line: usize, tool: Option<&str>, message: String| ManifestError {
            file: file.to_owned(),
            line,
            tool: tool.map(str::to_owned),
            message,
        };
        let spec: FileSpec = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(text, s.start));
            vec![at(line, None, e.message().to_owned())]
        })?;
        let mut tools = BTreeMap::new();
        let mut errors = Vec::new();
        for spanned in spec.tools {
            let line = line_of(text, spanned.span().start);
            let spec = spanned.into_inner();
            let name = spec.name.clone();
            match Tool::from_spec(spec) {
                Ok(tool) if tools.contains_key(&tool.name) => {
                    errors.push(at(line, Some(&name), "a tool with this name is already defined".into()));
                }
                Ok(tool) => {
                    tools.insert(tool.name.clone(), tool);
                }
                Err(message) => errors.push(at(line, Some(&name), message)),
            }
        }
        let mut server_overrides = BTreeMap::new();
        for (server, spec) in spec.servers {
            for (tool, o) in &spec.tools {
                let (contract, _) = crate::catalog::upstream_contract::derive_contract(
                    &rmcp::model::Tool::new(tool.clone(), "", std::sync::Arc::default()),
                    Some(o),
                );
                if let Err(e) = contract.validate(&format!("{server}__{tool}"), Channel::Mcp) {
                    errors.push(at(1, Some(&format!("{server}__{tool}")), e.to_string()));
                }
            }
            server_overrides.insert(server, spec.tools);
        }
        let export_arguments = spec.export.arguments;
        if errors.is_empty() { Ok(Manifest { tools, server_overrides, export_arguments }) } else { Err(errors) }
    }

    pub fn load(path: &Path) -> Result<Manifest, Vec<ManifestError>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| vec![ManifestError { file: path.to_owned(), line: 1, tool: None, message: e.to_string() }])?;
        Manifest::parse(&text, path)
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// The owner's contract overrides for upstream MCP servers' tools.
    pub fn server_overrides(&self) -> &BTreeMap<String, BTreeMap<String, postern_vault::ToolOverride>> {
        &self.server_overrides
    }

    /// The tools whose arguments an OpenTelemetry export carries (`[export] arguments`).
    pub fn export_arguments(&self) -> &BTreeSet<String> {
        &self.export_arguments
    }

    pub fn tools(&self) -> impl Iterator<Item = &Tool> {
        self.tools.values()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod body_tests {
    use super::http_request_body;
    use proptest::prelude::*;
    use serde_json::Value;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("\\PC{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever string an agent sends (control characters, quotes, half a JSON text, bytes
        /// that look like headers) goes out byte for byte, and is called JSON only when it is.
        #[test]
        fn a_string_body_is_sent_byte_for_byte(text in "\\PC*|[\\x00-\\x7f]{0,64}") {
            let (bytes, content_type) = http_request_body(Some(&Value::String(text.clone())));
            prop_assert_eq!(bytes, Some(text.as_bytes().to_vec()));
            let is_json = serde_json::from_str::<Value>(&text).is_ok();
            prop_assert_eq!(content_type == Some("application/json"), is_json);
        }

        /// Any other value is sent as JSON that reads back as the same value.
        #[test]
        fn a_structured_body_is_sent_as_json_of_itself(value in json_value()) {
            prop_assume!(!value.is_string() && !value.is_null());
            let (bytes, content_type) = http_request_body(Some(&value));
            let back: Value = serde_json::from_slice(&bytes.unwrap()).unwrap();
            prop_assert_eq!(back, value);
            prop_assert_eq!(content_type, Some("application/json"));
        }
    }
}
