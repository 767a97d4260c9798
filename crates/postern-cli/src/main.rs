//! The `postern` command line: the entry point users, scripts and incident responders share.
//!
//! Exit codes are part of the interface: 0 success / intact, 1 tampering found, 2 unusable
//! input (missing file, not a Postern database, newer schema, bad arguments).

/// mimalloc, not glibc's malloc: the gateway allocates per request on every thread, and glibc's
/// malloc and free were ~15% of `postern serve`'s profile under 8 sessions (docs: Benchmarks).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod agents;
mod audit;
mod bridge;
mod call;
mod import;
mod journal;
mod location;
mod render;
mod route;
mod serve;
mod servers;
mod service;
mod signin;
mod terminal;
mod vault;

use clap::{Parser, Subcommand};
use postern_core::{ErrorCode, ExecutionId, SessionId};
use std::{path::PathBuf, process::ExitCode};

#[derive(Parser, Debug)]
#[command(name = "postern", version, about = "Credential vault and MCP gateway with execution identity")]
struct Cli {
    /// Data directory (default: the OS data dir, e.g. ~/.local/share/postern on Linux).
    #[arg(long, global = true, env = "POSTERN_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway headless: the `postern mcp` socket and Streamable HTTP on 127.0.0.1.
    /// Logs go to stderr; SIGINT/SIGTERM stop it after executions in flight are journaled.
    Serve(serve::ServeArgs),
    /// The stdio bridge an agent launches (`claude mcp add postern -- postern mcp`): relays MCP
    /// between stdin/stdout and the running gateway.
    Mcp,
    /// Open (creating if needed) the data directory and journal, recover executions a previous
    /// run left dispatched, and print a summary.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Check this machine's Postern — keychain, data directory, journal, sockets, HTTP port, a
    /// running gateway, the agent configs — and say how to fix what is wrong. Changes nothing.
    Doctor {
        /// The HTTP port a gateway would use (default 7387).
        #[arg(long, default_value_t = postern_gateway::door::streamable::DEFAULT_PORT)]
        port: u16,
        #[arg(long)]
        json: bool,
    },
    /// Run `postern serve` as a systemd user service, started at login (headless: no approver).
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// Verify the journal or export a checkpoint of it.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Show the Activity journal (most recent rows, oldest first).
    Activity {
        #[arg(long, value_name = "ID")]
        execution: Option<ExecutionId>,
        #[arg(long, value_name = "ID")]
        session: Option<SessionId>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Show the Sessions journal (agent runs).
    Sessions {
        #[command(subcommand)]
        command: Option<SessionsCommand>,
        #[arg(long)]
        json: bool,
    },
    /// Inspect one execution.
    Execution {
        #[command(subcommand)]
        command: ExecutionCommand,
    },
    /// Bearer tokens for agents that use Streamable HTTP.
    Agents {
        #[command(subcommand)]
        command: AgentsCommand,
    },
    /// Run one tool through the engine (journal, retry matching, vault, HTTP) without an agent.
    Call(call::CallArgs),
    /// Tool manifests.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Credentials in the OS keychain, and the vault lock.
    Vault {
        #[command(subcommand)]
        command: VaultCommand,
    },
    /// Upstream MCP servers: their secrets in the keychain, their tools offered through the
    /// gateway as `<server>__<tool>`, every call an execution.
    Servers {
        #[command(subcommand)]
        command: ServersCommand,
    },
    /// SSH hosts: housekeeping of the marker protocol.
    Ssh {
        #[command(subcommand)]
        command: SshCommand,
    },
}

#[derive(Subcommand, Debug)]
enum SshCommand {
    /// Remove marker directories (~/.postern/executions/act_…) older than --older-than-days.
    Gc {
        /// The SSH host (as named in the vault).
        host: String,
        #[arg(long, default_value_t = 30)]
        older_than_days: u32,
    },
}

#[derive(Subcommand, Debug)]
enum ServersCommand {
    /// Add a stdio MCP server: `postern servers add github --secret-env GITHUB_TOKEN -- npx -y
    /// @modelcontextprotocol/server-github`. Secret values come from a hidden prompt or stdin.
    Add(servers::Add),
    /// List the servers (command, environment names, which values are secrets; never a secret).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove a server and its secret values from the keychain.
    Remove { name: String },
    /// Stop a server in the running gateway (SIGTERM, then SIGKILL after 3 s) and start it again.
    Restart { name: String },
    /// Sign a remote server (added with --oauth) in: opens the browser at its authorization
    /// server, takes the redirect on 127.0.0.1, keeps the tokens in the OS keychain.
    Login(signin::Login),
    /// Forget a server's OAuth tokens, revoking them where the server offers it.
    Logout { name: String },
    /// Move the MCP servers in your agents' config files (Claude Code, Claude Desktop, Cursor,
    /// VS Code) into Postern: each secret into the keychain, each config rewritten to `postern
    /// mcp`. Shows the plan first (secrets by name and length only); `--undo` restores the files.
    Import(import::ImportArgs),
    /// Change a server's settings: when it starts.
    Set(servers::Set),
    /// Hold one of a server's tools to a replay contract of your choosing (its annotations are
    /// only the server's hints): `postern servers contract github create_issue --class
    /// idempotency_key --idempotency-argument requestId`. `--clear` goes back to the annotations.
    Contract(servers::Contract),
    /// Start the server, list its tools with the replay contract Postern holds each to, stop it.
    Tools {
        name: String,
        /// Tool manifest with `[servers.<name>.tools.<tool>]` overrides (default: as `serve`).
        #[arg(long, env = "POSTERN_TOOLS", value_name = "FILE")]
        tools: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ServiceCommand {
    /// Write ~/.config/systemd/user/postern.service and (unless --no-enable) enable and start it.
    Install {
        #[arg(long)]
        no_enable: bool,
    },
    /// Stop and disable the service and remove its unit file.
    Uninstall,
}

#[derive(Subcommand, Debug)]
enum SessionsCommand {
    /// Revoke an agent run: its calls are denied from now on, and it is never authorized again.
    Revoke { id: SessionId },
}

#[derive(Subcommand, Debug)]
enum AgentsCommand {
    /// Create an agent and print its token once (only a hash is kept).
    Add { name: String },
    /// List agents (never their tokens).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke an agent's token.
    Revoke { name: String },
}

#[derive(Subcommand, Debug)]
enum ToolsCommand {
    /// Check a manifest: every tool, its replay contract; every problem with file and line.
    /// Without FILE, the one `serve` would use (POSTERN_TOOLS, else tools.toml in the config
    /// directory; no such file: the built-in tools).
    Check {
        #[arg(env = "POSTERN_TOOLS", value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// The tools agents are offered (built-ins and the manifest's; upstream servers' tools are
    /// listed by `postern servers tools NAME`), each with its replay contract.
    List {
        /// Tool manifest (default: tools.toml in the config directory, or POSTERN_TOOLS).
        #[arg(long, env = "POSTERN_TOOLS", value_name = "FILE")]
        tools: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum VaultCommand {
    /// Add a credential; the secret is read from a hidden prompt or standard input, never argv.
    Add(vault::Add),
    /// Add an SSH host: address, account, its private key (into the keychain) and host-key policy.
    AddSsh(vault::AddSsh),
    /// List credentials (names, kinds, where they may be sent; never secrets).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove a credential and its keychain item.
    Remove { name: String },
    /// Lock the vault: every action is denied until unlocked.
    Lock,
    /// Unlock the vault.
    Unlock,
}

#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Recompute the journal's hash chain offline and name the first row that does not verify.
    /// Exit 0 = intact, 1 = tampering found, 2 = unusable input.
    Verify {
        /// Database file (default: postern.db in the data directory).
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
        /// An exported checkpoint to compare the journal with: a checkpoint note (its Merkle tree
        /// root) or the JSON format (its chain head).
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
        /// The trusted journal key to check the checkpoint's signature with: hex or the verifier
        /// key (`audit pubkey [--vkey]`), or @FILE; needs no keychain.
        #[arg(long, value_name = "KEY")]
        pubkey: Option<String>,
        /// Check the chain (and checkpoint) only, not the current-state and result tables
        /// against it: faster on very large journals.
        #[arg(long)]
        chain_only: bool,
        #[arg(long)]
        json: bool,
    },
    /// Record the current journal head, sign it with the installation's journal key, and write it
    /// as a checkpoint to keep off-machine: a C2SP checkpoint note (origin, size, Merkle tree
    /// root), the format transparency-log witnesses read.
    Checkpoint {
        /// Where to write the checkpoint (default: standard output).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Write the JSON format instead (the chain head, `postern-checkpoint/1`).
        #[arg(long)]
        json: bool,
    },
    /// Prove the journal to a witness or an investigator: that it extends an older checkpoint
    /// (`--from`: prints a tlog-witness add-checkpoint request body, with a new checkpoint; exit 1
    /// when history was rewritten), or that it holds a row (`--row`: the row, its leaf hash and
    /// its audit path).
    Prove {
        /// An older checkpoint note: prove the journal extends it.
        #[arg(long, value_name = "FILE", required_unless_present = "row", conflicts_with = "row")]
        from: Option<PathBuf>,
        /// A row (its seq): prove the tree holds it.
        #[arg(long, value_name = "SEQ")]
        row: Option<u64>,
        /// With --row: the tree of this many rows (an older checkpoint's size; default: now).
        #[arg(long, value_name = "N", requires = "row", conflicts_with = "checkpoint")]
        size: Option<u64>,
        /// With --row: prove against the tree this checkpoint note committed to (its size and
        /// root), not the journal's own.
        #[arg(long, value_name = "FILE", requires = "row")]
        checkpoint: Option<PathBuf>,
        /// The trusted journal key, to check the older checkpoint's signature (hex or verifier
        /// key, or @FILE).
        #[arg(long, value_name = "KEY")]
        pubkey: Option<String>,
        /// With --row: print JSON.
        #[arg(long, requires = "row")]
        json: bool,
    },
    /// Print the public half of the journal-signing key (keep it off-machine with checkpoints).
    Pubkey {
        /// As a signed-note verifier key (`postern/<installation>+keyid+key`), the form a
        /// witness is configured with.
        #[arg(long)]
        vkey: bool,
    },
    /// Rebuild the tables that grant authority (lock, credentials and SSH hosts, agent tokens,
    /// session grants, allowlist) from the journal, after checking its chain; journals what it
    /// changed. For a database `audit verify` found edited behind the journal's back (the
    /// gateway refuses to start on one). No gateway may be running.
    Rederive,
}

#[derive(Subcommand, Debug)]
enum ExecutionCommand {
    /// Print the lifecycle timeline of one execution.
    Show {
        id: ExecutionId,
        #[arg(long)]
        json: bool,
    },
}

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error: anyhow::Error = e.into();
        // Anything the store says about the input file is "unusable input"; so are credential
        // definitions the vault refuses.
        // The host wraps the store's and the vault's errors: judge them the same way.
        let host_error = error.downcast_ref::<postern_host::HostError>();
        let store_error = error.downcast_ref::<postern_store::StoreError>().or(match host_error {
            Some(postern_host::HostError::Store(e)) => Some(e),
            _ => None,
        });
        let vault_error = error.downcast_ref::<postern_vault::VaultError>().or(match host_error {
            Some(postern_host::HostError::Vault(e)) => Some(e),
            _ => None,
        });
        let code = if let Some(postern_host::HostError::Setting { .. } | postern_host::HostError::Manifest { .. }) =
            host_error
        {
            2
        } else if let Some(e) = store_error {
            if e.code() == "database_error" || e.is_unwritable() { 1 } else { 2 }
        } else if let Some(e) = vault_error {
            match e.code() {
                "invalid_credential"
                | "empty_secret"
                | "duplicate_credential"
                | "unknown_credential"
                | "unknown_mcp_server" => 2,
                _ => 1,
            }
        } else {
            1
        };
        Failure { code, error }
    }
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let data_dir = location::data_dir(cli.data_dir)?;
    match cli.command {
        Command::Serve(args) => serve::serve(&data_dir, args),
        Command::Mcp => bridge::bridge(&data_dir),
        Command::Status { json } => journal::status(&data_dir, json),
        Command::Doctor { port, json } => doctor(&data_dir, port, json),
        Command::Service { command: ServiceCommand::Install { no_enable } } => service::install(&data_dir, !no_enable),
        Command::Service { command: ServiceCommand::Uninstall } => service::uninstall(),
        Command::Audit { command: AuditCommand::Verify { db, checkpoint, pubkey, chain_only, json } } => {
            let db = db.unwrap_or_else(|| location::database(&data_dir));
            audit::verify(&db, checkpoint.as_deref(), pubkey.as_deref(), chain_only, json)
        }
        Command::Audit { command: AuditCommand::Checkpoint { out, json } } => {
            audit::checkpoint(&data_dir, out.as_deref(), json)
        }
        Command::Audit { command: AuditCommand::Prove { from: Some(from), pubkey, .. } } => {
            audit::prove_from(&data_dir, &from, pubkey.as_deref())
        }
        Command::Audit { command: AuditCommand::Prove { row, size, checkpoint, pubkey, json, .. } } => {
            audit::prove_row(&data_dir, row.unwrap_or_default(), size, checkpoint.as_deref(), pubkey.as_deref(), json)
        }
        Command::Audit { command: AuditCommand::Rederive } => audit::rederive(&data_dir),
        Command::Audit { command: AuditCommand::Pubkey { vkey } } => audit::pubkey(&data_dir, vkey),
        Command::Call(args) => call::run(&data_dir, args),
        Command::Agents { command } => match command {
            AgentsCommand::Add { name } => agents::add(&data_dir, &name),
            AgentsCommand::List { json } => agents::list(&data_dir, json),
            AgentsCommand::Revoke { name } => agents::revoke(&data_dir, &name),
        },
        Command::Tools { command: ToolsCommand::Check { file } } => tools_check(file.as_deref(), false),
        Command::Tools { command: ToolsCommand::List { tools, json } } => tools_check(tools.as_deref(), json),
        Command::Servers { command } => match command {
            ServersCommand::Add(args) => servers::add(&data_dir, args),
            ServersCommand::List { json } => servers::list(&data_dir, json),
            ServersCommand::Remove { name } => servers::remove(&data_dir, &name),
            ServersCommand::Restart { name } => servers::restart(&data_dir, &name),
            ServersCommand::Login(args) => signin::login(&data_dir, args),
            ServersCommand::Logout { name } => signin::logout(&data_dir, &name),
            ServersCommand::Import(args) => import::import(&data_dir, args),
            ServersCommand::Set(args) => servers::set(&data_dir, args),
            ServersCommand::Contract(args) => servers::contract(&data_dir, args),
            ServersCommand::Tools { name, tools, json } => servers::tools(&data_dir, &name, tools.as_deref(), json),
        },
        Command::Ssh { command: SshCommand::Gc { host, older_than_days } } => {
            vault::ssh_gc(&data_dir, &host, older_than_days)
        }
        Command::Vault { command } => match command {
            VaultCommand::Add(args) => vault::add(&data_dir, args),
            VaultCommand::AddSsh(args) => vault::add_ssh(&data_dir, args),
            VaultCommand::List { json } => vault::list(&data_dir, json),
            VaultCommand::Remove { name } => vault::remove(&data_dir, &name),
            VaultCommand::Lock => vault::set_locked(&data_dir, true),
            VaultCommand::Unlock => vault::set_locked(&data_dir, false),
        },
        Command::Activity { execution, session, limit, json } => {
            journal::activity(&data_dir, execution, session, limit, json)
        }
        Command::Sessions { command: None, json } => journal::sessions(&data_dir, json),
        Command::Sessions { command: Some(SessionsCommand::Revoke { id }), .. } => journal::revoke(&data_dir, id),
        Command::Execution { command: ExecutionCommand::Show { id, json } } => journal::show(&data_dir, id, json),
    }
}

/// `postern doctor`: every check, its verdict, what it found and the fix; exit 1 if one failed.
fn doctor(data_dir: &std::path::Path, port: u16, json: bool) -> Result<ExitCode, Failure> {
    use postern_host::doctor::Verdict;
    let checks = postern_host::doctor::run(data_dir, port);
    let failed = checks.iter().any(|c| c.verdict == Verdict::Fail);
    if json {
        let out = serde_json::json!({ "ok": !failed, "checks": checks });
        render::print_json(&out)?;
    } else {
        for c in &checks {
            let mark = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            println!("{mark}  {:<17} {}", c.name, postern_core::Outside::line(&c.found));
            if !c.fix.is_empty() {
                println!("      {:<17} fix: {}", "", postern_core::Outside::line(&c.fix));
            }
        }
        println!();
        println!(
            "{}",
            if failed { "Postern cannot work here until the FAIL lines are fixed." } else { "Postern can work here." }
        );
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The tools every gateway offers without a manifest: name, method, URL, credential, contract.
const BUILT_INS: [[&str; 5]; 2] = [
    [
        "http_request",
        "any",
        "any allowed target",
        "the one bound to its host",
        "read_only for GET/HEAD; else idempotency_key if the credential names an idempotency header, else irreversible",
    ],
    ["ssh_exec", "ssh", "a vault SSH host", "the host's key", "ssh_marker"],
];

/// `tools check` and `tools list`: the manifest found the way `serve`, `call` and the app find
/// it (a file named explicitly must exist; no default file means the built-in tools only).
fn tools_check(file: Option<&std::path::Path>, json: bool) -> Result<ExitCode, Failure> {
    let loaded = postern_host::load_manifest(file)?;
    if !loaded.problems.is_empty() {
        for e in &loaded.problems {
            eprintln!("{}", postern_core::Outside::line(&e.to_string()));
        }
        return Err(Failure {
            code: 2,
            error: anyhow::anyhow!("{} problem(s) in {}", loaded.problems.len(), loaded.path.display()),
        });
    }
    let mut rows: Vec<[String; 5]> = BUILT_INS
        .iter()
        .filter(|[name, ..]| loaded.manifest.tool(name).is_none())
        .map(|row| row.map(str::to_owned))
        .collect();
    rows.extend(loaded.manifest.tools().map(|tool| {
        [
            tool.name.clone(),
            tool.method.clone(),
            tool.url_template.clone(),
            tool.credential.clone().unwrap_or_default(),
            if tool.read_only_by_verb {
                format!("read_only (by its {} verb)", tool.method)
            } else {
                tool.contract.class.as_str().to_owned()
            },
        ]
    }));
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|[name, method, url, credential, contract]| {
                serde_json::json!({ "name": name, "method": method, "url": url, "credential": credential,
                                    "contract": contract })
            })
            .collect();
        render::print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = render::table(&["tool", "method", "url", "credential", "replay contract"]);
    for row in rows {
        t.add_row(row.to_vec());
    }
    println!("{}", t.trim_fmt());
    if !loaded.path.exists() {
        eprintln!("no {} yet: the built-in tools only", loaded.path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // Fault-test builds only: arms the crash points named in FAILPOINTS.
    #[cfg(feature = "failpoints")]
    let _crash_points = fail::FailScenario::setup();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(Failure { code, error }) => {
            // An error may quote outside text (a gateway's refusal, a server's message, a file).
            eprintln!("postern: error: {}", postern_core::Outside::block(&format!("{error:#}")));
            ExitCode::from(code)
        }
    }
}
