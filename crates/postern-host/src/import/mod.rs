//! Importing the MCP servers an agent's config file launches (with their tokens in plaintext
//! JSON) into Postern — each server into the vault, each secret into the keychain — and rewriting
//! the config to a single `postern mcp` entry. The original file is kept as a keychain item, never
//! on disk, so [`undo`] can restore its exact bytes. Shared by `postern servers import` and the
//! desktop app's first-run offer.
//!
//! Secrets are recognised wherever the config puts them ([`crate::plaintext`]): environment
//! values by name or by shape, and inside arguments (a DSN's password, the value of
//! `--access-token`, an `Authorization:` header argument, a token with a well-known prefix);
//! each goes to the keychain and is put back only into the child's argv or environment at
//! spawn, so no journal row ever holds one. A config that is a symbolic link (a dotfiles
//! repository) is rewritten where it really is, the link kept. The undo record is a 0600 file
//! whose digest is journaled (`import_applied`); an undo whose record does not match is refused.
//!
//! The parsing and rewriting are pure (`find_servers`, `rewrite`, `server_name`,
//! [`Found::to_server`]) and property-tested with hostile configs; [`plan`], [`apply`] and
//! [`undo`] do the I/O.

use crate::plaintext;
use postern_core::ErrorCode;
use postern_store::ImportEvent;
use postern_vault::{FileBackups, MAX_SERVER_NAME, McpServer, Sensitive, Vault, VaultError};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Why an import (or its undo) could not be done.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0:?} is neither a known agent (claude-code, claude-desktop, cursor, vscode) nor a file")]
    UnknownSource(String),
    #[error("no import to undo")]
    NothingToUndo,
    #[error("{} changed since the import; nothing was restored (edit it back, or remove the change, and run --undo again)", .0.display())]
    ChangedSince(PathBuf),
    #[error("the keychain has no backup of {}", .0.display())]
    NoBackup(PathBuf),
    #[error(
        "the import record ({}) does not match what the last import wrote (the digest the journal holds, or the \
         backups it names): it was changed outside Postern, so nothing was restored or removed (the original files \
         are still in the OS keychain)",
        .0.display()
    )]
    RecordTampered(PathBuf),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error(transparent)]
    Vault(#[from] VaultError),
    /// The running gateway refused a change (its message says why).
    #[error("{0}")]
    Gateway(String),
}

