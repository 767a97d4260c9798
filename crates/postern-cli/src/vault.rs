//! `postern vault …`: credentials and the lock, on the OS keychain. Secrets are read from a
//! hidden prompt or standard input, never from the command line (argv is visible to every
//! process on the machine and lands in shell history).

use crate::{Failure, render};
use anyhow::{Context, anyhow};
use postern_gateway::door::control::{ControlRequest, SecretText};
use postern_host::now;
use postern_vault::{Binding, Credential, CredentialKind, HostKeyPolicy, Sensitive, SshHost, Vault};
use std::{io::Read, path::Path, process::ExitCode, sync::Arc};

/// Opens the journal (creating it if needed) and the vault on the OS keychain.
pub fn open(data_dir: &Path) -> Result<Arc<Vault>, Failure> {
    Ok(postern_host::Host::open(postern_host::HostConfig::new(data_dir.to_owned()))?.vault)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Kind {
    Bearer,
    Basic,
    Header,
}

#[derive(clap::Args, Debug)]
pub struct Add {
    /// Name agents and tools refer to the credential by.
    name: String,
    #[arg(long, value_enum)]
    kind: Kind,
    /// Host (optionally host:port) the credential may be sent to; repeat for several.
    #[arg(long = "host", required = true, value_name = "HOST")]
    hosts: Vec<String>,
    /// Only requests under this path (at a '/' boundary) get the credential.
    #[arg(long, value_name = "PATH")]
    path_prefix: Option<String>,
    /// Username for --kind basic.
    #[arg(long)]
    username: Option<String>,
    /// Header name for --kind header (e.g. X-Api-Key).
    #[arg(long)]
    header_name: Option<String>,
    /// Ask a reviewer before every use.
    #[arg(long)]
    approve_every_use: bool,
    /// The API honours this idempotency header (lets `http_request` writes be recovered).
    #[arg(long, value_name = "HEADER")]
    idempotency_header: Option<String>,
    /// A GET or HEAD through this credential changes something (a metered call, a one-time
    /// link, an export job): treat those verbs like writes. By default the verb is trusted.
    #[arg(long)]
    reads_have_effects: bool,
}

fn read_secret() -> Result<Sensitive<String>, Failure> {
    use std::io::IsTerminal;
    let secret = if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password("secret (not echoed): ").context("read secret")?;
        let second = rpassword::prompt_password("again: ").context("read secret")?;
        if first != second {
            return Err(Failure { code: 2, error: anyhow!("the two entries differ; nothing was stored") });
        }
        first
    } else {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("read secret from standard input")?;
        // One trailing newline is how `echo`/heredocs end input, never part of a token.
        text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_owned()
    };
    Ok(Sensitive::new(secret))
}

