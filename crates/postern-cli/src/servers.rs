//! `postern servers …`: the upstream MCP servers whose tools Postern offers agents, each call an
//! execution. Adding one is the owner's act at a terminal; secret environment values are read
//! from a hidden prompt or standard input (never argv) straight into the keychain.

use crate::{Failure, render};
use anyhow::{Context, anyhow};
use postern_core::Outside;
use postern_core::ReplayClass;
use postern_gateway::door::control::{ControlRequest, SecretText};
use postern_vault::{McpServer, Sensitive, ServerStart, ToolOverride};
use std::{collections::BTreeMap, io::Read, path::Path, process::ExitCode};

#[derive(clap::Args, Debug)]
pub struct Add {
    /// The server's name: its tools are offered as `<name>__<tool>`.
    name: String,
    /// A plain (non-secret) environment value for the server: KEY=VALUE; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// An environment value that is a secret (an API token): its value is read from a hidden
    /// prompt, or one line per --secret-env from standard input, into the keychain.
    #[arg(long = "secret-env", value_name = "KEY")]
    secret_env: Vec<String>,
    /// Ask a reviewer before every call to this server's tools.
    #[arg(long)]
    approve_every_use: bool,
    /// A remote server's Streamable HTTP endpoint (instead of a command).
    #[arg(long, value_name = "URL", conflicts_with_all = ["env", "secret_env"])]
    url: Option<String>,
    /// The vault credential (bearer or header) sent to the remote server; its binding must
    /// allow the URL.
    #[arg(long, value_name = "NAME", requires = "url")]
    credential: Option<String>,
    /// The remote server signs in with OAuth: run `postern servers login NAME` next. Postern
    /// keeps the tokens in the OS keychain and refreshes them.
    #[arg(long, requires = "url", conflicts_with = "credential")]
    oauth: bool,
    /// A scope to ask for at sign-in (repeat for several; none: what the server suggests).
    #[arg(long = "scope", value_name = "SCOPE", requires = "oauth")]
    scope: Vec<String>,
    /// A client registered by hand with the authorization server (else a Client ID Metadata
    /// Document, else Dynamic Client Registration).
    #[arg(long, value_name = "ID", requires = "oauth", conflicts_with = "client_metadata_url")]
    client_id: Option<String>,
    /// The https URL of a Client ID Metadata Document you host for Postern: its client ID at an
    /// authorization server that takes such documents (else Dynamic Client Registration).
    #[arg(long, value_name = "URL", requires = "oauth")]
    client_metadata_url: Option<String>,
    /// When its process starts: with the gateway, or when an agent first lists tools or calls one
    /// of its tools.
    #[arg(long, value_enum, default_value_t = Start::WithGateway)]
    start: Start,
    /// The command that starts the server over stdio, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Start {
    WithGateway,
    OnFirstUse,
}