impl ErrorCode for ImportError {
    fn code(&self) -> &'static str {
        match self {
            ImportError::UnknownSource(_) => "unknown_import_source",
            ImportError::NothingToUndo => "nothing_to_undo",
            ImportError::ChangedSince(_) => "changed_since_import",
            ImportError::NoBackup(_) => "no_import_backup",
            ImportError::RecordTampered(_) => "import_record_tampered",
            ImportError::Io { .. } => "import_io_error",
            ImportError::Vault(e) => e.code(),
            ImportError::Gateway(_) => "gateway_refused",
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImportError {
    let what = what.into();
    move |source| ImportError::Io { what, source }
}

/// Where an import puts what it moves: the vault itself (no gateway runs, or the app, which runs
/// the gateway), or the running gateway, through its control socket (`postern servers import`
/// beside `postern serve`). The files' backups are keychain items either way.
pub trait ImportTarget {
    /// Names already taken by a server, a credential or an SSH host.
    fn taken(&self) -> Result<BTreeSet<String>, ImportError>;
    fn add_server(
        &self,
        server: McpServer,
        secrets: Vec<(String, Sensitive<String>)>,
        now: postern_core::Timestamp,
    ) -> Result<(), ImportError>;
    fn has_server(&self, name: &str) -> Result<bool, ImportError>;
    fn remove_server(&self, name: &str, now: postern_core::Timestamp) -> Result<(), ImportError>;
    fn backups(&self) -> FileBackups;
    /// Journals an import (the undo record's digest, files and servers) or its undo.
    fn record(&self, event: ImportEvent, detail: Value, now: postern_core::Timestamp) -> Result<(), ImportError>;
    /// The newest `import_applied` / `import_undone` row's detail, if any.
    fn last_record(&self) -> Result<Option<(ImportEvent, Value)>, ImportError>;
}

/// The newest import event the journal at `view` holds.
fn last_import(view: &postern_store::JournalView) -> Result<Option<(ImportEvent, Value)>, ImportError> {
    let row = view
        .last_vault_event(&[ImportEvent::ImportApplied.into(), ImportEvent::ImportUndone.into()])
        .map_err(VaultError::from)?;
    Ok(row.map(|e| {
        let event = if e.row.event == postern_store::Event::Vault(postern_store::VaultEvent::ImportApplied) {
            ImportEvent::ImportApplied
        } else {
            ImportEvent::ImportUndone
        };
        (event, e.row.detail)
    }))
}

impl ImportTarget for Vault {
    fn taken(&self) -> Result<BTreeSet<String>, ImportError> {
        let mut taken: BTreeSet<String> = self.mcp_servers()?.into_iter().map(|s| s.name).collect();
        taken.extend(self.credentials()?.into_iter().map(|c| c.name));
        taken.extend(self.ssh_hosts()?.into_iter().map(|h| h.name));
        Ok(taken)
    }

    fn add_server(
        &self,
        server: McpServer,
        secrets: Vec<(String, Sensitive<String>)>,
        now: postern_core::Timestamp,
    ) -> Result<(), ImportError> {
        Ok(self.add_mcp_server(&server, &secrets, now)?)
    }

    fn has_server(&self, name: &str) -> Result<bool, ImportError> {
        Ok(self.mcp_server(name).is_ok())
    }

    fn remove_server(&self, name: &str, now: postern_core::Timestamp) -> Result<(), ImportError> {
        Ok(self.remove_mcp_server(name, now)?)
    }

    fn backups(&self) -> FileBackups {
        self.file_backups()
    }

    fn record(&self, event: ImportEvent, detail: Value, now: postern_core::Timestamp) -> Result<(), ImportError> {
        Ok(self.journal_import(event, detail, now)?)
    }

    fn last_record(&self) -> Result<Option<(ImportEvent, Value)>, ImportError> {
        last_import(self.journal())
    }
}

/// The data directory `data_dir` as an import's target, through the one route every CLI change
/// takes (`operations::Route`): the journal itself when no gateway runs, else the running
/// gateway's control socket — so an import passes the same gate as `servers add` (refused from
/// inside an agent run). Names are read from the journal (read-only), backups kept in the
/// keychain under the installation's id.
#[derive(Debug)]
pub struct ThroughRoute {
    data_dir: PathBuf,
    route: crate::operations::Route,
    backups: FileBackups,
}

impl ThroughRoute {
    pub fn new(data_dir: &Path, keychain: std::sync::Arc<dyn postern_vault::SecretStore>) -> Result<Self, ImportError> {
        let route =
            crate::operations::Route::of(data_dir, crate::now()).map_err(|e| ImportError::Gateway(e.to_string()))?;
        let view = postern_store::JournalView::open_read_only(&crate::database(data_dir)).map_err(VaultError::from)?;
        let installation = match view.installation_id().map_err(VaultError::from)? {
            Some(id) => id,
            None => {
                // A journal no vault has opened yet: opening one names the installation.
                let crate::operations::Route::Local(store) = &route else {
                    return Err(ImportError::Gateway("the journal has no installation id yet".into()));
                };
                Vault::open(std::sync::Arc::clone(store), std::sync::Arc::clone(&keychain), crate::now())?
                    .installation_id()
                    .to_owned()
            }
        };
        Ok(ThroughRoute { data_dir: data_dir.to_owned(), route, backups: FileBackups::new(keychain, installation) })
    }

    fn perform(&self, request: postern_gateway::door::control::ControlRequest) -> Result<(), ImportError> {
        match self.route.perform(request, crate::now()) {
            postern_gateway::door::control::ControlReply::Refused { message, .. } => Err(ImportError::Gateway(message)),
            _ => Ok(()),
        }
    }

    fn records(&self) -> Result<Vec<postern_store::CredentialRecord>, ImportError> {
        let view =
            postern_store::JournalView::open_read_only(&crate::database(&self.data_dir)).map_err(VaultError::from)?;
        Ok(view.credentials().map_err(VaultError::from)?)
    }
}

impl ImportTarget for ThroughRoute {
    fn taken(&self) -> Result<BTreeSet<String>, ImportError> {
        Ok(self.records()?.into_iter().map(|r| r.name).collect())
    }

    fn add_server(
        &self,
        server: McpServer,
        secrets: Vec<(String, Sensitive<String>)>,
        _now: postern_core::Timestamp,
    ) -> Result<(), ImportError> {
        use postern_gateway::door::control::{ControlRequest, SecretText};
        let secrets = secrets.into_iter().map(|(k, v)| (k, SecretText(v))).collect();
        self.perform(ControlRequest::AddServer { server, secrets })
    }

    fn has_server(&self, name: &str) -> Result<bool, ImportError> {
        Ok(self.records()?.iter().any(|r| r.name == name && r.kind == postern_vault::MCP_SERVER_KIND))
    }

    fn remove_server(&self, name: &str, _now: postern_core::Timestamp) -> Result<(), ImportError> {
        self.perform(postern_gateway::door::control::ControlRequest::Remove { name: name.to_owned() })
    }

    fn backups(&self) -> FileBackups {
        self.backups.clone()
    }

    fn record(&self, event: ImportEvent, detail: Value, _now: postern_core::Timestamp) -> Result<(), ImportError> {
        self.perform(postern_gateway::door::control::ControlRequest::RecordImport { event, detail })
    }

    fn last_record(&self) -> Result<Option<(ImportEvent, Value)>, ImportError> {
        let view =
            postern_store::JournalView::open_read_only(&crate::database(&self.data_dir)).map_err(VaultError::from)?;
        last_import(&view)
    }
}

/// How one config file lays out its servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `{"mcpServers": {…}}` (Claude Desktop, Cursor, `.mcp.json`; any file given by path).
    McpServers,
    /// `~/.claude.json`: `mcpServers` at the top and under each `projects.<dir>`.
    ClaudeCode,
    /// `.vscode/mcp.json`: `{"servers": {…}}`.
    VsCode,
}

/// One stdio server found in a config file. Its environment holds the plaintext secrets being
/// moved: `Debug` shows the names only.
#[derive(Clone, PartialEq)]
pub struct Found {
    /// JSON path of the object holding the server entries (e.g. `["projects", "/src/app", "mcpServers"]`).
    pub at: Vec<String>,
    /// The entry's key in that object.
    pub key: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl std::fmt::Debug for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Found")
            .field("at", &self.at)
            .field("key", &self.key)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Found {
    /// The vault's server for this entry, named `name`, and the secrets that go to the keychain:
    /// environment values that are secrets (by name or by shape) and the secret parts of its
    /// arguments, each by the name it is kept under.
    pub fn to_server(&self, name: &str) -> (McpServer, Vec<(String, Sensitive<String>)>) {
        let (secret, plain): (BTreeMap<_, _>, BTreeMap<_, _>) =
            self.env.clone().into_iter().partition(|(k, v)| plaintext::env_is_secret(k, v));
        let secret_env: Vec<String> = secret.keys().cloned().collect();
        let plaintext::SplitArgs { shown: args, places: secret_args, secrets: arg_values } =
            plaintext::split_args(&self.args, &secret_env);
        let mut values: Vec<(String, Sensitive<String>)> =
            secret.into_iter().map(|(k, v)| (k, Sensitive::new(v))).collect();
        values.extend(arg_values);
        let server = McpServer {
            name: name.to_owned(),
            command: self.command.clone(),
            args,
            env: plain,
            secret_env,
            secret_args,
            ..McpServer::default()
        };
        (server, values)
    }
}

/// Why an entry is left where it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    pub key: String,
    pub reason: String,
}

fn server_maps(layout: Layout) -> &'static str {
    match layout {
        Layout::VsCode => "servers",
        Layout::McpServers | Layout::ClaudeCode => "mcpServers",
    }
}

