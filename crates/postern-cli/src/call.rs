//! `postern call TOOL --args JSON`: run one tool through the engine without an agent — the same
//! path an MCP call takes (journal, retry matching, vault, HTTP channel).

use crate::{Failure, render};
use anyhow::{Context, anyhow};
use postern_core::{Actor, IntentScope, Outside, SessionId};
use postern_engine::{Call, LockOnlyApprover};
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
        let uid = postern_gateway::caller::identity::current_uid().unwrap_or(u32::MAX);
        Actor::from_recorded(format!("cli:uid={uid}"))
    }
    #[cfg(not(unix))]
    {
        Actor::from_recorded("cli")
    }
}

pub fn run(data_dir: &Path, args: CallArgs) -> Result<ExitCode, Failure> {
    let arguments: serde_json::Value =
        serde_json::from_str(&args.args).map_err(|e| Failure { code: 2, error: anyhow!("--args is not JSON: {e}") })?;
    let outcome = match Host::open(HostConfig::new(data_dir.to_owned())) {
        Ok(host) => local(host, &args, arguments)?,
        Err(postern_host::HostError::InUse { .. }) => through_gateway(data_dir, &args, arguments)?,
        Err(e) => return Err(e.into()),
    };
    print(&outcome, args.json)?;
    // Delivery is not marked: stdout does not prove the calling script received the result, so
    // the execution stays `completed` and the same call with the same --scope returns it again.
    let result = &outcome["result"];
    let ok = result.get("status").is_some()
        || result.get("exit_status") == Some(&serde_json::json!(0))
        || (result.get("upstream_result").is_some() && result["is_error"] != true);
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// No gateway runs: this process opens the journal and runs the engine, asking no one (a call
/// that needs a reviewer is denied).
fn local(host: Host, args: &CallArgs, arguments: serde_json::Value) -> Result<serde_json::Value, Failure> {
    // The same lookup as `serve`: without a manifest, the built-in tools.
    let manifest = crate::serve::manifest(args.tools.as_deref())?;
    let engine = host.engine(manifest, Arc::new(LockOnlyApprover))?;
    let mut random = [0u8; 16];
    getrandom_fill(&mut random)?;
    let session = SessionId::from_parts(now(), u128::from_le_bytes(random));
    let scope = args.scope.as_deref().map_or_else(|| IntentScope::agent_run(session), IntentScope::named);
    let call = Call {
        tool: args.tool.clone(),
        arguments,
        actor: actor(),
        intent_scope: scope,
        session: None,
        correlation: serde_json::json!({ "transport": "cli" }),
        cancel: Default::default(),
        bound: Default::default(),
        resolved: None,
        opening: Default::default(),
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
    Ok(postern_gateway::door::mcp::outcome_result(&outcome).structured_content.unwrap_or_default())
}

/// A gateway holds the journal: the call goes through its MCP socket as the client
/// `postern-call`, identified by the gateway like any bridge — the call belongs to the agent run
/// of the process above it (the terminal, or the agent that ran the command), so a repeat from
/// there is a retry — and its approver is asked as for any agent.
fn through_gateway(
    data_dir: &Path,
    args: &CallArgs,
    arguments: serde_json::Value,
) -> Result<serde_json::Value, Failure> {
    if args.scope.is_some() {
        return Err(Failure {
            code: 2,
            error: anyhow!(
                "--scope names an intent scope of its own, which only a call run without a gateway can have; \
                 through the running gateway a call belongs to the agent run of the process that ran `postern call` \
                 (your terminal, or the agent), so repeating it there is recognised as a retry (drop --scope, or \
                 stop the gateway)"
            ),
        });
    }
    if args.tools.is_some() {
        eprintln!("note: a gateway is running; its tool manifest applies (--tools is not used)");
    }
    let serde_json::Value::Object(arguments) = arguments else {
        return Err(Failure { code: 2, error: anyhow!("--args must be a JSON object") });
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the runtime")?;
    let answer = runtime
        .block_on(postern_gateway::door::socket::call_through(data_dir, "postern-call", &args.tool, arguments))
        .map_err(|message| Failure { code: 2, error: anyhow!("{message}") })?;
    if answer.structured.is_null() {
        return Err(Failure { code: 1, error: anyhow!("{}", answer.text) });
    }
    Ok(answer.structured)
}

/// The outcome as agents get it in `structuredContent`, for people or as JSON: the same whether
/// this process ran the call or the gateway did.
fn print(outcome: &serde_json::Value, json: bool) -> Result<(), Failure> {
    if json {
        crate::render::print_json(outcome).context("encode")?;
        return Ok(());
    }
    // What a target or a host sent back is outside text: one-line values are escaped whole, a
    // body or an output keeps its lines.
    let text =
        |v: &serde_json::Value| Outside::line(&v.as_str().map_or_else(|| v.to_string(), str::to_owned)).to_string();
    let block = |v: &serde_json::Value| Outside::block(v.as_str().unwrap_or_default()).to_string();
    println!("execution  {}", text(&outcome["execution_id"]));
    println!(
        "state      {}{}",
        text(&outcome["state"]),
        if outcome["attached"] == true { format!(" ({})", text(&outcome["decision"])) } else { String::new() }
    );
    let result = &outcome["result"];
    if result.get("stdout").is_some() {
        match (&result["exit_status"], &result["exit_signal"]) {
            (code, _) if !code.is_null() => println!("exit       {code}"),
            (_, sig) if !sig.is_null() => println!("signal     {}", text(sig)),
            _ => println!("exit       unknown"),
        }
        if !result["timed_out"].is_null() {
            println!("timeout    {}", text(&result["timed_out"]));
        }
        if !result["result_too_large"].is_null() {
            println!("output     larger than the result limit ({} bytes): not kept", result["result_too_large"]);
        }
        println!();
        print!("{}", block(&result["stdout"]));
        eprint!("{}", block(&result["stderr"]));
    } else if result.get("status").is_some() {
        println!(
            "status     {}{}",
            result["status"],
            if result["truncated"] == true { " (body truncated)" } else { "" }
        );
        if result["secret_echoed"] == true {
            println!("warning    the target sent a secret of the call back; it was redacted from the result");
        }
        if !result["result_too_large"].is_null() {
            println!("body       larger than the result limit ({} bytes): not kept", result["result_too_large"]);
        }
        println!();
        println!("{}", block(&result["body"]));
    } else if let Some(upstream) = result.get("upstream_result") {
        println!("server     {}", text(&result["server"]));
        println!();
        crate::render::print_json(upstream).context("encode")?;
    } else if !outcome["detail"].is_null() && outcome["detail"] != serde_json::json!({}) {
        println!("detail     {}", render::brief(&outcome["detail"], 200));
    } else if let Some(message) = outcome["message"].as_str() {
        println!("detail     {}", Outside::line(message));
    }
    Ok(())
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), Failure> {
    getrandom::fill(buf).map_err(|e| Failure { code: 1, error: anyhow!("no randomness from the OS: {e}") })
}
