//! Upstream MCP servers: a stdio server's command, its plain environment and the names of the
//! environment values that are secrets. The secret values are keychain items; the metadata is a
//! row of the vault's credentials table (`kind = mcp_server`), journaled like every vault change,
//! so adding a server is an owner's act with a record, never an agent's.

use crate::VaultError;
use postern_core::ReplayClass;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The credentials table's `kind` of an MCP server's row.
pub const KIND: &str = "mcp_server";

/// The longest server name: namespaced tool names (`<server>__<tool>`) must stay within the
/// 64 characters clients accept, so the server's part is kept short.
pub const MAX_SERVER_NAME: usize = 24;

/// Does setting this environment variable change what code a program loads or runs?
pub fn loader_variable(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "PATH",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "RUBYOPT",
        "RUBYLIB",
        "BASH_ENV",
        "ENV",
        "ZDOTDIR",
        "PROMPT_COMMAND",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "GIT_SSH_COMMAND",
        "GIT_EXEC_PATH",
        "SHELL",
        "EDITOR",
        "NPM_CONFIG_PREFIX",
        "NPM_CONFIG_REGISTRY",
        "PIP_INDEX_URL",
        "UV_INDEX_URL",
        "HOME",
    ];
    let upper = name.to_ascii_uppercase();
    EXACT.contains(&upper.as_str()) || upper.starts_with("LD_") || upper.starts_with("DYLD_")
}

/// When Postern starts a server's process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerStart {
    /// With the gateway, so its tools are ready when the first agent connects.
    #[default]
    WithGateway,
    /// When an agent first lists tools or calls one of its tools (a heavy server that is
    /// rarely used costs nothing until then).
    OnFirstUse,
}

impl ServerStart {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerStart::WithGateway => "with_gateway",
            ServerStart::OnFirstUse => "on_first_use",
        }
    }
}

/// What the owner says about one upstream tool, overriding what its annotations suggest (the
/// server's annotations are only hints). Set in `tools.toml` under the server's name, or kept in
/// the server's vault record when set from the app or `postern servers contract`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ReplayClass>,
    /// The argument Postern fills with the execution ID (class `idempotency_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_argument: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approve_every_use: bool,
    /// Arguments that carry secrets, beyond those named like one (`token`, `password`, `key`, …):
    /// digested in the record, masked in approval questions and journal rows.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub secret_arguments: BTreeSet<String>,
}

impl ToolOverride {
    /// The classes an upstream tool can be held to (a status endpoint or an SSH marker is not
    /// something an MCP server offers).
    pub const CLASSES: [ReplayClass; 4] =
        [ReplayClass::ReadOnly, ReplayClass::Idempotent, ReplayClass::IdempotencyKey, ReplayClass::Irreversible];

    /// Checks what can be checked without the tool's schema.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(class) = self.class
            && !Self::CLASSES.contains(&class)
        {
            return Err(format!(
                "class {} does not fit an upstream MCP tool (read_only, idempotent, idempotency_key or irreversible)",
                class.as_str()
            ));
        }
        match (self.class, &self.idempotency_argument) {
            (Some(ReplayClass::IdempotencyKey), None) => Err(
                "class idempotency_key needs idempotency_argument: the argument Postern fills with the execution ID"
                    .into(),
            ),
            (Some(c), Some(_)) if c != ReplayClass::IdempotencyKey => {
                Err(format!("idempotency_argument goes with class idempotency_key, not {}", c.as_str()))
            }
            _ => Ok(()),
        }
    }

    /// Nothing set: the same as no override.
    pub fn is_empty(&self) -> bool {
        *self == ToolOverride::default()
    }
}

/// An argument of a stdio server's command line that holds a secret (a DSN's password, the value
/// of `--access-token`, a token in a header argument): at spawn, `args[index]` is `prefix`, the
/// keychain item `name`, then `suffix`. The stored `args[index]` is what lists show:
/// `prefix<NAME>suffix`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretArg {
    pub index: usize,
    pub name: String,
    pub prefix: String,
    pub suffix: String,
}