/// The objects holding server entries, by JSON path.
fn holders(config: &Value, layout: Layout) -> Vec<Vec<String>> {
    let key = server_maps(layout);
    let mut out = Vec::new();
    if config.get(key).is_some_and(Value::is_object) {
        out.push(vec![key.to_owned()]);
    }
    if layout == Layout::ClaudeCode
        && let Some(projects) = config.get("projects").and_then(Value::as_object)
    {
        for (dir, project) in projects {
            if project.get(key).is_some_and(Value::is_object) {
                out.push(vec!["projects".into(), dir.clone(), key.to_owned()]);
            }
        }
    }
    out
}

fn at<'a>(config: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(config, |v, k| v.get(k))
}

fn at_mut<'a>(config: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(config, |v, k| v.get_mut(k))
}

/// Is this entry already Postern (`postern mcp`)?
fn is_postern(entry: &Value) -> bool {
    let command = entry.get("command").and_then(Value::as_str).unwrap_or_default();
    let first = entry.get("args").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
    Path::new(command).file_name().is_some_and(|f| f == "postern") && first == Some("mcp")
}

/// Every stdio server in `config`, and every entry left alone (with why).
pub fn find_servers(config: &Value, layout: Layout) -> (Vec<Found>, Vec<Skipped>) {
    let (mut found, mut skipped) = (Vec::new(), Vec::new());
    for path in holders(config, layout) {
        let Some(entries) = at(config, &path).and_then(Value::as_object) else { continue };
        for (key, entry) in entries {
            let skip = |reason: &str| Skipped { key: key.clone(), reason: reason.into() };
            if is_postern(entry) {
                skipped.push(skip("already Postern"));
                continue;
            }
            let kind = entry.get("type").and_then(Value::as_str).unwrap_or("stdio");
            if entry.get("url").is_some() || kind != "stdio" {
                skipped.push(skip("a remote server (not imported yet: Postern runs stdio servers)"));
                continue;
            }
            let Some(command) = entry.get("command").and_then(Value::as_str).filter(|c| !c.trim().is_empty()) else {
                skipped.push(skip("no command"));
                continue;
            };
            let args: Option<Vec<String>> = match entry.get("args") {
                None => Some(vec![]),
                Some(Value::Array(items)) => items.iter().map(|a| a.as_str().map(str::to_owned)).collect(),
                Some(_) => None,
            };
            let env: Option<BTreeMap<String, String>> = match entry.get("env") {
                None => Some(BTreeMap::new()),
                Some(Value::Object(map)) => {
                    map.iter().map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect()
                }
                Some(_) => None,
            };
            let (Some(args), Some(env)) = (args, env) else {
                skipped.push(skip("arguments or environment that are not strings"));
                continue;
            };
            found.push(Found { at: path.clone(), key: key.clone(), command: command.to_owned(), args, env });
        }
    }
    (found, skipped)
}