impl From<Start> for ServerStart {
    fn from(s: Start) -> Self {
        match s {
            Start::WithGateway => ServerStart::WithGateway,
            Start::OnFirstUse => ServerStart::OnFirstUse,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Set {
    name: String,
    /// When its process starts.
    #[arg(long, value_enum)]
    start: Start,
}

/// `postern servers set NAME --start …`: journaled; a running gateway applies it at its next start.
pub fn set(data_dir: &Path, args: Set) -> Result<ExitCode, Failure> {
    let start: ServerStart = args.start.into();
    crate::route::perform(data_dir, ControlRequest::SetServerStart { name: args.name.clone(), start })?;
    eprintln!("MCP server {:?} now starts {}", args.name, start.as_str().replace('_', " "));
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Class {
    ReadOnly,
    Idempotent,
    IdempotencyKey,
    Irreversible,
}

#[derive(clap::Args, Debug)]
pub struct Contract {
    /// The server.
    server: String,
    /// The tool, by the server's own name for it (not `<server>__<tool>`).
    tool: String,
    /// What an unknown outcome allows: read_only and idempotent are re-sent, idempotency_key is
    /// re-sent with the same key, irreversible goes to a reviewer.
    #[arg(long, value_enum, required_unless_present_any = ["clear", "confirm", "approve_every_use", "secret_argument"])]
    class: Option<Class>,
    /// Confirm the class the server's annotations suggest, as `servers tools` showed it
    /// ("server hints read_only: unconfirmed"): until then the tool is held to irreversible.
    /// Refused if the server hints something else now.
    #[arg(long, value_enum, value_name = "CLASS", conflicts_with_all = ["class", "idempotency_argument", "clear"])]
    confirm: Option<Class>,
    /// The argument Postern fills with the execution ID (with --class idempotency_key).
    #[arg(long, value_name = "ARGUMENT")]
    idempotency_argument: Option<String>,
    /// Ask a reviewer before every call to this tool.
    #[arg(long)]
    approve_every_use: bool,
    /// An argument that carries a secret: digested in the record, masked for reviewers.
    #[arg(long = "secret-argument", value_name = "ARGUMENT")]
    secret_argument: Vec<String>,
    /// Forget the owner's contract: the annotations decide again.
    #[arg(long, conflicts_with_all = ["class", "confirm", "idempotency_argument", "approve_every_use", "secret_argument"])]
    clear: bool,
    /// Tool manifest (default: as `serve`): a tool it decides cannot be set here.
    #[arg(long, env = "POSTERN_TOOLS", value_name = "FILE")]
    tools: Option<std::path::PathBuf>,
}

/// `postern servers contract SERVER TOOL …`: starts the server to check the tool and the
/// argument against its schema, then keeps the contract in the server's record (journaled).
pub fn contract(data_dir: &Path, args: Contract) -> Result<ExitCode, Failure> {
    let overrides = crate::serve::manifest(args.tools.as_deref())?.server_overrides().clone();
    let replay_class = |c: Class| match c {
        Class::ReadOnly => ReplayClass::ReadOnly,
        Class::Idempotent => ReplayClass::Idempotent,
        Class::IdempotencyKey => ReplayClass::IdempotencyKey,
        Class::Irreversible => ReplayClass::Irreversible,
    };
    let mut class = args.class.map(replay_class);
    if let Some(expected) = args.confirm.map(replay_class) {
        // What the server hints now, as the owner would see it in `servers tools`.
        let listed = crate::route::perform_with(
            data_dir,
            ControlRequest::ServerTools { name: args.server.clone() },
            &overrides,
        )?;
        let tool = listed.as_array().into_iter().flatten().find(|t| t["tool"] == args.tool.as_str());
        let hinted = tool.and_then(|t| t["hinted"].as_str()).and_then(|h| match h {
            "read_only" => Some(ReplayClass::ReadOnly),
            "idempotent" => Some(ReplayClass::Idempotent),
            _ => None,
        });
        let Some(hinted) = hinted else {
            let why = if tool.is_some() { "gives no hint to confirm" } else { "offers no such tool" };
            return Err(Failure {
                code: 2,
                error: anyhow!(
                    "MCP server {:?} {why} for {:?}: choose a contract with --class",
                    Outside::line(&args.server),
                    Outside::line(&args.tool)
                ),
            });
        };
        // What the owner saw is what is confirmed: a server whose hint changed since is refused.
        if hinted != expected {
            return Err(Failure {
                code: 2,
                error: anyhow!(
                    "MCP server {:?} now hints {} for {:?}, not {}: look again with `postern servers tools {}`",
                    Outside::line(&args.server),
                    hinted.as_str(),
                    Outside::line(&args.tool),
                    expected.as_str(),
                    Outside::line(&args.server)
                ),
            });
        }
        class = Some(hinted);
    }
    let contract = (!args.clear).then(|| ToolOverride {
        class,
        idempotency_argument: args.idempotency_argument,
        approve_every_use: args.approve_every_use,
        secret_arguments: args.secret_argument.into_iter().collect(),
    });
    let request = ControlRequest::SetToolContract { server: args.server.clone(), tool: args.tool.clone(), contract };
    crate::route::perform_with(data_dir, request, &overrides)?;
    if args.clear {
        eprintln!(
            "{}__{}: the owner's contract is cleared; it is irreversible until its hints are confirmed",
            args.server, args.tool
        );
    } else if args.confirm.is_some() {
        let confirmed = class.map_or("", |c| c.as_str());
        eprintln!(
            "{}__{}: the server's hint ({confirmed}) is confirmed: it is the tool's contract now",
            args.server, args.tool
        );
    } else {
        eprintln!("{}__{}: contract set (see `postern servers tools {}`)", args.server, args.tool, args.server);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn add(data_dir: &Path, args: Add) -> Result<ExitCode, Failure> {
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(Failure { code: 2, error: anyhow!("--env needs KEY=VALUE (the value is not shown here)") });
        };
        // The value would be journaled (a row that can never be removed) and listed: a secret
        // goes in through --secret-env, into the keychain.
        if postern_host::plaintext::env_is_secret(k, v) {
            return Err(Failure {
                code: 2,
                error: anyhow!(
                    "--env {}=… looks like a secret (by its name or its value); nothing was added. Give it with \
                     --secret-env {} instead: its value is then read from a hidden prompt (or standard input) into \
                     the OS keychain",
                    Outside::line(k),
                    Outside::line(k)
                ),
            });
        }
        env.insert(k.to_owned(), v.to_owned());
    }
    if let Some(url) = &args.url
        && let Some(range) = postern_host::plaintext::secret_in(url)
    {
        return Err(Failure {
            code: 2,
            error: anyhow!(
                "--url holds a secret ({} characters at byte {}): it would be journaled, logged and listed. Keep \
                 it in a vault credential (`postern vault add NAME --kind bearer|basic|header --host HOST`) and give \
                 --credential NAME; nothing was added",
                range.len(),
                range.start
            ),
        });
    }
    let mut moved_from_argv = Vec::new();
    let server = match (&args.url, args.command.split_first()) {
        (Some(_), Some(_)) => {
            return Err(Failure { code: 2, error: anyhow!("give either --url or a command after `--`, not both") });
        }
        (None, None) => {
            return Err(Failure {
                code: 2,
                error: anyhow!("give the command that starts the server after `--`, or --url"),
            });
        }
        (Some(url), None) => McpServer {
            name: args.name,
            url: Some(url.clone()),
            credential: args.credential,
            oauth: args.oauth.then_some(postern_vault::OAuthSettings {
                scopes: args.scope,
                client_id: args.client_id,
                client_metadata_url: args.client_metadata_url,
            }),
            approve_every_use: args.approve_every_use,
            start: args.start.into(),
            ..McpServer::default()
        },
        (None, Some((command, rest))) => {
            // Secrets typed into the command line (a DSN's password, `--access-token …`) go to the
            // keychain like --secret-env values; the server gets them back in its argv.
            let postern_host::plaintext::SplitArgs { shown, places: secret_args, secrets } =
                postern_host::plaintext::split_args(rest, &args.secret_env);
            moved_from_argv = secrets;
            McpServer {
                name: args.name,
                command: command.clone(),
                args: shown,
                env,
                secret_env: args.secret_env,
                secret_args,
                approve_every_use: args.approve_every_use,
                start: args.start.into(),
                ..McpServer::default()
            }
        }
    };
    server.validate()?;
    let mut secrets = read_secrets(&server.secret_env)?;
    for (name, _) in &moved_from_argv {
        eprintln!(
            "the command line holds a secret ({}): it is kept in the OS keychain, listed as <{}>, and put back only \
             into the server's arguments. It is still in your shell's history: clear it there",
            Outside::line(name),
            Outside::line(name)
        );
    }
    secrets.extend(moved_from_argv);
    let loaders = server.loader_variables();
    if !loaders.is_empty() {
        eprintln!(
            "note: it sets {}, which change(s) what code the program loads or runs; a reviewer confirming this \
             change sees the values",
            Outside::line(&loaders.join(", "))
        );
    }
    let (name, count) = (server.name.clone(), secrets.len());
    let secrets = secrets.into_iter().map(|(k, v)| (k, SecretText(v))).collect();
    let oauth = server.oauth.is_some();
    crate::route::perform(data_dir, ControlRequest::AddServer { server, secrets })?;
    if oauth {
        eprintln!(
            "added MCP server {name:?}; it signs in with OAuth and has no token yet: run `postern servers login {name}`"
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "added MCP server {name:?} ({count} secret value(s) in the OS keychain); its tools are offered as \
         {name}__<tool> by the gateway (see `postern servers tools {name}`)"
    );
    Ok(ExitCode::SUCCESS)
}

/// One value per key: hidden prompts at a terminal, else one line each from standard input.
fn read_secrets(keys: &[String]) -> Result<Vec<(String, Sensitive<String>)>, Failure> {
    use std::io::IsTerminal;
    if keys.is_empty() {
        return Ok(vec![]);
    }
    if std::io::stdin().is_terminal() {
        return keys
            .iter()
            .map(|k| {
                let value = rpassword::prompt_password(format!("{k} (not echoed): ")).context("read secret")?;
                Ok((k.clone(), Sensitive::new(value)))
            })
            .collect();
    }
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("read secrets from standard input")?;
    let text = Sensitive::new(text);
    let lines: Vec<&str> = text.expose().lines().collect();
    if lines.len() < keys.len() {
        return Err(Failure {
            code: 2,
            error: anyhow!(
                "standard input has {} line(s) but {} secret value(s) were declared ({}); give one line per \
                 --secret-env, in order",
                lines.len(),
                keys.len(),
                keys.join(", ")
            ),
        });
    }
    Ok(keys.iter().zip(lines).map(|(k, v)| (k.clone(), Sensitive::new(v.trim_end_matches('\r').to_owned()))).collect())
}

/// The servers in the journal (read-only, so it works beside a running gateway) and, when a
/// gateway runs, each one's state as it sees it (through the control socket).
pub fn list(data_dir: &Path, json: bool) -> Result<ExitCode, Failure> {
    let view = crate::journal::view(data_dir)?;
    let servers: Vec<McpServer> = view
        .credentials()?
        .iter()
        .filter(|r| r.kind == postern_vault::MCP_SERVER_KIND)
        .map(McpServer::from_record)
        .collect::<Result<_, _>>()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the runtime")?;
    let asked = runtime.block_on(postern_gateway::door::control::request(
        data_dir,
        &postern_gateway::door::control::ControlRequest::ServersStatus,
    ));
    let statuses = match asked {
        Ok(postern_gateway::door::control::ControlReply::Servers { servers }) => Some(servers),
        _ => None,
    };
    let state_of = |name: &str| -> (String, Option<usize>, Option<String>) {
        match &statuses {
            None => ("stopped (no gateway running)".into(), None, None),
            Some(all) => match all.iter().find(|s| s.name == name) {
                Some(s) => (s.state.clone(), (s.state == "running").then_some(s.tools), s.last_error.clone()),
                None => ("stopped".into(), None, None),
            },
        }
    };
    let pid_of = |name: &str| statuses.as_ref().and_then(|all| all.iter().find(|s| s.name == name)).and_then(|s| s.pid);
    if json {
        let out: Vec<serde_json::Value> = servers
            .iter()
            .map(|s| {
                let (state, tools, last_error) = state_of(&s.name);
                let sign_in = match &s.oauth {
                    Some(_) => Some(postern_engine::channel::oauth::standing(&view, &s.name)?),
                    None => None,
                };
                Ok(serde_json::json!({ "name": s.name, "command": s.command, "args": s.args, "env": s.env,
                                    "secret_env": s.secret_env,
                                    "secret_args": s.secret_args.iter().map(|a| &a.name).collect::<Vec<_>>(),
                                    "approve_every_use": s.approve_every_use,
                                    "url": s.url, "credential": s.credential, "start": s.start,
                                    "state": state, "tools": tools, "last_error": last_error, "pid": pid_of(&s.name),
                                    "oauth": s.oauth, "sign_in": sign_in }))
            })
            .collect::<Result<_, Failure>>()?;
        crate::render::print_json(&out).context("encode")?;
        return Ok(ExitCode::SUCCESS);
    }
    if servers.is_empty() {
        println!("no MCP servers; add one with `postern servers add NAME [--secret-env KEY]… -- COMMAND ARGS…`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t =
        render::table(&["server", "state", "tools", "command or URL", "environment", "secrets (in the keychain)"]);
    for s in &servers {
        let launched = s.launched();
        let (state, tools, last_error) = state_of(&s.name);
        let state = match last_error {
            Some(e) if state != "running" => format!("{state}: {e}"),
            _ if state != "running" && s.start == ServerStart::OnFirstUse => format!("{state} (starts on first use)"),
            _ => state,
        };
        let state = match &s.oauth {
            Some(_) => {
                format!("{state}; {}", postern_engine::channel::oauth::standing(&view, &s.name)?.said)
            }
            None => state,
        };
        t.add_row(vec![
            s.name.clone(),
            state,
            tools.map_or_else(|| "-".into(), |n| n.to_string()),
            launched,
            s.env.keys().cloned().collect::<Vec<_>>().join(", "),
            s.secret_names().join(", "),
        ]);
    }
    println!("{}", t.trim_fmt());
    Ok(ExitCode::SUCCESS)
}

/// Restarts a server in the running gateway (through its control socket).
pub fn restart(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    use postern_gateway::door::control::{ControlReply, ControlRequest, request};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the runtime")?;
    let asked = runtime.block_on(request(data_dir, &ControlRequest::RestartServer { name: name.to_owned() }));
    match asked {
        Ok(ControlReply::Servers { servers }) => {
            for s in servers {
                eprintln!("restarted {:?}: {} ({} tools)", s.name, s.state, s.tools);
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok(ControlReply::Refused { message, .. }) => Err(Failure { code: 1, error: anyhow!("{message}") }),
        Ok(ControlReply::Done | ControlReply::Answer { .. }) => {
            Err(Failure { code: 1, error: anyhow!("the gateway gave no status") })
        }
        Err(_) => Err(Failure {
            code: 1,
            error: anyhow!("no gateway is running here: servers start with `postern serve` (or the desktop app)"),
        }),
    }
}

pub fn remove(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    // Only a server: `vault remove` is the command for credentials and SSH hosts.
    let is_server = crate::journal::view(data_dir)?
        .credentials()?
        .iter()
        .any(|r| r.kind == postern_vault::MCP_SERVER_KIND && r.name == name);
    if !is_server {
        return Err(postern_vault::VaultError::UnknownMcpServer(name.to_owned()).into());
    }
    crate::route::perform(data_dir, ControlRequest::Remove { name: name.to_owned() })?;
    eprintln!("removed MCP server {name:?} and its secret values from the keychain");
    Ok(ExitCode::SUCCESS)
}

/// Starts the server (as the gateway would), lists its tools with the contract Postern derives
/// for each, and stops it.
pub fn tools(data_dir: &Path, name: &str, manifest: Option<&Path>, json: bool) -> Result<ExitCode, Failure> {
    let overrides = crate::serve::manifest(manifest)?.server_overrides().clone();
    let answer =
        crate::route::perform_with(data_dir, ControlRequest::ServerTools { name: name.to_owned() }, &overrides)?;
    let tools = answer.as_array().cloned().unwrap_or_default();
    if json {
        crate::render::print_json(&tools).context("encode")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = render::table(&["tool (as agents see it)", "replay contract", "from", "approve every use"]);
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    for tool in &tools {
        let contract = match tool["idempotency_argument"].as_str() {
            Some(a) => format!("{} ({a})", text(&tool["contract"])),
            None => text(&tool["contract"]),
        };
        let from = match (text(&tool["contract_from"]).as_str(), tool["hinted"].as_str()) {
            ("hints_unconfirmed", Some(hinted)) => {
                format!("server hints {hinted}: unconfirmed (--confirm {})", hinted.replace('_', "-"))
            }
            (from, _) => from.to_owned(),
        };
        t.add_row(vec![
            text(&tool["name"]),
            contract,
            from,
            if tool["approve_every_use"] == true { "yes" } else { "no" }.into(),
        ]);
    }
    println!("{}", t.trim_fmt());
    eprintln!(
        "a tool is irreversible unless its owner sets a contract: `postern servers contract {name} TOOL --class …`, \
         `… TOOL --confirm CLASS` (take what the server's annotations suggest, which are only its claims), the app's \
         Servers view, or [servers.{name}.tools.<tool>] in tools.toml"
    );
    Ok(ExitCode::SUCCESS)
}