pub fn add(data_dir: &Path, args: Add) -> Result<ExitCode, Failure> {
    let kind = match args.kind {
        Kind::Bearer => CredentialKind::Bearer,
        Kind::Basic => CredentialKind::Basic {
            username: args
                .username
                .ok_or_else(|| Failure { code: 2, error: anyhow!("--kind basic needs --username") })?,
        },
        Kind::Header => CredentialKind::Header {
            name: args
                .header_name
                .ok_or_else(|| Failure { code: 2, error: anyhow!("--kind header needs --header-name") })?,
        },
    };
    let bindings =
        args.hosts.iter().map(|h| Binding::new(h, args.path_prefix.as_deref())).collect::<Result<Vec<_>, _>>()?;
    let credential = Credential {
        name: args.name,
        kind,
        bindings,
        approve_every_use: args.approve_every_use,
        idempotency_header: args.idempotency_header,
        reads_have_effects: args.reads_have_effects,
    };
    credential.validate()?;
    let secret = read_secret()?;
    let name = credential.name.clone();
    let bindings = credential.bindings.clone();
    crate::route::perform(data_dir, ControlRequest::AddCredential { credential, secret: SecretText(secret) })?;
    eprintln!("stored credential {name:?} in the OS keychain");
    for b in bindings.iter().filter(|b| b.loopback_without_port()) {
        eprintln!(
            "warning: {} is a loopback address bound without a port: any program on this machine that listens \
             on another port of it is sent this credential; bind HOST:PORT (e.g. 127.0.0.1:8080) instead",
            b.host
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Policy {
    /// The host's key must be given now (--host-key or --host-key-file).
    Strict,
    /// The first key the host presents is pinned once authentication with it succeeded.
    AcceptNew,
}

#[derive(clap::Args, Debug)]
pub struct AddSsh {
    /// Name tools and agents refer to the host by.
    name: String,
    /// Host name or IP address.
    #[arg(long)]
    address: String,
    #[arg(long, default_value_t = 22)]
    port: u16,
    /// Account to log in as.
    #[arg(long = "user", value_name = "ACCOUNT")]
    account: String,
    /// Private key file (OpenSSH or PEM; Ed25519, ECDSA or RSA). Its contents go to the OS
    /// keychain; delete the file afterwards if Postern should be its only holder.
    #[arg(long, value_name = "FILE")]
    key_file: std::path::PathBuf,
    #[arg(long, value_enum, default_value_t = Policy::Strict)]
    host_key_policy: Policy,
    /// The host's public key line (`ssh-ed25519 AAAA…`), e.g. from `ssh-keyscan` run where you
    /// trust the network, or the host's /etc/ssh/ssh_host_ed25519_key.pub.
    #[arg(long, value_name = "KEY", conflicts_with = "host_key_file")]
    host_key: Option<String>,
    /// A file holding the host's public key line.
    #[arg(long, value_name = "FILE")]
    host_key_file: Option<std::path::PathBuf>,
    /// Where the marker protocol keeps execution records on the host.
    #[arg(long, value_name = "DIR", default_value = postern_vault::DEFAULT_MARKER_ROOT)]
    marker_dir: String,
    /// Ask a reviewer before every command on this host.
    #[arg(long)]
    approve_every_use: bool,
    /// The key is passphrase-protected: read the passphrase (hidden prompt, or the first line of
    /// standard input).
    #[arg(long)]
    passphrase: bool,
}

pub fn add_ssh(data_dir: &Path, args: AddSsh) -> Result<ExitCode, Failure> {
    let usage = |m: String| Failure { code: 2, error: anyhow!(m) };
    let key = std::fs::read_to_string(&args.key_file)
        .map_err(|e| usage(format!("cannot read the key file {}: {e}", args.key_file.display())))?;
    let key = Sensitive::new(key);
    let passphrase = if args.passphrase { Some(read_secret()?) } else { None };
    // Refuse a key that cannot be used, or a wrong passphrase, now rather than at the first call.
    postern_engine::channel::ssh::decode_key(key.expose(), passphrase.as_ref().map(|p| p.expose().as_str()))
        .map_err(|e| usage(format!("the key in {} cannot be used: {e}", args.key_file.display())))?;
    let line = match (&args.host_key, &args.host_key_file) {
        (Some(line), _) => Some(line.clone()),
        (None, Some(file)) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| usage(format!("cannot read the host key file {}: {e}", file.display())))?,
        ),
        (None, None) => None,
    };
    let pinned = line.as_deref().map(postern_engine::channel::ssh::host_key).transpose()?;
    let host = SshHost {
        name: args.name,
        address: args.address,
        port: args.port,
        account: args.account,
        policy: match args.host_key_policy {
            Policy::Strict => HostKeyPolicy::Strict,
            Policy::AcceptNew => HostKeyPolicy::AcceptNew,
        },
        host_key: pinned.as_ref().and_then(|(k, _)| k.to_openssh().ok()),
        host_key_fingerprint: pinned.as_ref().map(|(_, f)| f.clone()),
        marker_root: args.marker_dir,
        approve_every_use: args.approve_every_use,
    };
    host.validate()?;
    let (name, fingerprint) = (host.name.clone(), host.host_key_fingerprint.clone());
    crate::route::perform(
        data_dir,
        ControlRequest::AddSshHost { host, key: SecretText(key), passphrase: passphrase.map(SecretText) },
    )?;
    match fingerprint {
        Some(f) => eprintln!("stored SSH host {name:?}; its host key is pinned: {f}"),
        None => eprintln!(
            "stored SSH host {name:?}; its host key will be pinned at the first successful login (accept-new)"
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The replay contracts `http_request` derives for calls through `c`, in words.
fn http_request_contract(c: &Credential) -> String {
    let writes = match &c.idempotency_header {
        Some(h) => format!("idempotency_key ({h})"),
        None => "irreversible".into(),
    };
    if c.reads_have_effects {
        format!("every verb {writes} (reads have effects)")
    } else {
        format!("GET/HEAD read_only (by verb), writes {writes}")
    }
}

/// Reads the journal (read-only, so it works beside a running gateway): names, kinds and
/// bindings, never a secret.
pub fn list(data_dir: &Path, json: bool) -> Result<ExitCode, Failure> {
    let view = crate::journal::view(data_dir)?;
    let records = view.credentials()?;
    let credentials = records
        .iter()
        .filter(|r| r.kind != postern_vault::SSH_HOST_KIND && r.kind != postern_vault::MCP_SERVER_KIND)
        .map(Credential::from_record)
        .collect::<Result<Vec<_>, _>>()?;
    let hosts = records
        .iter()
        .filter(|r| r.kind == postern_vault::SSH_HOST_KIND)
        .map(SshHost::from_record)
        .collect::<Result<Vec<_>, _>>()?;
    let locked = view.locked()?;
    if json {
        let out = serde_json::json!({ "locked": locked, "credentials": credentials, "ssh_hosts": hosts });
        crate::render::print_json(&out).context("encode")?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("vault {}", if locked { "LOCKED (every action is denied)" } else { "unlocked" });
    if !hosts.is_empty() {
        let mut t = render::table(&["ssh host", "login", "host key", "policy", "approve every use"]);
        for h in &hosts {
            t.add_row(vec![
                h.name.clone(),
                format!("{}@{}:{}", h.account, h.address, h.port),
                h.host_key_fingerprint.clone().unwrap_or_else(|| "(not pinned yet)".into()),
                h.policy.as_str().into(),
                if h.approve_every_use { "yes" } else { "no" }.into(),
            ]);
        }
        println!("{}", t.trim_fmt());
    }
    if credentials.is_empty() {
        println!("no credentials yet (postern vault add NAME --kind bearer --host HOST)");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = render::table(&["name", "kind", "sent to", "approve every use", "http_request contract"]);
    for c in &credentials {
        let kind = match &c.kind {
            CredentialKind::Bearer => "bearer".to_string(),
            CredentialKind::Basic { username } => format!("basic ({username})"),
            CredentialKind::Header { name } => format!("header {name}"),
        };
        let hosts: Vec<String> =
            c.bindings.iter().map(|b| format!("{}{}", b.host, b.path_prefix.as_deref().unwrap_or(""))).collect();
        t.add_row(vec![
            c.name.clone(),
            kind,
            hosts.join(", "),
            if c.approve_every_use { "yes" } else { "no" }.into(),
            http_request_contract(c),
        ]);
    }
    println!("{}", t.trim_fmt());
    Ok(ExitCode::SUCCESS)
}

/// Removes a credential, an SSH host or an MCP server, and its keychain items.
pub fn remove(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    crate::route::perform(data_dir, ControlRequest::Remove { name: name.to_owned() })?;
    eprintln!("removed {name:?} and its secrets from the OS keychain");
    Ok(ExitCode::SUCCESS)
}

/// `postern ssh gc`: removes marker directories older than `days` on one host (at least 1 day)
/// whose executions are settled; the marker of an unsettled one is kept whatever its age.
pub fn ssh_gc(data_dir: &Path, name: &str, days: u32) -> Result<ExitCode, Failure> {
    let answer =
        crate::route::perform(data_dir, ControlRequest::SshGc { host: name.to_owned(), older_than_days: days.max(1) })?;
    let removed = answer["removed"].as_u64().unwrap_or_default();
    eprintln!(
        "removed {removed} marker director{} older than {} days on {name}",
        if removed == 1 { "y" } else { "ies" },
        days.max(1)
    );
    let (unsettled, unknown) =
        (answer["kept_unsettled"].as_u64().unwrap_or_default(), answer["kept_unknown"].as_u64().unwrap_or_default());
    if unsettled + unknown > 0 {
        eprintln!(
            "kept {unsettled} of an execution not settled yet (its marker is how Postern checks it without running it \
             again) and {unknown} of an execution this journal does not know"
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn set_locked(data_dir: &Path, locked: bool) -> Result<ExitCode, Failure> {
    use postern_host::operations::Route;
    match Route::of(data_dir, now())? {
        // A running gateway holds the journal: ask it to lock. Unlocking is not offered over
        // its socket (any process of this user, an agent included, can reach it): the gateway
        // refuses, journals the attempt, and says where to unlock instead.
        Route::Gateway(_) if !locked => {
            crate::route::refused_by_gateway(data_dir, "vault.unlock")?;
            Ok(ExitCode::SUCCESS)
        }
        route @ Route::Gateway(_) => {
            route_lock(&route)?;
            eprintln!("vault locked: every action is denied until it is unlocked in the approver");
            Ok(ExitCode::SUCCESS)
        }
        Route::Local(store) => {
            // Unlocking grants every call its credentials back: never from inside an agent run
            // (which could otherwise unlock a vault its owner locked while no gateway runs).
            let from = postern_host::operations::this_process(&store);
            if let (false, Some(run)) = (locked, &from.agent_run) {
                let detail = serde_json::json!({ "interface": "cli", "attempted": "vault.unlock",
                                                 "peer": from.detail(), "decided": "refused_from_agent_run" });
                let _ = store.refusal(detail, now());
                return Err(Failure {
                    code: 1,
                    error: anyhow!(
                        "refused: this command runs inside agent run {run}; an agent cannot unlock the vault. \
                         Unlock it from your own terminal (this attempt was journaled)"
                    ),
                });
            }
            drop(store);
            let vault = open(data_dir)?;
            if locked {
                vault.lock("cli", now())?;
                eprintln!("vault locked: every action is denied until `postern vault unlock`");
            } else {
                vault.unlock("cli", now())?;
                eprintln!("vault unlocked");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn route_lock(route: &postern_host::operations::Route) -> Result<(), Failure> {
    use postern_gateway::door::control::ControlReply;
    match route.perform(ControlRequest::LockVault { by: "cli".into() }, now()) {
        ControlReply::Refused { message, .. } => Err(Failure { code: 1, error: anyhow!("{message}") }),
        _ => Ok(()),
    }
}
