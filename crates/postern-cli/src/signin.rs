//! `postern servers login` and `logout`: a remote server's OAuth sign-in, run in this process
//! (the browser, the loopback redirect, the code exchange), its grant handed to whoever holds
//! the journal (the running gateway over its control socket, else this process) to keep in the
//! keychain and journal. No token is printed, logged or journaled.

use crate::Failure;
use anyhow::{Context, anyhow};
use postern_core::{ErrorCode, Outside};
use postern_engine::channel::oauth::{Grant, SignIn};
use postern_gateway::door::control::{ControlRequest, SecretText};
use postern_vault::McpServer;
use std::{path::Path, process::ExitCode, time::Duration};

#[derive(clap::Args, Debug)]
pub struct Login {
    name: String,
    /// Only print the sign-in URL (a headless machine, an SSH session): open it anywhere that
    /// can reach this machine's 127.0.0.1.
    #[arg(long)]
    no_browser: bool,
    /// How long to wait for the browser's redirect, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    wait: u64,
}

/// The server `name` as recorded (read-only: a running gateway may hold the journal).
fn server(data_dir: &Path, name: &str) -> Result<McpServer, Failure> {
    let record = crate::journal::view(data_dir)?
        .credentials()?
        .into_iter()
        .find(|r| r.kind == postern_vault::MCP_SERVER_KIND && r.name == name)
        .ok_or_else(|| Failure {
            code: 2,
            error: anyhow!("no MCP server named {:?} (see `postern servers list`)", Outside::line(name)),
        })?;
    let server = McpServer::from_record(&record)?;
    if server.oauth.is_none() {
        return Err(Failure {
            code: 2,
            error: anyhow!(
                "MCP server {:?} does not sign in with OAuth (add it with `postern servers add NAME --url URL --oauth`)",
                Outside::line(name)
            ),
        });
    }
    Ok(server)
}

/// When a grant's access token expires, in words.
fn expiry(grant: &Grant) -> String {
    match grant.expires_at() {
        Some(at) => {
            let at = std::time::UNIX_EPOCH + Duration::from_secs(at);
            format!("its access token expires {} (Postern refreshes it)", humantime::format_rfc3339_seconds(at))
        }
        None => "the server gave no expiry".into(),
    }
}

pub fn login(data_dir: &Path, args: Login) -> Result<ExitCode, Failure> {
    let server = server(data_dir, &args.name)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the runtime")?;
    let refused = std::sync::Mutex::new(Vec::new());
    let signed = runtime.block_on(async {
        let signin = SignIn::begin(&server).await?;
        eprintln!(
            "sign in to {:?} in a browser; waiting up to {} s for its redirect to this machine:",
            server.name, args.wait
        );
        // The URL alone on stdout, so a script (or a person on another machine) can take it.
        println!("{}", signin.url());
        if !args.no_browser && !signin.open_browser() {
            eprintln!("(no browser could be opened: open the URL above yourself)");
        }
        let clock = postern_engine::engine::system_clock();
        signin
            .finish(Duration::from_secs(args.wait), &clock, |r| {
                eprintln!("refused a request to the sign-in's listener: {}", r.why);
                refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r.why);
            })
            .await
    });
    for why in refused.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        let request = ControlRequest::RedirectRefused { name: server.name.clone(), why: why.to_owned() };
        if let Err(e) = crate::route::perform(data_dir, request) {
            eprintln!("the refused request could not be journaled: {}", e.error);
        }
    }
    let grant = signed
        .map_err(|e| Failure { code: 1, error: anyhow!("not signed in to {:?}: {e} ({})", server.name, e.code()) })?;
    let said = format!(
        "signed in to {:?}: issuer {}, scopes [{}], {}",
        server.name,
        grant.issuer().unwrap_or("(not named)"),
        grant.credentials.granted_scopes.join(" "),
        expiry(&grant)
    );
    crate::route::perform(
        data_dir,
        ControlRequest::KeepSignIn { name: server.name.clone(), grant: SecretText(grant.to_kept()) },
    )?;
    eprintln!("{}", Outside::line(&said));
    Ok(ExitCode::SUCCESS)
}

pub fn logout(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    let server = server(data_dir, name)?;
    let answer = crate::route::perform(data_dir, ControlRequest::SignOut { name: server.name.clone() })?;
    let how = match (answer["was_signed_in"].as_bool(), answer["revoked_at_server"].as_bool()) {
        (Some(false), _) => "it was not signed in".to_owned(),
        (_, Some(true)) => "its tokens were revoked at the authorization server and forgotten".to_owned(),
        (_, Some(false)) => "its tokens were forgotten (the authorization server offers no revocation)".to_owned(),
        _ => format!(
            "its tokens were forgotten, but revoking them at the authorization server failed: {}",
            answer["revocation_error"].as_str().unwrap_or("no answer")
        ),
    };
    eprintln!("signed out of {:?}: {}", server.name, Outside::line(&how));
    Ok(ExitCode::SUCCESS)
}
