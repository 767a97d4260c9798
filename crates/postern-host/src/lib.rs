//! The one place a running Postern is put together: where its data and its tool manifest are,
//! every knob with its default (parsed once, a bad value an error naming it), the store (with the
//! "another gateway holds it" hint), the vault, the engine, the agent runs and the endpoints, and
//! how it stops (drain the executions in flight, flush the journal). `postern serve` and the
//! desktop app differ only in the approver and the UI.

pub mod doctor;
pub mod import;
pub mod login;
pub mod operations;
pub mod plaintext;

use postern_core::{ErrorCode, Timestamp};
use postern_engine::{Approver, Engine, EngineError, Manifest, catalog::manifest::ManifestError, engine::system_clock};
use postern_gateway::{
    caller::runs::AgentRuns,
    door::mcp::Gateway,
    door::serve::{self, BoundGateway, Endpoints, ServeError, ServeOptions},
};
use postern_store::{Recovery, Store, StoreError};
use postern_vault::{OsKeychain, SecretStore, Vault, VaultError};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

/// Why Postern could not be put together or started.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{0}")]
    Location(String),
    #[error("{variable}={value:?} is not valid: {problem}")]
    Setting { variable: &'static str, value: String, problem: String },
    /// The OpenTelemetry export's settings (a flag or an `OTEL_*` variable) or its start.
    #[error("the OpenTelemetry export: {0}")]
    Export(String),
    /// The reason is part of the message (not a `source`, which reporters would print twice).
    #[error("cannot read the tool manifest {}: {reason}", path.display())]
    Manifest { path: PathBuf, reason: std::io::Error },
    #[error("{source}\nA Postern gateway is already serving {}; agents connect to it with `postern mcp`.", data_dir.display())]
    InUse { data_dir: PathBuf, source: StoreError },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

impl ErrorCode for HostError {
    fn code(&self) -> &'static str {
        match self {
            HostError::Location(_) => "no_home_directory",
            HostError::Setting { .. } | HostError::Export(_) => "invalid_setting",
            HostError::Manifest { .. } => "manifest_unreadable",
            HostError::InUse { .. } => "journal_in_use",
            HostError::Store(e) => e.code(),
            HostError::Vault(e) => e.code(),
            HostError::Engine(e) => e.code(),
            HostError::Serve(_) => "cannot_listen",
        }
    }
}

/// The OS data directory (XDG on Linux), for when none is given.
pub fn default_data_dir() -> Result<PathBuf, HostError> {
    directories::ProjectDirs::from("", "", "postern")
        .map(|d| d.data_dir().to_owned())
        .ok_or_else(|| HostError::Location("cannot determine a home directory; set POSTERN_DATA_DIR".into()))
}

/// The default tool manifest: `tools.toml` in the OS config directory.
pub fn default_tools_file() -> Result<PathBuf, HostError> {
    directories::ProjectDirs::from("", "", "postern")
        .map(|d| d.config_dir().join("tools.toml"))
        .ok_or_else(|| HostError::Location("cannot determine a home directory; set POSTERN_TOOLS".into()))
}

/// The journal's database in `data_dir`.
pub fn database(data_dir: &Path) -> PathBuf {
    data_dir.join("postern.db")
}

/// A tool manifest as loaded: what is served, from where, and what is wrong with it.
#[derive(Debug)]
pub struct ManifestLoad {
    /// The manifest's tools, or only the built-ins when it has problems or does not exist.
    pub manifest: Manifest,
    pub path: PathBuf,
    /// Its problems, each with file and line (none: it is served as written).
    pub problems: Vec<ManifestError>,
}

/// The tool manifest: `explicit` if given (then it must exist), else the default file (missing:
/// the built-in tools only).
pub fn load_manifest(explicit: Option<&Path>) -> Result<ManifestLoad, HostError> {
    let path = match explicit {
        Some(p) => p.to_owned(),
        None => default_tools_file()?,
    };
    let builtins = || Manifest::default();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => String::new(),
        Err(reason) => return Err(HostError::Manifest { path, reason }),
    };
    Ok(match Manifest::parse(&text, &path) {
        Ok(manifest) => ManifestLoad { manifest, path, problems: vec![] },
        Err(problems) => ManifestLoad { manifest: builtins(), path, problems },
    })
}