/// `config` with the imported entries removed and, in each object that held one, a `postern`
/// entry running `postern_command mcp` (unless one is there already).
pub fn rewrite(config: &Value, imported: &[Found], postern_command: &str) -> Value {
    let mut out = config.clone();
    let holders: BTreeSet<&Vec<String>> = imported.iter().map(|f| &f.at).collect();
    for path in holders {
        let Some(Value::Object(entries)) = at_mut(&mut out, path) else { continue };
        for f in imported.iter().filter(|f| &f.at == path) {
            entries.remove(&f.key);
        }
        if !entries.values().any(is_postern) {
            let name = if entries.contains_key("postern") { "postern-gateway" } else { "postern" };
            entries.insert(name.into(), json!({ "command": postern_command, "args": ["mcp"] }));
        }
    }
    out
}

/// A vault name for the entry `key`: letters, digits, `-`, `_`, no `__`, at most 24 characters,
/// not in `taken`.
pub fn server_name(key: &str, taken: &BTreeSet<String>) -> String {
    let mut base: String =
        key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>();
    while base.contains("__") {
        base = base.replace("__", "_");
    }
    let base = base.trim_matches('_').chars().take(MAX_SERVER_NAME - 3).collect::<String>();
    let base = if base.is_empty() { "server".to_owned() } else { base };
    if !taken.contains(&base) {
        return base;
    }
    (2..).map(|n| format!("{base}-{n}")).find(|n| !taken.contains(n)).expect("some suffix is free")
}

