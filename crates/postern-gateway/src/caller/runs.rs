//! Agent runs: the Sessions journal and the default intent scope (docs/src/design.md, the intent scope).
//!
//! A run is one agent *process* (pid + start time) under one actor; it outlives any one bridge
//! process or MCP session, so a reconnecting agent's retry lands in the same intent scope. It
//! ends when the process exits. A caller whose process cannot be identified (an HTTP client
//! behind a relay, in a container, another user's, or `hidepid`) is one run per agent token,
//! held by an idle lease: it ends once no connection or request has used it for
//! [`DEFAULT_IDLE_LEASE`] (configurable), and survives a gateway restart. At protocol 2026-07-28
//! every POST is its own MCP handler, so without the lease each request would be a run of its
//! own, and a retry a new execution.

use crate::caller::identity::{self, AgentProcess, ProcessKey};
use postern_core::{Actor, IntentScope, SessionId, Timestamp};
use postern_engine::engine::Clock;
use postern_store::{SessionStart, Store, StoreError};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

/// How the agent reached the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `postern mcp` over the local socket.
    Stdio,
    StreamableHttp,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::StreamableHttp => "streamable_http",
        }
    }
}

/// Who is calling, as far as the gateway can prove it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub transport: Transport,
    /// The token's agent name (Streamable HTTP).
    pub agent: Option<String>,
    /// The calling process, when the kernel could tell.
    pub process: Option<AgentProcess>,
}

impl Caller {
    pub fn actor(&self) -> Actor {
        match (&self.agent, &self.process) {
            (Some(name), _) => Actor::token_agent(name),
            (None, Some(p)) => p.actor(),
            (None, None) => Actor::from_recorded("unidentified"),
        }
    }

    fn key(&self) -> RunKey {
        RunKey { actor: self.actor(), process: self.process.as_ref().map(|p| p.key.clone()) }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RunKey {
    actor: Actor,
    process: Option<ProcessKey>,
}

/// How long a run without a process outlives its last connection or request, unless configured.
pub const DEFAULT_IDLE_LEASE: Duration = Duration::from_secs(60 * 60);

/// One agent run.
#[derive(Debug)]
pub struct AgentRun {
    pub session: SessionId,
    pub actor: Actor,
    pub transport: Transport,
    /// MCP sessions / connections currently attached (runs without a process end at zero).
    attached: Mutex<usize>,
    /// The run spoke MCP as an agent does — through a `postern mcp` bridge or with an agent token
    /// over HTTP — not only through `postern call`: its process's descendants are inside an
    /// agent run (see [`crate::caller::provenance`]).
    speaks_as_agent: std::sync::atomic::AtomicBool,
    /// When a lease was last let go (runs without a process): set *before* the lease's count
    /// drops, so an idle timer never sees "unused" with a stale time.
    released_at: Mutex<std::time::Instant>,
    /// The run's one idle timer is armed (one task per run, not per request).
    idle_timer: std::sync::atomic::AtomicBool,
    /// Whether the run's start is on record: a connection that joins a run another one is
    /// starting waits for it, since the journal refuses a call's grant for a run it does not know.
    start: tokio::sync::watch::Sender<Start>,
}

/// Where a run's start is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Being journaled by the connection that made the run.
    Journaling,
    /// In the journal (journaled here, or adopted from the journal at startup).
    OnRecord,
    /// It could not be journaled: the run has left the registry, unused.
    Failed,
}

impl AgentRun {
    fn new(
        session: SessionId,
        actor: Actor,
        transport: Transport,
        attached: usize,
        agent: bool,
        start: Start,
    ) -> AgentRun {
        AgentRun {
            session,
            actor,
            transport,
            attached: Mutex::new(attached),
            speaks_as_agent: std::sync::atomic::AtomicBool::new(agent),
            released_at: Mutex::new(std::time::Instant::now()),
            idle_timer: std::sync::atomic::AtomicBool::new(false),
            start: tokio::sync::watch::Sender::new(start),
        }
    }

