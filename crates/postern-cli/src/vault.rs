//! `postern vault …`: credentials and the lock, on the OS keychain. Secrets are read from a
//! hidden prompt or standard input, never from the command line (argv is visible to every
//! process on the machine and lands in shell history).

use crate::{Failure, audit::now, location, render};
use anyhow::{Context, anyhow};
use postern_store::Store;
use postern_vault::{Binding, Credential, CredentialKind, OsKeychain, Sensitive, Vault};
use std::{io::Read, path::Path, process::ExitCode, sync::Arc};

/// Opens the journal (creating it if needed) and the vault on the OS keychain.
pub fn open(data_dir: &Path) -> Result<Vault, Failure> {
    let (store, _) = Store::open(&location::database(data_dir), now())?;
    let keychain = OsKeychain::connect()?;
    Ok(Vault::open(Arc::new(store), Arc::new(keychain), now())?)
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
    };
    credential.validate()?;
    let vault = open(data_dir)?;
    let secret = read_secret()?;
    vault.add_credential(&credential, &secret, now())?;
    eprintln!("stored credential {:?} in the OS keychain", credential.name);
    Ok(ExitCode::SUCCESS)
}

pub fn list(data_dir: &Path, json: bool) -> Result<ExitCode, Failure> {
    let vault = open(data_dir)?;
    let credentials = vault.credentials()?;
    let locked = vault.is_locked()?;
    if json {
        let out = serde_json::json!({ "locked": locked, "credentials": credentials });
        println!("{}", serde_json::to_string_pretty(&out).context("encode")?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("vault {}", if locked { "LOCKED (every action is denied)" } else { "unlocked" });
    if credentials.is_empty() {
        println!("no credentials yet (postern vault add NAME --kind bearer --host HOST)");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = render::table(&["name", "kind", "sent to", "approve every use"]);
    for c in &credentials {
        let kind = match &c.kind {
            CredentialKind::Bearer => "bearer".to_string(),
            CredentialKind::Basic { username } => format!("basic ({username})"),
            CredentialKind::Header { name } => format!("header {name}"),
        };
        let hosts: Vec<String> =
            c.bindings.iter().map(|b| format!("{}{}", b.host, b.path_prefix.as_deref().unwrap_or(""))).collect();
        t.add_row(vec![c.name.clone(), kind, hosts.join(", "), if c.approve_every_use { "yes" } else { "no" }.into()]);
    }
    println!("{}", t.trim_fmt());
    Ok(ExitCode::SUCCESS)
}

pub fn remove(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    open(data_dir)?.remove_credential(name, now())?;
    eprintln!("removed credential {name:?} and its keychain item");
    Ok(ExitCode::SUCCESS)
}

pub fn set_locked(data_dir: &Path, locked: bool) -> Result<ExitCode, Failure> {
    // A running gateway holds the journal: ask it to lock. Unlocking is not offered over its
    // socket (any process of this user, an agent included, can reach it): the gateway refuses,
    // journals the attempt, and says where to unlock instead.
    if let Err(e) = Store::open(&location::database(data_dir), now())
        && crate::serve::held_by_gateway(&e)
    {
        if locked {
            crate::serve::via_gateway(
                data_dir,
                postern_gateway::control::ControlRequest::LockVault { by: "cli".into() },
            )?;
            eprintln!("vault locked: every action is denied until it is unlocked in the approver");
            return Ok(ExitCode::SUCCESS);
        }
        crate::serve::refused_by_gateway(data_dir, "vault.unlock")?;
    }
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