/// A config file to look at.
#[derive(Debug)]
pub struct Source {
    pub label: String,
    pub path: PathBuf,
    pub layout: Layout,
}

/// The config files `from` names (agents or paths); without any, every known one that exists.
pub fn sources(from: &[String]) -> Result<Vec<Source>, ImportError> {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let cwd = std::env::current_dir().unwrap_or_default();
    let known = |name: &str| -> Option<Vec<Source>> {
        let s = |label: &str, path: PathBuf, layout| Source { label: label.into(), path, layout };
        Some(match name {
            "claude-code" => vec![
                s("claude-code", home.join(".claude.json"), Layout::ClaudeCode),
                s("claude-code (project)", cwd.join(".mcp.json"), Layout::McpServers),
            ],
            "claude-desktop" => {
                vec![s("claude-desktop", home.join(".config/Claude/claude_desktop_config.json"), Layout::McpServers)]
            }
            "cursor" => vec![s("cursor", home.join(".cursor/mcp.json"), Layout::McpServers)],
            "vscode" => vec![s("vscode", cwd.join(".vscode/mcp.json"), Layout::VsCode)],
            _ => return None,
        })
    };
    let names: Vec<String> = if from.is_empty() {
        ["claude-code", "claude-desktop", "cursor", "vscode"].map(String::from).to_vec()
    } else {
        from.to_vec()
    };
    let mut out = Vec::new();
    for name in &names {
        match known(name) {
            Some(found) => out.extend(found.into_iter().filter(|s| from.contains(name) || s.path.exists())),
            None => {
                let path = PathBuf::from(name);
                if !path.exists() {
                    return Err(ImportError::UnknownSource(name.clone()));
                }
                let layout = if path.ends_with(".vscode/mcp.json") { Layout::VsCode } else { Layout::McpServers };
                out.push(Source { label: "file".into(), path, layout });
            }
        }
    }
    Ok(out)
}

/// One file's part of the plan: its bytes, what is left in it and why, the servers to import
/// (with their vault names), and what the file will hold afterwards.
pub struct FilePlan {
    pub source: Source,
    /// Where the file really is, when `source.path` is a symbolic link to it (a dotfiles
    /// repository): that file is rewritten, the link is kept.
    pub real_path: Option<PathBuf>,
    /// The git work tree the file is in, if any: its history still holds what the file held.
    pub in_git: Option<PathBuf>,
    bytes: Vec<u8>,
    pub skipped: Vec<Skipped>,
    pub named: Vec<(Found, String)>,
    pub after: Vec<u8>,
}

impl std::fmt::Debug for FilePlan {
    /// The file's bytes (before and after) are not shown: before, they hold the secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilePlan")
            .field("source", &self.source)
            .field("skipped", &self.skipped)
            .field("named", &self.named)
            .finish_non_exhaustive()
    }
}

impl FilePlan {
    /// The server entries the file will hold afterwards.
    pub fn servers_after(&self) -> Vec<String> {
        let v: Value = serde_json::from_slice(&self.after).unwrap_or(Value::Null);
        holders(&v, self.source.layout)
            .iter()
            .filter_map(|p| at(&v, p).and_then(Value::as_object))
            .flat_map(|m| m.keys().cloned())
            .collect()
    }
}