    /// Waits until the run's start is settled: `true` once it is on record, `false` if it failed.
    async fn started(&self) -> bool {
        let mut settled = self.start.subscribe();
        // The sender lives in this run, which the caller holds: the wait ends only when settled.
        settled.wait_for(|s| *s != Start::Journaling).await.is_ok_and(|s| *s == Start::OnRecord)
    }

    fn attached(&self) -> usize {
        self.attached.lock().map_or(0, |n| *n)
    }

    /// No lease holds it, and none has been let go for `idle`.
    fn unused_for(&self, idle: Duration) -> bool {
        self.attached() == 0 && self.released_at.lock().is_ok_and(|at| at.elapsed() >= idle)
    }
}

impl AgentRun {
    /// Marks the run as one an agent holds (a bridge or an agent token reached it).
    pub fn spoke_as_agent(&self) {
        self.speaks_as_agent.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn intent_scope(&self) -> IntentScope {
        IntentScope::agent_run(self.session)
    }
}

/// The registry of live runs.
pub struct AgentRuns {
    store: Arc<Store>,
    clock: Clock,
    live: Mutex<HashMap<RunKey, Arc<AgentRun>>>,
    /// Processes with a `postern mcp` bridge connected (how many), whether or not they have
    /// called a tool yet (a run starts at the first call): an agent from the moment it connects.
    bridged: Mutex<HashMap<ProcessKey, usize>>,
    /// How often a run's process is checked for exit.
    poll: Duration,
    /// How long a run without a process outlives its last lease.
    idle: Duration,
}

/// Counts a bridged connection of one agent process while it is held (see
/// [`AgentRuns::bridge_connected`]).
#[derive(Debug)]
pub struct BridgedProcess {
    runs: Arc<AgentRuns>,
    key: ProcessKey,
}

impl Drop for BridgedProcess {
    fn drop(&mut self) {
        if let Ok(mut bridged) = self.runs.bridged.lock()
            && let Some(n) = bridged.get_mut(&self.key)
        {
            *n -= 1;
            if *n == 0 {
                bridged.remove(&self.key);
            }
        }
    }
}

impl std::fmt::Debug for AgentRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRuns").finish_non_exhaustive()
    }
}

/// Holds a run open while a connection or MCP session uses it.
#[derive(Debug)]
pub struct RunLease {
    pub run: Arc<AgentRun>,
    runs: Arc<AgentRuns>,
    key: RunKey,
}

impl Drop for RunLease {
    fn drop(&mut self) {
        if let Ok(mut at) = self.run.released_at.lock() {
            *at = std::time::Instant::now();
        }
        let last = self.run.attached.lock().map(|mut n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
        // A run bound to a process ends with the process, not with its connections; one without
        // a process ends when it has been idle for the lease.
        if last.unwrap_or(false) && self.key.process.is_none() {
            self.runs.idle_from_now(self.key.clone(), Arc::clone(&self.run));
        }
    }
}

/// Settles a run's start when dropped: on record, or failed and out of the registry (before
/// anyone waiting is told, so a waiter making a run of its own does not find this one). Dropped
/// on every way out of the start, a panic included, so no connection waits for ever.
struct Settle {
    runs: Arc<AgentRuns>,
    key: RunKey,
    run: Arc<AgentRun>,
    on_record: bool,
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.on_record {
            self.run.start.send_replace(Start::OnRecord);
            return;
        }
        if let Ok(mut live) = self.runs.live.lock()
            && live.get(&self.key).is_some_and(|current| Arc::ptr_eq(current, &self.run))
        {
            live.remove(&self.key);
        }
        self.run.start.send_replace(Start::Failed);
    }
}

fn random_u128() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // Uniqueness also comes from the timestamp half; a zero tail is still a valid id.
        tracing::error!("no randomness from the OS for a session id");
    }
    u128::from_le_bytes(bytes)
}

impl AgentRuns {
    /// The shortest idle lease (a zero lease would make every request its own run).
    pub const MIN_IDLE_LEASE: Duration = Duration::from_secs(1);

