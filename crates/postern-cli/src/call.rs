//! `postern call TOOL --args JSON`: run one tool through the engine without an agent — the same
//! path an MCP call takes (journal, retry matching, vault, HTTP channel).

use crate::{Failure, render};
use anyhow::{Context, anyhow};
use postern_core::{Actor, IntentScope, SessionId};
use postern_gateway::{Call, LockOnlyApprover};
use postern_host::{Host, HostConfig, now};
use std::{path::Path, process::ExitCode, sync::Arc};

#[derive(clap::Args, Debug)]
pub struct CallArgs {
    /// The tool to run (see `postern tools check`).
    tool: String,
    /// The tool's arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// Name an intent scope: running the same call again with the same --scope is a retry of
    /// one intent (it attaches to the first execution). Default: a fresh scope per invocation.
    #[arg(long)]
    scope: Option<String>,
    /// Tool manifest (default: tools.toml in the config directory, or POSTERN_TOOLS).
    #[arg(long, env = "POSTERN_TOOLS", value_name = "FILE")]
    tools: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

fn actor() -> Actor {
    #[cfg(unix)]
    {
        let uid = postern_gateway::identity::current_uid().unwrap_or(u32::MAX);
        Actor::from_recorded(format!("cli:uid={uid}"))
    }
    #[cfg(not(unix))]
    {
        Actor::from_recorded("cli")
    }
}

pub fn run(data_dir: &Path, args: CallArgs) -> Result<ExitCode, Failure> {
    // The same lookup as `serve`: without a manifest, the built-in tools.
    let manifest = crate::serve::manifest(args.tools.as_deref())?;
    let arguments: serde_json::Value =
        serde_json::from_str(&args.args).map_err(|e| Failure { code: 2, error: anyhow!("--args is not JSON: {e}") })?;
    let engine = Host::open(HostConfig::new(data_dir.to_owned()))?.engine(manifest, Arc::new(LockOnlyApprover))?;
    let mut random = [0u8; 16];
    getrandom_fill(&mut random)?;
    let session = SessionId::from_parts(now(), u128::from_le_bytes(random));
    let scope = args.scope.as_deref().map_or_else(|| IntentScope::agent_run(session), IntentScope::named);
    let call = Call {
        tool: args.tool,
        arguments,
        actor: actor(),
        intent_scope: scope,
        session: None,
        correlation: serde_json::json!({ "transport": "cli" }),
        cancel: Default::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the runtime")?;
    let outcome = runtime.block_on(engine.call(call)).map_err(|e| {
        let code = if matches!(postern_core::ErrorCode::code(&e), "unknown_tool" | "invalid_arguments" | "invalid_url")
        {
            2
        } else {
            1
        };
        Failure { code, error: e.into() }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome).context("encode")?);
    } else {
        println!("execution  {}", outcome.execution_id);
        println!(
            "state      {}{}",
            outcome.state,
            if outcome.attached { format!(" ({})", outcome.decision) } else { String::new() }
        );
        if let Some(ssh) = &outcome.ssh {
            match (&ssh.exit_status, &ssh.exit_signal) {
                (Some(code), _) => println!("exit       {code}"),
                (None, Some(sig)) => println!("signal     {sig}"),
                (None, None) => println!("exit       unknown"),
            }
            if let Some(t) = &ssh.timed_out {
                println!("timeout    {t}");
            }
            if ssh.truncated {
                println!("output     truncated at the cap");
            }
            println!();
            print!("{}", ssh.stdout);
            eprint!("{}", ssh.stderr);
        } else if let Some(result) = &outcome.result {
            println!("status     {}{}", result.status, if result.truncated { " (body truncated)" } else { "" });
            if result.secret_echoed {
                println!("warning    the target echoed the credential back; it was redacted from the result");
            }
            println!();
            println!("{}", result.body);
        } else if !outcome.detail.is_null() && outcome.detail != serde_json::json!({}) {
            println!("detail     {}", render::brief(&outcome.detail, 200));
        }
    }
    // Delivery is not marked: stdout does not prove the calling script received the result, so
    // the execution stays `completed` and the same call with the same --scope returns it again.
    Ok(if outcome.result.is_some() || outcome.ssh.as_ref().is_some_and(|s| s.exit_status == Some(0)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), Failure> {
    getrandom::fill(buf).map_err(|e| Failure { code: 1, error: anyhow!("no randomness from the OS: {e}") })
}