/// What an import would do.
#[derive(Debug, Default)]
pub struct Plan {
    pub files: Vec<FilePlan>,
    /// Files named but not there, and files that are not JSON (with why): left alone.
    pub left_alone: Vec<(Source, String)>,
}

impl Plan {
    pub fn servers(&self) -> usize {
        self.files.iter().map(|f| f.named.len()).sum()
    }

    /// How many plaintext secrets (environment values and parts of arguments) would move into
    /// the keychain.
    pub fn secrets(&self) -> usize {
        self.files.iter().flat_map(|f| &f.named).map(|(f, name)| f.to_server(name).1.len()).sum()
    }
}

/// What an import would do with the config files `from` names (see [`sources`]); agents would be
/// pointed at `postern_command mcp`. Reads files and the vault; changes nothing.
pub fn plan(target: &dyn ImportTarget, from: &[String], postern_command: &str) -> Result<Plan, ImportError> {
    let mut taken = target.taken()?;
    let mut plan = Plan::default();
    for source in sources(from)? {
        let Ok(bytes) = std::fs::read(&source.path) else {
            plan.left_alone.push((source, "not found".into()));
            continue;
        };
        let config: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                plan.left_alone.push((source, format!("not JSON ({e})")));
                continue;
            }
        };
        let (found, skipped) = find_servers(&config, source.layout);
        let mut named = Vec::new();
        for f in found {
            let name = server_name(&f.key, &taken);
            taken.insert(name.clone());
            named.push((f, name));
        }
        let imported: Vec<Found> = named.iter().map(|(f, _)| f.clone()).collect();
        let after = if imported.is_empty() {
            bytes.clone()
        } else {
            serde_json::to_vec_pretty(&rewrite(&config, &imported, postern_command)).map_err(|e| ImportError::Io {
                what: "encode the rewritten config".into(),
                source: std::io::Error::other(e),
            })?
        };
        let real = std::fs::canonicalize(&source.path).ok().filter(|real| *real != source.path);
        let in_git = git_work_tree(real.as_deref().unwrap_or(&source.path));
        plan.files.push(FilePlan { source, real_path: real, in_git, bytes, skipped, named, after });
    }
    Ok(plan)
}

/// Carries out `plan`: each server into the vault (its secret values into the keychain), each
/// file's original bytes into the keychain, each file rewritten. Returns the servers' names.
pub fn apply(
    target: &dyn ImportTarget,
    data_dir: &Path,
    plan: Plan,
    now: postern_core::Timestamp,
) -> Result<Vec<String>, ImportError> {
    let mut record = Record { files: vec![], servers: vec![] };
    for FilePlan { source, real_path, bytes, named, after, .. } in
        plan.files.into_iter().filter(|f| !f.named.is_empty())
    {
        for (f, name) in named {
            let (server, values) = f.to_server(&name);
            target.add_server(server, values, now)?;
            record.servers.push(name);
        }
        // A link is followed: the file it points to is rewritten, the link stays.
        let path = real_path.unwrap_or(source.path);
        let backup = sha256_hex(path.to_string_lossy().as_bytes());
        target.backups().keep(&backup, &bytes)?;
        replace_file(&path, &after)?;
        record.files.push(FileRecord { path, backup, written_sha256: sha256_hex(&after) });
    }
    let path = record_path(data_dir);
    let text = serde_json::to_vec_pretty(&record)
        .map_err(|e| ImportError::Io { what: "encode".into(), source: std::io::Error::other(e) })?;
    write_private(&path, &text)?;
    let detail = json!({
        "record_sha256": sha256_hex(&text),
        "files": record.files.iter().map(|f| f.path.display().to_string()).collect::<Vec<_>>(),
        "servers": record.servers,
    });
    target.record(ImportEvent::ImportApplied, detail, now)?;
    Ok(record.servers)
}

/// Creates (or replaces) `path` owner-only (0600) with `bytes`, its directory 0700.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ImportError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = path.parent().expect("a parent");
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io("create the imports directory"))?;
    replace_file(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io("write the import record"))
}