    /// `idle`: how long a run without a process outlives its last connection or request (at
    /// least [`AgentRuns::MIN_IDLE_LEASE`]).
    pub fn new(store: Arc<Store>, clock: Clock, idle: Duration) -> Arc<Self> {
        Arc::new(AgentRuns {
            store,
            clock,
            live: Mutex::new(HashMap::new()),
            bridged: Mutex::new(HashMap::new()),
            poll: Duration::from_millis(500),
            idle: idle.max(Self::MIN_IDLE_LEASE),
        })
    }

    /// The run's last lease was let go: it ends once unused for the idle lease. One timer per
    /// run: it sleeps until the lease would run out, and ends the run only if, under the
    /// registry's lock (where `join` attaches), nothing holds or has let go of it since.
    fn idle_from_now(self: &Arc<Self>, key: RunKey, run: Arc<AgentRun>) {
        use std::sync::atomic::Ordering;
        if run.idle_timer.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return self.end(&key, &run, "idle_lease_expired");
        };
        let (runs, idle) = (Arc::clone(self), self.idle);
        handle.spawn(async move {
            loop {
                let since = run.released_at.lock().map_or_else(|_| std::time::Instant::now(), |at| *at);
                tokio::time::sleep_until((since + idle).into()).await;
                // A run still being started is not ended (its end would reach the journal before
                // its start); one whose start failed has left the registry: nothing to end.
                if !run.started().await {
                    return;
                }
                if runs.end_if(&key, &run, "idle_lease_expired", || run.unused_for(idle)) {
                    return;
                }
                let live = runs.live.lock().is_ok_and(|live| live.get(&key).is_some_and(|r| Arc::ptr_eq(r, &run)));
                if !live {
                    return;
                }
                if run.attached() > 0 {
                    run.idle_timer.store(false, Ordering::SeqCst);
                    // A lease let go meanwhile found the timer armed: arm it again for that one.
                    if run.attached() == 0 && !run.idle_timer.swap(true, Ordering::SeqCst) {
                        continue;
                    }
                    return;
                }
            }
        });
    }

    /// Re-adopts runs the journal shows open: a process still alive (same pid *and* start
    /// time) keeps its run across a gateway restart; the others are ended.
    pub fn adopt_open(self: &Arc<Self>, hashes: &identity::ExecutableHashes) -> Result<(usize, usize), StoreError> {
        let (mut adopted, mut ended) = (0, 0);
        for s in self.store.view().sessions()? {
            if s.ended_at.is_some() {
                continue;
            }
            let Ok(session) = s.id.parse::<SessionId>() else { continue };
            let key = match (s.pid, s.process_start) {
                (Some(pid), Some(start)) => Some(ProcessKey { pid: pid as u32, start_ticks: start as u64 }),
                _ => None,
            };
            let alive = key.as_ref().is_some_and(identity::is_alive);
            let transport = if s.transport == "stdio" { Transport::Stdio } else { Transport::StreamableHttp };
            let actor = Actor::from_recorded(s.actor.clone());
            // A token's run without a process holds its idle lease across the restart.
            if key.is_none() && actor.as_str().starts_with("agent:") {
                let run = Arc::new(AgentRun::new(session, actor.clone(), transport, 0, true, Start::OnRecord));
                let rk = RunKey { actor, process: None };
                // One run per token: an older open run of the same token (there should be none)
                // is ended rather than left open forever.
                let older = self.live.lock().ok().and_then(|mut live| live.insert(rk.clone(), Arc::clone(&run)));
                if let Some(older) = older {
                    self.store.end_session(older.session, "gateway_restarted", (self.clock)())?;
                    ended += 1;
                    adopted -= 1;
                }
                self.idle_from_now(rk, run);
                adopted += 1;
                continue;
            }
            match key {
                Some(key) if alive && hashes.describe(key.pid).is_some() => {
                    // A run the journal shows open was an agent's (only those are re-adopted).
                    let actor = Actor::from_recorded(s.actor.clone());
                    let run = Arc::new(AgentRun::new(session, actor, transport, 0, true, Start::OnRecord));
                    let rk = RunKey { actor: run.actor.clone(), process: Some(key.clone()) };
                    if let Ok(mut live) = self.live.lock() {
                        live.insert(rk.clone(), Arc::clone(&run));
                    }
                    self.watch(rk, run, key);
                    adopted += 1;
                }
                _ => {
                    let reason = if key.is_some() { "process_exited" } else { "gateway_restarted" };
                    self.store.end_session(session, reason, (self.clock)())?;
                    ended += 1;
                }
            }
        }
        Ok((adopted, ended))
    }

    /// The caller's run, started (and journaled) if it has none. `client` is what the client
    /// said about itself in `initialize`: a label. A run is handed out only once its start is on
    /// record, to the connection that started it and to every one that joined it meanwhile.
    pub async fn join(self: &Arc<Self>, caller: &Caller, client: Option<String>) -> Result<RunLease, StoreError> {
        let key = caller.key();
        loop {
            // Attached (or made, attached) under the registry's lock, so an idle lease cannot end
            // the run in between, and two connections of one process make one run.
            let (run, made_at) = {
                let Ok(mut live) = self.live.lock() else {
                    return Err(StoreError::Corrupt("the run registry's lock is poisoned".into()));
                };
                match live.get(&key) {
                    Some(run) => {
                        if let Ok(mut n) = run.attached.lock() {
                            *n += 1;
                        }
                        (Arc::clone(run), None)
                    }
                    None => {
                        let at: Timestamp = (self.clock)();
                        let session = SessionId::from_parts(at, random_u128());
                        let run = AgentRun::new(session, caller.actor(), caller.transport, 1, false, Start::Journaling);
                        let run = Arc::new(run);
                        live.insert(key.clone(), Arc::clone(&run));
                        (run, Some(at))
                    }
                }
            };
            let lease = RunLease { run, runs: Arc::clone(self), key: key.clone() };
            if let Some(at) = made_at {
                self.journal_start(caller, &lease, client, at).await?;
                return Ok(lease);
            }
            if lease.run.started().await {
                return Ok(lease);
            }
            // The connection that made it could not journal its start, and it left the registry:
            // this one makes a run of its own (and meets the store's error itself, if it lasts).
        }
    }

    /// Journals the start of the run `lease` holds, which this connection made. Settled inside
    /// the blocking task, so a connection that goes away meanwhile still settles it for the
    /// others waiting (and for the registry).
    async fn journal_start(
        self: &Arc<Self>,
        caller: &Caller,
        lease: &RunLease,
        client: Option<String>,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        let run = Arc::clone(&lease.run);
        let start = SessionStart {
            id: run.session,
            actor: run.actor.clone(),
            pid: caller.process.as_ref().map(|p| p.key.pid),
            process_start: caller.process.as_ref().map(|p| p.key.start_ticks as i64),
            transport: caller.transport.as_str().into(),
            client,
            at,
        };
        let (runs, key, process) =
            (Arc::clone(self), lease.key.clone(), caller.process.as_ref().map(|p| p.key.clone()));
        // Made before the task, so that a task that never runs (the runtime shutting down)
        // still settles the run when it is dropped.
        let mut settle = Settle { runs: Arc::clone(&runs), key: key.clone(), run: Arc::clone(&run), on_record: false };
        tokio::task::spawn_blocking(move || {
            let journaled = runs.store.start_session(start);
            settle.on_record = journaled.is_ok();
            drop(settle);
            if let (Ok(_), Some(process)) = (&journaled, process) {
                runs.watch(key, run, process);
            }
            journaled.map(drop)
        })
        .await
        .map_err(|e| StoreError::Corrupt(format!("session start task: {e}")))?
    }

    /// The live agent run whose process is `key` and that an agent holds (a bridge or an agent
    /// token reached it; a run only `postern call` made is a person's command), by its session id.
    /// A process with a bridge connected that has not called yet is named `bridge:<pid>`.
    pub fn run_of_process(&self, key: &ProcessKey) -> Option<String> {
        let run = self.live.lock().ok().and_then(|live| {
            live.iter()
                .find(|(k, run)| {
                    k.process.as_ref() == Some(key) && run.speaks_as_agent.load(std::sync::atomic::Ordering::Relaxed)
                })
                .map(|(_, run)| run.session.to_string())
        });
        run.or_else(|| {
            let bridged = self.bridged.lock().ok()?;
            bridged.contains_key(key).then(|| format!("bridge:{}", key.pid))
        })
    }

    /// Process `key` has a `postern mcp` bridge connected: an agent's, for [`run_of_process`]
    /// (its commands over the control socket are an agent's), until the guard is dropped.
    ///
    /// [`run_of_process`]: AgentRuns::run_of_process
    pub fn bridge_connected(self: &Arc<Self>, key: ProcessKey) -> BridgedProcess {
        if let Ok(mut bridged) = self.bridged.lock() {
            *bridged.entry(key.clone()).or_default() += 1;
        }
        BridgedProcess { runs: Arc::clone(self), key }
    }

    /// Ends the run when its process exits.
    fn watch(self: &Arc<Self>, key: RunKey, run: Arc<AgentRun>, process: ProcessKey) {
        let runs = Arc::clone(self);
        tokio::spawn(async move {
            while identity::is_alive(&process) {
                tokio::time::sleep(runs.poll).await;
            }
            runs.end(&key, &run, "process_exited");
        });
    }

    fn end(&self, key: &RunKey, run: &Arc<AgentRun>, reason: &'static str) {
        self.end_if(key, run, reason, || true);
    }

    /// Ends `run` if it is still the live one for `key` and `still` holds (checked under the
    /// registry's lock); whether it ended it.
    fn end_if(&self, key: &RunKey, run: &Arc<AgentRun>, reason: &'static str, still: impl FnOnce() -> bool) -> bool {
        let removed = self.live.lock().is_ok_and(|mut live| match live.get(key) {
            Some(current) if Arc::ptr_eq(current, run) && still() => live.remove(key).is_some(),
            _ => false,
        });
        if !removed {
            return false;
        }
        let store = Arc::clone(&self.store);
        let (session, at) = (run.session, (self.clock)());
        let end = move || {
            if let Err(e) = store.end_session(session, reason, at) {
                tracing::error!(%session, error = %e, "could not journal the end of a run");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(end);
            }
            Err(_) => end(),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight connections of one agent token arrive together (a 2026-07-28 client's concurrent
    /// POSTs): the first starts the run, the others join it. None may use the run before its
    /// start is on record: a call's grant of the run is refused for a run the journal does not
    /// know (`unknown_session`), so a joiner that went ahead saw its call fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_run_is_never_joined_before_its_start_is_journaled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = Store::open(&dir.path().join("journal.db"), Timestamp::from_millis(1)).expect("store");
        let store = Arc::new(store);
        let runs = AgentRuns::new(Arc::clone(&store), postern_engine::engine::system_clock(), Duration::from_secs(60));
        for trial in 0..40 {
            let caller =
                Caller { transport: Transport::StreamableHttp, agent: Some(format!("agent-{trial}")), process: None };
            let joins: Vec<_> = (0..8)
                .map(|_| {
                    let (runs, caller, store) = (Arc::clone(&runs), caller.clone(), Arc::clone(&store));
                    tokio::spawn(async move {
                        let lease = runs.join(&caller, None).await.expect("join");
                        let on_record = store.view().session(lease.run.session).expect("view").is_some();
                        (on_record, lease)
                    })
                })
                .collect();
            for join in joins {
                let (on_record, _lease) = join.await.expect("task");
                assert!(on_record, "trial {trial}: a run was handed out before its start was journaled");
            }
        }
    }
}