impl SecretArg {
    /// What lists and the journal show in the argument's place.
    pub fn shown(&self) -> String {
        format!("{}<{}>{}", self.prefix, self.name, self.suffix)
    }
}

/// How a remote server signs in with OAuth: what the owner asked for at `servers add`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthSettings {
    /// The scopes to ask for (none: what the server's metadata suggests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// A client registered by hand with the authorization server (else Dynamic Client
    /// Registration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The HTTPS URL of a Client ID Metadata Document the owner hosts for Postern: the client ID
    /// at an authorization server that takes such documents (else Dynamic Client Registration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
}

impl OAuthSettings {
    /// Checks the scopes and the client's identity.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(bad) = self.scopes.iter().find(|s| {
            s.is_empty() || s.contains(|c: char| c.is_whitespace() || c.is_control() || c == '"' || c == '\\')
        }) {
            return Err(format!(
                "--scope {bad:?} is not a scope (RFC 6749: printable, no spaces, quotes or backslashes)"
            ));
        }
        if self.client_id.as_deref().is_some_and(|id| id.is_empty() || id.contains(char::is_control)) {
            return Err("--client-id is empty or holds control characters".into());
        }
        let Some(document) = &self.client_metadata_url else { return Ok(()) };
        if self.client_id.is_some() {
            return Err("give --client-id or --client-metadata-url, not both: a client ID names one client".into());
        }
        // draft-ietf-oauth-client-id-metadata-document: an https URL with a path, no user
        // information, no fragment (the authorization server fetches it; the URL is the client ID).
        let url =
            url::Url::parse(document).map_err(|e| format!("--client-metadata-url is not an absolute URL: {e}"))?;
        if url.scheme() != "https"
            || url.path() == "/"
            || url.host_str().is_none()
            || !url.username().is_empty()
            || url.password().is_some()
            || url.fragment().is_some()
        {
            // Not echoed: it may be refused for the password it carries.
            return Err("--client-metadata-url must be an https URL with a path, without a user name, password or \
                        fragment (the authorization server fetches the document there)"
                .into());
        }
        Ok(())
    }
}

/// An upstream MCP server: one Postern launches over stdio (its secret values are in the
/// keychain), or a remote Streamable HTTP server reached with a vault credential.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServer {
    pub name: String,
    /// The program, found on `PATH` when it has no `/` (empty for a remote server).
    pub command: String,
    pub args: Vec<String>,
    /// Environment values that are not secrets, as the owner gave them.
    pub env: BTreeMap<String, String>,
    /// Names of environment values kept in the keychain and set only in this child's environment.
    pub secret_env: Vec<String>,
    /// Arguments that hold a secret (kept in the keychain, put back only into this child's argv).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_args: Vec<SecretArg>,
    /// Every call to this server's tools needs a reviewer.
    pub approve_every_use: bool,
    /// A remote server's Streamable HTTP endpoint.
    pub url: Option<String>,
    /// The vault credential (bearer or header) sent to a remote server; its binding must allow `url`.
    pub credential: Option<String>,
    /// A remote server that signs in with OAuth (`postern servers login`): its tokens are a
    /// keychain item, never a credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthSettings>,
    #[serde(default)]
    pub start: ServerStart,
    /// The owner's contract for some of its tools (by the server's own tool name), set from the
    /// app or `postern servers contract`.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverride>,
}

impl McpServer {
    /// The names of every secret the server's keychain items hold (environment values, then
    /// arguments).
    pub fn secret_names(&self) -> Vec<&str> {
        self.secret_env.iter().map(String::as_str).chain(self.secret_args.iter().map(|a| a.name.as_str())).collect()
    }

