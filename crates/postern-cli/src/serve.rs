//! `postern serve` (the gateway, headless) and `postern mcp` (the stdio bridge an agent
//! launches: `claude mcp add postern -- postern mcp`).

use crate::Failure;
use crate::terminal::TerminalApprover;
use anyhow::{Context, anyhow};
use postern_gateway::{LockOnlyApprover, Manifest, engine::system_clock, socket};
use postern_host::{Host, HostConfig};
use std::{path::Path, process::ExitCode, sync::Arc, time::Duration};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Streamable HTTP port on 127.0.0.1 (0 picks a free port).
    #[arg(long, env = "POSTERN_PORT", default_value_t = postern_gateway::streamable::DEFAULT_PORT)]
    port: u16,
    /// Serve only the local socket (`postern mcp`), no HTTP endpoint.
    #[arg(long)]
    no_http: bool,
    /// Tool manifest (default: tools.toml in the config directory, or POSTERN_TOOLS). Without
    /// one, the built-in `http_request` and `execution_status` tools are served.
    #[arg(long, env = "POSTERN_TOOLS", value_name = "FILE")]
    tools: Option<std::path::PathBuf>,
    /// Largest MCP message accepted, in bytes.
    #[arg(long, default_value_t = socket::DEFAULT_MAX_MESSAGE_BYTES)]
    max_message_bytes: usize,
    /// How long a shutdown waits for executions in flight, in seconds.
    #[arg(long, default_value_t = 35)]
    drain_seconds: u64,
    /// Who answers approval questions: `none` (headless: per-use approvals are denied, agent runs
    /// are authorized by policy, retries follow their replay contract) or `terminal` (this
    /// terminal asks you, and reviews uncertain retries).
    #[arg(long, value_enum, default_value_t = ApproverKind::None, env = "POSTERN_APPROVER")]
    approver: ApproverKind,
    /// Seconds a reviewer has to answer before the call is denied (`approval_timed_out`).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    approval_timeout: u64,
    /// Lock the vault after this many seconds without a call or an answer (0: never). Default:
    /// 900 with `--approver terminal` (which can unlock it again), never without an approver.
    #[arg(long, value_name = "SECONDS", env = "POSTERN_IDLE_LOCK")]
    idle_lock: Option<u64>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApproverKind {
    None,
    Terminal,
}

/// The tool manifest `serve` and `call` use: one with problems is refused, each problem printed
/// with its file and line (the desktop app serves the built-ins instead and shows them).
pub fn manifest(explicit: Option<&Path>) -> Result<Manifest, Failure> {
    let loaded = postern_host::load_manifest(explicit)?;
    if !loaded.problems.is_empty() {
        for e in &loaded.problems {
            eprintln!("{e}");
        }
        return Err(Failure {
            code: 2,
            error: anyhow!("the tool manifest {} has {} problem(s)", loaded.path.display(), loaded.problems.len()),
        });
    }
    Ok(loaded.manifest)
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub fn serve(data_dir: &Path, args: ServeArgs) -> Result<ExitCode, Failure> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POSTERN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=error")),
        )
        .init();
    let manifest = manifest(args.tools.as_deref())?;
    let mut config = HostConfig::new(data_dir.to_owned());
    config.tools = args.tools.clone();
    config.http_port = (!args.no_http).then_some(args.port);
    config.max_message_bytes = args.max_message_bytes;
    config.drain = Duration::from_secs(args.drain_seconds);
    config.approval_timeout = Duration::from_secs(args.approval_timeout);
    let idle_lock = args.idle_lock.unwrap_or(if args.approver == ApproverKind::Terminal { 900 } else { 0 });
    config.idle_lock = (idle_lock > 0).then(|| Duration::from_secs(idle_lock));
    let host = Host::open(config)?;
    let approver: Arc<dyn postern_gateway::Approver> = match args.approver {
        ApproverKind::None => Arc::new(LockOnlyApprover),
        ApproverKind::Terminal => {
            let terminal = TerminalApprover::open(Arc::clone(&host.vault), system_clock())?;
            terminal.spawn_console();
            terminal
        }
    };
    let engine = host.engine(manifest, approver)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the runtime")?;
    runtime.block_on(async {
        let serving = host.bind(Arc::clone(&engine)).await?;
        tracing::info!(
            socket = %serving.endpoints.socket.display(),
            http = %serving.endpoints.http.map(|a| format!("http://{a}/mcp")).unwrap_or_else(|| "off".into()),
            tools = engine.manifest().tools().count(),
            recovered = host.recovery.outcome_unknown.len(),
            runs_adopted = serving.adopted,
            runs_ended = serving.ended,
            approver = ?args.approver,
            idle_lock_s = idle_lock,
            "postern gateway ready"
        );
        serving.run(shutdown_signal()).await?;
        Ok::<(), Failure>(())
    })?;
    tracing::info!("goodbye");
    Ok(ExitCode::SUCCESS)
}