/// Every knob of a running Postern.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub data_dir: PathBuf,
    /// The tool manifest named explicitly (`None`: the default file).
    pub tools: Option<PathBuf>,
    /// Streamable HTTP on 127.0.0.1 (`Some(0)`: any free port; `None`: off).
    pub http_port: Option<u16>,
    pub max_message_bytes: usize,
    /// The most bytes a result may hold, for every channel (HTTP, SSH, upstream MCP servers):
    /// a larger answer is not kept, and the result says `result_too_large` with the limit.
    pub max_result_bytes: usize,
    /// How long a stop waits for executions in flight.
    pub drain: Duration,
    /// How long a reviewer has to answer.
    pub approval_timeout: Duration,
    /// Lock the vault after this long without activity (`None`: never).
    pub idle_lock: Option<Duration>,
    /// How long a run without an identified process outlives its last request.
    pub run_idle: Duration,
    /// The journal's OpenTelemetry export (`None`: off).
    pub otlp: Option<postern_otel::ExportSettings>,
}

impl HostConfig {
    /// Defaults for `data_dir`: HTTP on the default port, 4 MiB messages, 35 s drain, 120 s to
    /// answer, results of at most 1 MiB, no idle lock.
    pub fn new(data_dir: PathBuf) -> HostConfig {
        HostConfig {
            data_dir,
            tools: None,
            http_port: Some(postern_gateway::door::streamable::DEFAULT_PORT),
            max_message_bytes: postern_gateway::door::socket::DEFAULT_MAX_MESSAGE_BYTES,
            max_result_bytes: postern_engine::channel::http::DEFAULT_MAX_RESULT_BYTES,
            drain: Duration::from_secs(35),
            approval_timeout: postern_engine::engine::DEFAULT_APPROVAL_TIMEOUT,
            idle_lock: None,
            run_idle: postern_gateway::caller::runs::DEFAULT_IDLE_LEASE,
            otlp: None,
        }
    }

