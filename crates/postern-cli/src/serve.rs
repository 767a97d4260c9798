//! `postern serve`: the gateway, headless — `postern-host` with the approver this terminal
//! offers (none, or the terminal approver).

use crate::Failure;
use crate::terminal::TerminalApprover;
use anyhow::{Context, anyhow};
use postern_engine::{LockOnlyApprover, Manifest, engine::system_clock};
use postern_gateway::door::socket;
use postern_host::{Host, HostConfig};
use std::{path::Path, process::ExitCode, sync::Arc, time::Duration};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Streamable HTTP port on 127.0.0.1 (0 picks a free port).
    #[arg(long, env = "POSTERN_PORT", default_value_t = postern_gateway::door::streamable::DEFAULT_PORT)]
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
    /// The most bytes a result may hold, for every channel (HTTP, SSH, upstream MCP servers): a
    /// larger answer is not kept, and the agent is told `result_too_large` with the limit.
    #[arg(long, env = "POSTERN_MAX_RESULT_BYTES", default_value_t = postern_engine::channel::http::DEFAULT_MAX_RESULT_BYTES)]
    max_result_bytes: usize,
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
    /// How long the run of an agent whose process cannot be identified (an HTTP client behind a
    /// relay, in a container, another user's) lasts after its last request, in seconds: its
    /// repeats inside it are matched to the earlier execution. It survives a gateway restart.
    #[arg(long, value_name = "SECONDS", env = "POSTERN_RUN_IDLE", default_value_t = postern_gateway::caller::runs::DEFAULT_IDLE_LEASE.as_secs())]
    run_idle: u64,
    /// Export the journal to OpenTelemetry (OTLP over HTTP/protobuf) at this base URL: spans at
    /// URL/v1/traces, log records at URL/v1/logs. Without it, OTEL_EXPORTER_OTLP_ENDPOINT (and
    /// the other OTEL_EXPORTER_OTLP_* variables) are honoured.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// A header sent with every export request (an API key, a tenant): NAME=VALUE; repeat for
    /// several. Its value is never logged or shown (OTEL_EXPORTER_OTLP_HEADERS keeps it out of
    /// the process list).
    #[arg(long = "otlp-header", value_name = "NAME=VALUE")]
    otlp_header: Vec<String>,
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
    postern_host::init_logging();
    let manifest = manifest(args.tools.as_deref())?;
    let mut config = HostConfig::new(data_dir.to_owned());
    config.tools = args.tools.clone();
    config.http_port = (!args.no_http).then_some(args.port);
    config.max_message_bytes = args.max_message_bytes;
    config.max_result_bytes = args.max_result_bytes;
    config.drain = Duration::from_secs(args.drain_seconds);
    config.approval_timeout = Duration::from_secs(args.approval_timeout);
    config.run_idle = Duration::from_secs(args.run_idle);
    let idle_lock = args.idle_lock.unwrap_or(if args.approver == ApproverKind::Terminal { 900 } else { 0 });
    config.idle_lock = (idle_lock > 0).then(|| Duration::from_secs(idle_lock));
    config.otlp = postern_otel::ExportSettings::resolve(args.otlp_endpoint.as_deref(), &args.otlp_header, |name| {
        std::env::var(name).ok()
    })
    .map_err(|e| Failure { code: 2, error: anyhow!("{e}") })?;
    let host = Host::open(config)?;
    let approver: Arc<dyn postern_engine::Approver> = match args.approver {
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
            otlp = %host.config.otlp.as_ref().map_or_else(|| "off".into(), postern_otel::ExportSettings::target),
            "postern gateway ready"
        );
        serving.run(shutdown_signal()).await?;
        Ok::<(), Failure>(())
    })?;
    tracing::info!("goodbye");
    Ok(ExitCode::SUCCESS)
}