/// The stdio bridge: relays newline-delimited MCP messages between this process's stdin/stdout
/// and the gateway socket, line by line, flushing every line. Nothing else is ever written to
/// stdout.
///
/// Delivery is the agent's side receiving a result, not the gateway's write into this relay: the
/// bridge announces itself first (`notifications/postern/bridge`), and after each response has
/// been written *and flushed* to stdout it acknowledges it (`notifications/postern/delivered`
/// with the response's id). Until that acknowledgement the gateway records the result as not
/// delivered, so a bridge killed between the two leaves a retry answered from the record.
///
/// Plain threads and blocking I/O: there is nothing to schedule, and a relay must never hold a
/// message back.
pub fn bridge(data_dir: &Path) -> Result<ExitCode, Failure> {
    use std::io::{BufRead, BufReader, Write};
    let path = socket::socket_path(data_dir);
    let socket = std::os::unix::net::UnixStream::connect(&path).map_err(|e| Failure {
        code: 1,
        error: anyhow!(
            "no Postern gateway is running for {} ({}: {e}).\nStart one with `postern serve` (or open the Postern \
             app), then start this agent again.",
            data_dir.display(),
            path.display()
        ),
    })?;
    // One writer at a time into the socket, a whole line each: the agent's messages and the
    // acknowledgements interleave only at line boundaries.
    let to_gateway = Arc::new(std::sync::Mutex::new(socket.try_clone().context("clone the socket")?));
    let send_line = {
        let to_gateway = Arc::clone(&to_gateway);
        move |line: &[u8]| -> std::io::Result<()> {
            let mut socket = to_gateway.lock().map_err(|_| std::io::Error::other("poisoned"))?;
            socket.write_all(line)
        }
    };
    send_line(&socket::bridge_hello_line()).context("greet the gateway")?;
    let agent_to_gateway = send_line.clone();
    let shutdown = Arc::clone(&to_gateway);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut line = Vec::with_capacity(64 * 1024);
        loop {
            line.clear();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                // Only the bridge speaks for delivery: an agent's line using its methods is dropped.
                Ok(_) if socket::is_bridge_notification(&line) => {
                    eprintln!("postern mcp: dropped a message using the bridge's own delivery methods");
                }
                Ok(_) => {
                    if agent_to_gateway(&line).is_err() {
                        break;
                    }
                }
            }
        }
        // The agent closed its side: let the gateway finish answering, then it closes.
        if let Ok(socket) = shutdown.lock() {
            let _ = socket.shutdown(std::net::Shutdown::Write);
        }
    });
    let mut from_gateway = BufReader::with_capacity(64 * 1024, socket);
    let mut stdout = std::io::stdout().lock();
    let mut line = Vec::with_capacity(64 * 1024);
    loop {
        line.clear();
        match from_gateway.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                // An agent that stopped reading ends the session.
                if stdout.write_all(&line).and_then(|()| stdout.flush()).is_err() {
                    break;
                }
                // The line reached the agent's stdin pipe: now, and only now, it was delivered.
                if let Some(ack) = socket::delivered_ack_line(&line) {
                    let _ = send_line(&ack);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks the running gateway for `op`, which its control socket does not offer: the gateway
/// journals the attempt and answers where to do it instead, which becomes this command's error.
pub fn refused_by_gateway(data_dir: &Path, op: &str) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the runtime")?;
    let line = serde_json::to_vec(&serde_json::json!({ "op": op, "by": "cli" })).context("encode")?;
    let reply = runtime
        .block_on(postern_gateway::control::request_line(data_dir, line))
        .map_err(|e| anyhow!("the journal is held by a running gateway, and its control socket did not answer: {e}"))?;
    match reply {
        postern_gateway::control::ControlReply::Refused { message, .. } => {
            Err(Failure { code: 1, error: anyhow!("{message}") })
        }
        postern_gateway::control::ControlReply::Done => {
            Err(Failure { code: 1, error: anyhow!("the gateway carried out a request it should have refused") })
        }
    }
}

/// Performs a write operation on `data_dir`: on the journal itself, or — when a gateway holds
/// it — through that gateway's control socket (the route is chosen once, in `postern-host`).
pub fn perform(data_dir: &Path, request: postern_gateway::control::ControlRequest) -> Result<(), Failure> {
    use postern_gateway::control::{ControlCode, ControlReply};
    let now = postern_host::now();
    match postern_host::operations::Route::of(data_dir, now)?.perform(request, now) {
        ControlReply::Done => Ok(()),
        ControlReply::Refused { code, message } => {
            let code = match code {
                ControlCode::UnknownAgent | ControlCode::DuplicateAgent | ControlCode::InvalidRequest => 2,
                _ => 1,
            };
            Err(Failure { code, error: anyhow!("{message}") })
        }
    }
}