/// The git work tree `path` is in (a directory above it holding `.git`), if any.
fn git_work_tree(path: &Path) -> Option<PathBuf> {
    path.ancestors().skip(1).find(|dir| dir.join(".git").exists()).map(Path::to_path_buf)
}

/// What [`undo`] restored and removed.
#[derive(Debug)]
pub struct Undone {
    pub restored: Vec<PathBuf>,
    pub removed: Vec<String>,
}

/// Restores the files of the last import byte for byte (refused if one changed since) and
/// removes the servers it added.
pub fn undo(target: &dyn ImportTarget, data_dir: &Path, now: postern_core::Timestamp) -> Result<Undone, ImportError> {
    let path = record_path(data_dir);
    let text = std::fs::read(&path).map_err(|_| ImportError::NothingToUndo)?;
    // The record must be the one the journal vouches for: an edited one could name other files
    // to write the originals (secrets and all) to, or other servers to remove.
    match target.last_record()? {
        Some((ImportEvent::ImportApplied, detail)) if detail["record_sha256"].as_str() == Some(&sha256_hex(&text)) => {}
        Some((ImportEvent::ImportUndone, _)) | None => return Err(ImportError::NothingToUndo),
        Some(_) => return Err(ImportError::RecordTampered(path)),
    }
    let record: Record = serde_json::from_slice(&text)
        .map_err(|e| ImportError::Io { what: "read the import record".into(), source: std::io::Error::other(e) })?;
    for f in &record.files {
        // A backup is kept under its own file's digest: a record naming another path for it
        // would write that file's original (secrets and all) somewhere else.
        if f.backup != sha256_hex(f.path.to_string_lossy().as_bytes()) {
            return Err(ImportError::RecordTampered(path));
        }
        let current = std::fs::read(&f.path).map_err(|_| ImportError::ChangedSince(f.path.clone()))?;
        if sha256_hex(&current) != f.written_sha256 {
            return Err(ImportError::ChangedSince(f.path.clone()));
        }
    }
    let mut undone = Undone { restored: vec![], removed: vec![] };
    for f in &record.files {
        let backups = target.backups();
        let original = backups.get(&f.backup)?.ok_or_else(|| ImportError::NoBackup(f.path.clone()))?;
        replace_file(&f.path, original.expose())?;
        backups.drop_backup(&f.backup)?;
        undone.restored.push(f.path.clone());
    }
    for name in &record.servers {
        if target.has_server(name)? {
            target.remove_server(name, now)?;
            undone.removed.push(name.clone());
        }
    }
    std::fs::remove_file(&path).map_err(io("remove the import record"))?;
    let detail =
        json!({ "record_sha256": sha256_hex(&text), "restored": undone.restored.len(), "removed": undone.removed });
    target.record(ImportEvent::ImportUndone, detail, now)?;
    Ok(undone)
}

/// What an import did, kept in the data directory (no secrets: paths, hashes, names) for
/// [`undo`], owner-only, its digest journaled.
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    files: Vec<FileRecord>,
    servers: Vec<String>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct FileRecord {
    path: PathBuf,
    /// The keychain backup's key.
    backup: String,
    /// SHA-256 of what the import wrote: [`undo`] refuses a file changed since.
    written_sha256: String,
}

fn record_path(data_dir: &Path) -> PathBuf {
    data_dir.join("imports").join("last.json")
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `bytes` to `path` through a temporary file and a rename, keeping the file's mode. The
/// temporary file is created owner-only (what [`undo`] writes back holds the secrets) and only
/// then given the original's mode.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), ImportError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("postern-tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(format!("create {}", tmp.display())))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io(format!("write {}", tmp.display())))?;
    if let Ok(meta) = std::fs::metadata(path) {
        std::fs::set_permissions(&tmp, meta.permissions()).map_err(io(format!("chmod {}", tmp.display())))?;
    }
    std::fs::rename(&tmp, path).map_err(io(format!("replace {}", path.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests;