    /// For a process configured by its environment (the desktop app): `POSTERN_DATA_DIR`,
    /// `POSTERN_TOOLS`, `POSTERN_PORT`, `POSTERN_MAX_RESULT_BYTES`, `POSTERN_APPROVAL_TIMEOUT` and
    /// `POSTERN_IDLE_LOCK` (seconds; 0: never), over `idle_lock` as the default,
    /// `POSTERN_RUN_IDLE` (seconds), and the OpenTelemetry export's variables
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT` and friends). A value that does not parse is an error
    /// naming the variable, never silently the default.
    pub fn from_env(idle_lock: Option<Duration>) -> Result<HostConfig, HostError> {
        HostConfig::from_lookup(idle_lock, |name| std::env::var(name).ok())
    }

    /// [`HostConfig::from_env`] over any source of variables.
    pub fn from_lookup(
        idle_lock: Option<Duration>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<HostConfig, HostError> {
        let var = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let number = |name: &'static str| -> Result<Option<u64>, HostError> {
            var(name)
                .map(|v| {
                    v.parse::<u64>().map_err(|e| HostError::Setting {
                        variable: name,
                        value: v,
                        problem: e.to_string(),
                    })
                })
                .transpose()
        };
        let data_dir = match var("POSTERN_DATA_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => default_data_dir()?,
        };
        let mut config = HostConfig::new(data_dir);
        config.tools = var("POSTERN_TOOLS").map(PathBuf::from);
        if let Some(port) = number("POSTERN_PORT")? {
            let port = u16::try_from(port).map_err(|_| HostError::Setting {
                variable: "POSTERN_PORT",
                value: port.to_string(),
                problem: "a port is at most 65535".into(),
            })?;
            config.http_port = Some(port);
        }
        if let Some(bytes) = number("POSTERN_MAX_RESULT_BYTES")? {
            config.max_result_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(s) = number("POSTERN_APPROVAL_TIMEOUT")? {
            config.approval_timeout = Duration::from_secs(s);
        }
        if let Some(s) = number("POSTERN_RUN_IDLE")? {
            config.run_idle = Duration::from_secs(s);
        }
        config.idle_lock = match number("POSTERN_IDLE_LOCK")? {
            Some(0) => None,
            Some(s) => Some(Duration::from_secs(s)),
            None => idle_lock,
        };
        config.otlp =
            postern_otel::ExportSettings::resolve(None, &[], &lookup).map_err(|e| HostError::Export(e.to_string()))?;
        Ok(config)
    }
}

/// The journal and the vault of one data directory, opened by the one process that may write it.
#[derive(Debug)]
pub struct Host {
    pub config: HostConfig,
    pub store: Arc<Store>,
    pub vault: Arc<Vault>,
    /// What opening the journal recovered from the last process.
    pub recovery: Recovery,
}

/// Logs to stderr, filtered by `POSTERN_LOG` (default: `info`, rmcp's own chatter only on
/// errors), in colour only on a terminal without `NO_COLOR`. Stdout stays free: `postern mcp`
/// and `--json` outputs own it.
pub fn init_logging() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POSTERN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=error")),
        )
        .init();
}

/// The wall clock, read by the shells: the libraries take time as a parameter.
pub fn now() -> Timestamp {
    system_clock()()
}

/// Opens the journal of `data_dir` (creating the directory, private to this user, and the
/// database if needed; `now` stamps what recovery writes), saying so when a running gateway
/// holds it.
pub fn open_journal(data_dir: &Path, now: Timestamp) -> Result<(Arc<Store>, Recovery), HostError> {
    match Store::open(&database(data_dir), now) {
        Ok((store, recovery)) => Ok((Arc::new(store), recovery)),
        Err(e @ StoreError::InUse { .. }) => Err(HostError::InUse { data_dir: data_dir.to_owned(), source: e }),
        Err(e) => Err(e.into()),
    }
}

/// How long a gateway that is starting waits for the journal while another process holds it. A
/// CLI command run while no gateway served holds it for a moment (`postern status` creates the
/// journal and recovers it), and a gateway must not fail to start because of that: the install
/// check's app did, started while its wait loop ran `postern status`. Another gateway holds it
/// for good, and is named once the wait is over.
const START_WAIT: Duration = Duration::from_secs(5);

/// [`open_journal`], trying again for up to `wait` while another process holds the journal.
fn open_journal_waiting(data_dir: &Path, now: Timestamp, wait: Duration) -> Result<(Arc<Store>, Recovery), HostError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match open_journal(data_dir, now) {
            Err(HostError::InUse { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            opened => return opened,
        }
    }
}

impl Host {
    /// Creates the data directory if needed, opens the journal (saying so when another gateway
    /// holds it) and the vault (the OS keychain).
    pub fn open(config: HostConfig) -> Result<Host, HostError> {
        let keychain = Arc::new(OsKeychain::connect()?);
        Host::open_with(config, keychain, now())
    }

    /// [`Host::open`] with the secrets in `keychain` (benches and unit tests may keep them in
    /// memory; everything that runs for a user uses the OS keychain), `now` stamping what opening
    /// writes.
    pub fn open_with(config: HostConfig, keychain: Arc<dyn SecretStore>, now: Timestamp) -> Result<Host, HostError> {
        let (store, recovery) = open_journal_waiting(&config.data_dir, now, START_WAIT)?;
        let vault = Arc::new(Vault::open(Arc::clone(&store), keychain, now)?);
        Ok(Host { config, store, vault, recovery })
    }

    /// The engine serving `manifest`, asking `approver`.
    pub fn engine(&self, manifest: Manifest, approver: Arc<dyn Approver>) -> Result<Arc<Engine>, HostError> {
        let upstreams = postern_engine::channel::upstream::Upstreams::new(
            Arc::clone(&self.vault),
            manifest.server_overrides().clone(),
            system_clock(),
        )
        .with_max_result_bytes(self.config.max_result_bytes);
        let engine = Engine::new(
            Arc::clone(&self.store),
            Arc::clone(&self.vault),
            Arc::new(manifest),
            approver,
            system_clock(),
        )?
        .with_approval_timeout(self.config.approval_timeout)
        .with_max_result_bytes(self.config.max_result_bytes)
        .with_upstreams(Arc::new(upstreams));
        Ok(Arc::new(engine))
    }

    /// Adopts the agent runs the last process left open and binds the endpoints (the MCP socket,
    /// the control socket, Streamable HTTP).
    pub async fn bind(&self, engine: Arc<Engine>) -> Result<Serving, HostError> {
        let runs = AgentRuns::new(Arc::clone(&self.store), system_clock(), self.config.run_idle);
        let gateway = Gateway::new(Arc::clone(&engine), Arc::clone(&self.store), system_clock(), runs);
        // Adopting reads the executables of the agents the last process left running (blocking
        // work, off the async workers) into the gateway's own cache, where those agents' next
        // connections find them instead of reading them again.
        let (runs, hashes) = (Arc::clone(&gateway.runs), Arc::clone(&gateway.hashes));
        let (adopted, ended) = match tokio::task::spawn_blocking(move || runs.adopt_open(&hashes)).await {
            Ok(adoption) => adoption?,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let options = ServeOptions {
            data_dir: self.config.data_dir.clone(),
            http_port: self.config.http_port,
            max_message_bytes: self.config.max_message_bytes,
            drain: self.config.drain,
        };
        let bound = serve::bind(gateway, options).await?;
        // The export starts with the gateway; a bad endpoint is an error now, not a silent gap.
        let export = match &self.config.otlp {
            Some(settings) => {
                let settings = settings.clone().with_arguments_of(engine.manifest().export_arguments().clone());
                let db = database(&self.config.data_dir);
                Some(
                    postern_otel::Exporter::new(settings, Arc::clone(&self.store), &db)
                        .map_err(|e| HostError::Export(e.to_string()))?,
                )
            }
            None => None,
        };
        Ok(Serving {
            endpoints: bound.endpoints.clone(),
            adopted,
            ended,
            bound,
            engine,
            store: Arc::clone(&self.store),
            idle_lock: self.config.idle_lock,
            export,
        })
    }
}

/// A bound gateway, ready to run.
pub struct Serving {
    pub endpoints: Endpoints,
    /// Agent runs of the last process adopted (their process lives) and ended (it is gone).
    pub adopted: usize,
    pub ended: usize,
    bound: BoundGateway,
    engine: Arc<Engine>,
    store: Arc<Store>,
    idle_lock: Option<Duration>,
    /// The journal's OpenTelemetry exporter, when one is set up.
    export: Option<postern_otel::Exporter>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving").field("endpoints", &self.endpoints).finish_non_exhaustive()
    }
}

impl Serving {
    /// Serves until `shutdown` resolves (with the idle lock, if configured), lets executions in
    /// flight finish and be journaled, then flushes the journal.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), HostError> {
        let idle = self.idle_lock.map(|idle| {
            let engine = Arc::clone(&self.engine);
            tokio::spawn(async move { engine.idle_lock(idle).await })
        });
        // Secrets and kept SSH connections are dropped within a second of a lock from anywhere
        // (the control socket included), and idle connections when they expire.
        let upkeep = {
            let engine = Arc::clone(&self.engine);
            tokio::spawn(async move { engine.upkeep(Duration::from_secs(1)).await })
        };
        // Upstream MCP servers start with the gateway unless the owner said "on first use" (a
        // locked vault or a broken server is retried on first use and shown by `servers list`).
        let upstreams = self.engine.upstreams().cloned();
        if let Some(u) = &upstreams {
            let u = Arc::clone(u);
            tokio::spawn(async move { u.start_with_gateway().await });
        }
        // The export follows the journal in a task of its own; it stops with the gateway, and the
        // next start resumes from its bookmark.
        let (stop_export, export_stopped) = tokio::sync::oneshot::channel::<()>();
        let export = self.export.map(|exporter| {
            tokio::spawn(exporter.run(async move {
                let _ = export_stopped.await;
            }))
        });
        self.bound.run(shutdown).await;
        let _ = stop_export.send(());
        if let Some(export) = export {
            let _ = export.await;
        }
        if let Some(u) = upstreams {
            u.stop_all().await;
        }
        upkeep.abort();
        if let Some(idle) = idle {
            idle.abort();
        }
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.flush())
            .await
            .map_err(|e| HostError::Store(StoreError::Corrupt(e.to_string())))??;
        tracing::info!("journal flushed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The desktop app takes its knobs from the environment: a value that does not parse is an
    /// error naming the variable, never silently the default (the app used to ignore a bad
    /// `POSTERN_PORT` and hard-code its approval timeout and idle lock).
    #[test]
    fn settings_from_the_environment_parse_or_say_which_is_wrong() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
        };
        let config = HostConfig::from_lookup(
            Some(Duration::from_secs(900)),
            env(&[("POSTERN_DATA_DIR", "/tmp/p"), ("POSTERN_PORT", "0"), ("POSTERN_APPROVAL_TIMEOUT", "30")]),
        )
        .unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/tmp/p"));
        assert_eq!(config.http_port, Some(0));
        assert_eq!(config.approval_timeout, Duration::from_secs(30));
        assert_eq!(config.idle_lock, Some(Duration::from_secs(900)), "the caller's default");
        let off = HostConfig::from_lookup(
            Some(Duration::from_secs(900)),
            env(&[("POSTERN_DATA_DIR", "/tmp/p"), ("POSTERN_IDLE_LOCK", "0")]),
        );
        assert_eq!(off.unwrap().idle_lock, None);
        for (variable, bad) in [("POSTERN_PORT", "80a"), ("POSTERN_PORT", "70000"), ("POSTERN_IDLE_LOCK", "-1")] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![("POSTERN_DATA_DIR", "/tmp/p"), (variable, bad)].into_boxed_slice());
            let err = HostConfig::from_lookup(None, env(pairs)).unwrap_err();
            assert!(err.to_string().starts_with(&format!("{variable}=")), "{err}");
            assert_eq!(err.code(), "invalid_setting");
        }
    }

    /// The data directory holds the journal, the control socket and the agents' socket: created
    /// private to this user, whoever opens it first (`serve`, the app or any command).
    #[cfg(unix)]
    #[test]
    fn a_new_data_directory_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("a/postern");
        let (store, _) = open_journal(&data_dir, Timestamp::from_millis(1)).unwrap();
        assert_eq!(std::fs::metadata(&data_dir).unwrap().permissions().mode() & 0o777, 0o700);
        // The journal and its WAL are owner-only too, whatever the umask.
        for file in ["postern.db", "postern.db-wal"] {
            let mode = std::fs::metadata(data_dir.join(file)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file}");
        }
        let held = open_journal(&data_dir, Timestamp::from_millis(2)).unwrap_err();
        assert_eq!(held.code(), "journal_in_use", "{held}");
        drop(store);
    }

    /// Whoever stops a host (`postern serve` on a signal, the app on exit) gets every write that
    /// was queued before the stop on disk: read-only executions are journaled without waiting,
    /// and the app used to exit without flushing them.
    /// A gateway that starts while a short-lived command holds the journal waits for it, and one
    /// that finds the journal held for good says who holds it.
    #[test]
    fn a_gateway_starting_beside_a_brief_command_waits_for_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (held, _) = open_journal(dir.path(), Timestamp::from_millis(1)).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let keychain = Arc::new(postern_vault::MemoryKeychain::default());
        let host = Host::open_with(HostConfig::new(dir.path().to_owned()), keychain, Timestamp::from_millis(2));
        release.join().unwrap();
        let host = host.unwrap_or_else(|e| panic!("the gateway waited for the command: {e}"));
        let refused = open_journal_waiting(dir.path(), Timestamp::from_millis(3), Duration::from_millis(200));
        assert!(matches!(refused, Err(HostError::InUse { .. })), "a gateway holds it: {:?}", refused.err());
        drop(host);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_host_has_written_everything_queued() {
        use postern_core::{
            ActionRequest, ActionTarget, Actor, CanonicalAction, Channel, ExecutionId, FingerprintKey, HttpAction,
            IntentScope, ReplayContract,
        };
        let dir = tempfile::tempdir().unwrap();
        let mut config = HostConfig::new(dir.path().to_owned());
        config.http_port = None;
        config.drain = Duration::from_millis(100);
        let keychain = Arc::new(postern_vault::MemoryKeychain::default());
        let host = Host::open_with(config, keychain, Timestamp::from_millis(1)).unwrap();
        let engine = host.engine(Manifest::default(), Arc::new(postern_engine::LockOnlyApprover)).unwrap();
        let serving = host.bind(engine).await.unwrap();
        let before = host.store.view().head().unwrap().size;
        let key = FingerprintKey::from_bytes([7; 32]);
        let contract = ReplayContract::read_only();
        const QUEUED: u64 = 2_000;
        for i in 0..QUEUED {
            let request = ActionRequest {
                actor: Actor::token_agent("reader"),
                tool: "read".into(),
                target: ActionTarget::Http(HttpAction {
                    method: "GET".into(),
                    url: format!("https://api.example/items/{i}"),
                    headers: vec![],
                }),
                credential_ref: None,
                arguments: serde_json::json!({ "i": i }),
                intent_scope: IntentScope::durable(),
            };
            let action = CanonicalAction::build(&request, &contract, &key).unwrap();
            let at = Timestamp::from_millis(10 + i as i64);
            let new = postern_store::NewExecution {
                id: ExecutionId::from_parts(at, u128::from(i)),
                fingerprint: action.fingerprint(&key),
                effect_fingerprint: Some(action.effect_fingerprint(&key)),
                actor: request.actor,
                intent_scope: request.intent_scope,
                session_id: None,
                tool: request.tool,
                channel: Channel::Http,
                contract: contract.clone(),
                record: action.record().clone(),
                correlation: serde_json::json!({}),
                at,
            };
            let step = |state| postern_store::Step { state, detail: serde_json::json!({}), at };
            let steps =
                vec![step(postern_core::ExecutionState::Authorized), step(postern_core::ExecutionState::Dispatched)];
            let completion =
                postern_store::Completion { outcome: serde_json::json!({ "http_status": 200 }), result: vec![], at };
            host.store.record_read_only_detached(new, steps, Some(completion)).unwrap();
        }
        serving.run(async {}).await.unwrap();
        let view = postern_store::JournalView::open_read_only(&database(dir.path())).unwrap();
        // `accepted` (authorized and dispatched folded in) and `completed`: two rows each.
        assert_eq!(view.head().unwrap().size, before + 2 * QUEUED, "every queued row is written when run returns");
    }

    #[test]
    fn a_named_manifest_must_exist_the_default_may_not() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("tools.toml");
        assert!(matches!(load_manifest(Some(&missing)), Err(HostError::Manifest { .. })));
        std::fs::write(&missing, "[[tool]]\nname = \"x\"\n").unwrap();
        let loaded = load_manifest(Some(&missing)).unwrap();
        assert_eq!(loaded.problems.len(), 1, "{:?}", loaded.problems);
        assert_eq!(loaded.manifest.tools().count(), 0, "only the built-ins are served");
    }
}