    /// What launches it, as lists show it: the command line, or the URL and the credential.
    pub fn launched(&self) -> String {
        match &self.url {
            Some(url) if self.oauth.is_some() => format!("{url} (OAuth)"),
            Some(url) => format!("{url} (credential {})", self.credential.as_deref().unwrap_or("none")),
            None => std::iter::once(self.command.as_str())
                .chain(self.args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// What it runs as a person should read it before agreeing: its plain environment with the
    /// values (`NODE_OPTIONS=--require ./x.js` changes what the program loads), its secret
    /// environment by name, then [`McpServer::launched`].
    pub fn described(&self) -> String {
        let plain = self.env.iter().map(|(k, v)| format!("{k}={v}"));
        let secret = self.secret_env.iter().map(|k| format!("{k}=<secret>"));
        plain.chain(secret).chain(std::iter::once(self.launched())).collect::<Vec<_>>().join(" ")
    }

    /// The environment names it sets that change what code a program loads or how it runs
    /// (`LD_PRELOAD`, `NODE_OPTIONS`, `PYTHONPATH`, `PATH`, …): shown with a warning wherever a
    /// person agrees to the server.
    pub fn loader_variables(&self) -> Vec<&str> {
        self.env.keys().map(String::as_str).filter(|k| loader_variable(k)).collect()
    }

    pub fn validate(&self) -> Result<(), VaultError> {
        let invalid = |m: String| Err(VaultError::InvalidCredential(m));
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_SERVER_NAME
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
            && !self.name.contains("__");
        if !name_ok {
            return invalid(format!(
                "server name {:?} must be 1–{MAX_SERVER_NAME} letters, digits, '-' or '_' (no \"__\": it separates the \
                 server from the tool in the names agents see)",
                self.name
            ));
        }
        if let Some(url) = &self.url {
            // Never echoed: a URL that is refused may be refused for the password it carries.
            let parsed = url::Url::parse(url)
                .map_err(|e| VaultError::InvalidCredential(format!("--url is not an absolute URL: {e}")))?;
            if !parsed.username().is_empty() || parsed.password().is_some() {
                return invalid(format!(
                    "--url must not carry a user name or password (it would be journaled, logged and listed): add it \
                     as a vault credential (`postern vault add NAME --kind basic --username USER --host {}`) and give \
                     --credential NAME",
                    parsed.host_str().unwrap_or_default()
                ));
            }
            if !matches!(parsed.scheme(), "https" | "http") {
                return invalid(format!("--url {url:?} must be https (or http to a loopback address)"));
            }
            if self.oauth.is_some() && self.credential.is_some() {
                return invalid("a server signs in with --oauth or sends --credential, not both".into());
            }
            if let Some(oauth) = &self.oauth {
                oauth.validate().map_err(VaultError::InvalidCredential)?;
            }
            if !self.command.is_empty()
                || !self.args.is_empty()
                || !self.env.is_empty()
                || !self.secret_env.is_empty()
                || !self.secret_args.is_empty()
            {
                return invalid("a remote server (--url) has no command or environment".into());
            }
            return self.validate_tools();
        }
        if self.credential.is_some() {
            return invalid("--credential is for a remote server (--url); a stdio server takes --secret-env".into());
        }
        if self.oauth.is_some() {
            return invalid("--oauth is for a remote server (--url)".into());
        }
        if self.command.trim().is_empty() {
            return invalid("a stdio server needs a command (after `--`)".into());
        }
        let env_name_ok = |k: &str| {
            !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        if let Some(bad) = self.env.keys().chain(&self.secret_env).find(|k| !env_name_ok(k)) {
            return invalid(format!("{bad:?} is not an environment variable name (letters, digits, '_')"));
        }
        if let Some(both) = self.secret_env.iter().find(|k| self.env.contains_key(*k)) {
            return invalid(format!("{both:?} is given both as a plain value and as a secret"));
        }
        let names = self.secret_names();
        if let Some(twice) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)).map(|(_, n)| n) {
            return invalid(format!("the secret {twice:?} is named twice"));
        }
        for a in &self.secret_args {
            if a.index >= self.args.len() || !env_name_ok(&a.name) {
                return invalid(format!("secret argument {:?} does not name one of the arguments", a.name));
            }
            if self.args[a.index] != a.shown() {
                return invalid(format!("argument {} must read {:?} where its secret goes", a.index, a.shown()));
            }
        }
        self.validate_tools()
    }

    fn validate_tools(&self) -> Result<(), VaultError> {
        for (tool, over) in &self.tools {
            over.validate()
                .map_err(|e| VaultError::InvalidCredential(format!("tool {tool:?} of {:?}: {e}", self.name)))?;
        }
        Ok(())
    }

    pub(crate) fn spec(&self) -> Value {
        let mut spec = match &self.url {
            Some(url) => json!({ "transport": "http", "url": url, "credential": self.credential }),
            None => json!({ "transport": "stdio", "command": self.command, "args": self.args, "env": self.env,
                            "secret_env": self.secret_env }),
        };
        if !self.secret_args.is_empty() {
            spec["secret_args"] = json!(self.secret_args);
        }
        // Only what differs from the defaults, so records written before these existed read the same.
        if self.start != ServerStart::default() {
            spec["start"] = json!(self.start);
        }
        if !self.tools.is_empty() {
            spec["tools"] = json!(self.tools);
        }
        if let Some(oauth) = &self.oauth {
            spec["oauth"] = json!(oauth);
        }
        spec
    }

    pub(crate) fn to_record(&self, created_at: i64) -> postern_store::CredentialRecord {
        postern_store::CredentialRecord {
            name: self.name.clone(),
            kind: KIND.into(),
            spec: self.spec(),
            bindings: json!([]),
            approve_every_use: self.approve_every_use,
            created_at,
        }
    }

    /// The server a credentials-table row of [`KIND`] describes (readers without a vault, e.g.
    /// `servers list` beside a running gateway, use it on a read-only view).
    pub fn from_record(r: &postern_store::CredentialRecord) -> Result<Self, VaultError> {
        let corrupt = |what: &str| VaultError::InvalidCredential(format!("stored MCP server {:?}: {what}", r.name));
        let strings = |key: &str| -> Result<Vec<String>, VaultError> {
            serde_json::from_value(r.spec.get(key).cloned().unwrap_or(Value::Array(vec![]))).map_err(|_| corrupt(key))
        };
        let text = |key: &str| r.spec.get(key).and_then(Value::as_str).map(str::to_owned);
        let start: ServerStart = match r.spec.get("start") {
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| corrupt("start"))?,
            None => ServerStart::default(),
        };
        let tools: BTreeMap<String, ToolOverride> = match r.spec.get("tools") {
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| corrupt("tools"))?,
            None => BTreeMap::new(),
        };
        if r.spec.get("transport").and_then(Value::as_str) == Some("http") {
            return Ok(McpServer {
                name: r.name.clone(),
                url: Some(text("url").ok_or_else(|| corrupt("url"))?),
                credential: text("credential"),
                oauth: match r.spec.get("oauth") {
                    Some(v) => Some(serde_json::from_value(v.clone()).map_err(|_| corrupt("oauth"))?),
                    None => None,
                },
                approve_every_use: r.approve_every_use,
                start,
                tools,
                ..McpServer::default()
            });
        }
        Ok(McpServer {
            name: r.name.clone(),
            command: text("command").ok_or_else(|| corrupt("command"))?,
            args: strings("args")?,
            env: serde_json::from_value(r.spec.get("env").cloned().unwrap_or(json!({}))).map_err(|_| corrupt("env"))?,
            secret_env: strings("secret_env")?,
            secret_args: match r.spec.get("secret_args") {
                Some(v) => serde_json::from_value(v.clone()).map_err(|_| corrupt("secret_args"))?,
                None => vec![],
            },
            approve_every_use: r.approve_every_use,
            url: None,
            credential: None,
            oauth: None,
            start,
            tools,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> McpServer {
        McpServer {
            name: "github".into(),
            command: "npx".into(),
            args: vec!["-y".into(), "@modelcontextprotocol/server-github".into()],
            env: BTreeMap::from([("LOG_LEVEL".into(), "info".into())]),
            secret_env: vec!["GITHUB_TOKEN".into()],
            secret_args: vec![],
            approve_every_use: false,
            url: None,
            credential: None,
            oauth: None,
            start: ServerStart::OnFirstUse,
            tools: BTreeMap::from([(
                "create_issue".into(),
                ToolOverride {
                    class: Some(ReplayClass::IdempotencyKey),
                    idempotency_argument: Some("requestId".into()),
                    ..ToolOverride::default()
                },
            )]),
        }
    }

    #[test]
    fn a_server_round_trips_through_its_record() {
        let s = server();
        assert_eq!(McpServer::from_record(&s.to_record(1)).expect("reads back"), s);
        let remote = McpServer {
            name: "linear".into(),
            url: Some("https://mcp.linear.app/mcp".into()),
            credential: Some("linear-api".into()),
            ..McpServer::default()
        };
        remote.validate().expect("valid");
        assert_eq!(McpServer::from_record(&remote.to_record(1)).expect("reads back"), remote);
        assert!(McpServer { command: "x".into(), ..remote.clone() }.validate().is_err());
        assert!(McpServer { url: Some("ftp://x/".into()), ..remote }.validate().is_err());
        assert!(McpServer { credential: Some("c".into()), ..server() }.validate().is_err());
    }

    #[test]
    fn names_that_would_break_namespacing_or_the_environment_are_refused() {
        for name in ["", "a__b", "has space", "x".repeat(MAX_SERVER_NAME + 1).as_str(), "dot.ted"] {
            assert!(McpServer { name: name.into(), ..server() }.validate().is_err(), "{name:?}");
        }
        assert!(McpServer { secret_env: vec!["1TOKEN".into()], ..server() }.validate().is_err());
        assert!(McpServer { secret_env: vec!["LOG_LEVEL".into()], ..server() }.validate().is_err());
        assert!(McpServer { command: " ".into(), ..server() }.validate().is_err());
        assert!(server().validate().is_ok());
    }

    #[test]
    fn a_contract_that_cannot_hold_for_an_upstream_tool_is_refused() {
        let with = |o: ToolOverride| McpServer { tools: BTreeMap::from([("t".into(), o)]), ..server() };
        for bad in [
            ToolOverride { class: Some(ReplayClass::SshMarker), ..ToolOverride::default() },
            ToolOverride { class: Some(ReplayClass::StatusQuery), ..ToolOverride::default() },
            ToolOverride { class: Some(ReplayClass::IdempotencyKey), ..ToolOverride::default() },
            ToolOverride {
                class: Some(ReplayClass::Irreversible),
                idempotency_argument: Some("k".into()),
                ..ToolOverride::default()
            },
        ] {
            assert!(with(bad.clone()).validate().is_err(), "{bad:?}");
        }
        with(ToolOverride { approve_every_use: true, ..ToolOverride::default() }).validate().expect("valid");
    }

    #[test]
    fn a_record_written_before_start_and_tools_existed_reads_with_their_defaults() {
        let old = postern_store::CredentialRecord {
            name: "gh".into(),
            kind: KIND.into(),
            spec: json!({ "transport": "stdio", "command": "gh-mcp", "args": [], "env": {}, "secret_env": [] }),
            bindings: json!([]),
            approve_every_use: false,
            created_at: 1,
        };
        let s = McpServer::from_record(&old).expect("reads");
        assert_eq!((s.start, s.tools.len()), (ServerStart::WithGateway, 0));
        assert_eq!(s.spec(), old.spec, "and writes back the same spec");
    }
}
