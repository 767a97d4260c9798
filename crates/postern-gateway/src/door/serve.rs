//! The gateway as a service: the bridge socket and the Streamable HTTP endpoint over one engine,
//! and a shutdown that lets in-flight executions finish and be journaled. `postern serve` and
//! the desktop app both run this.

use crate::{
    door::mcp::Gateway,
    door::socket::{self, SocketError},
    door::streamable,
};
use std::{path::PathBuf, sync::Arc, time::Duration};

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    /// Streamable HTTP port on 127.0.0.1 (`Some(0)` picks a free one; `None` turns HTTP off).
    pub http_port: Option<u16>,
    pub max_message_bytes: usize,
    /// How long a shutdown waits for executions in flight.
    pub drain: Duration,
}

/// Where the gateway listens, once bound.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub socket: PathBuf,
    pub control: PathBuf,
    pub http: Option<std::net::SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("cannot listen on 127.0.0.1:{port}: {source} (choose another with --port)")]
    Http { port: u16, source: std::io::Error },
}

impl postern_core::ErrorCode for ServeError {
    fn code(&self) -> &'static str {
        match self {
            ServeError::Socket(e) => e.code(),
            ServeError::Http { .. } => "port_unavailable",
        }
    }
}

/// A bound gateway, ready to run.
#[derive(Debug)]
pub struct BoundGateway {
    gateway: Arc<Gateway>,
    options: ServeOptions,
    socket: tokio::net::UnixListener,
    control: tokio::net::UnixListener,
    http: Option<tokio::net::TcpListener>,
    pub endpoints: Endpoints,
}

/// Binds both endpoints (so their addresses can be printed before serving starts).
pub async fn bind(gateway: Arc<Gateway>, options: ServeOptions) -> Result<BoundGateway, ServeError> {
    raise_open_file_limit();
    let (socket, socket_path) = socket::bind(&options.data_dir)?;
    let (control, control_path) = crate::door::control::bind(&options.data_dir)?;
    let http = match options.http_port {
        Some(port) => Some(streamable::bind(port).await.map_err(|source| ServeError::Http { port, source })?),
        None => None,
    };
    let endpoints =
        Endpoints { socket: socket_path, control: control_path, http: http.as_ref().and_then(|l| l.local_addr().ok()) };
    Ok(BoundGateway { gateway, options, socket, control, http, endpoints })
}

impl BoundGateway {
    /// Serves until `shutdown` resolves, then stops accepting, waits (up to the drain period)
    /// for executions in flight, and removes the socket. An execution still dispatched when the
    /// wait ends is recovered as `outcome_unknown` at the next start.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let socket_task = tokio::spawn(socket::serve(
            Arc::clone(&self.gateway),
            self.socket,
            self.options.max_message_bytes,
            wait(stop_rx.clone()),
        ));
        let approver = self.gateway.engine.approver();
        let info = crate::door::control::GatewayInfo {
            pid: std::process::id(),
            started_at: (self.gateway.clock)().as_millis(),
            approver: approver.kind().to_owned(),
            where_to_unlock: approver.where_to_unlock().to_owned(),
            socket: self.endpoints.socket.display().to_string(),
            http: self.endpoints.http.map(|a| format!("http://{a}/mcp")),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            kept_secrets: 0,
        };
        let control_task = tokio::spawn(crate::door::control::serve(
            Arc::clone(&self.gateway),
            info,
            self.control,
            wait(stop_rx.clone()),
        ));
        let http_task = self.http.map(|listener| {
            tokio::spawn(streamable::serve(
                Arc::clone(&self.gateway),
                listener,
                self.options.max_message_bytes,
                wait(stop_rx.clone()),
            ))
        });
        shutdown.await;
        tracing::info!("shutting down: no new connections");
        let _ = stop_tx.send(true);
        let _ = socket_task.await;
        let _ = control_task.await;
        self.gateway.executions.close();
        let in_flight = self.gateway.executions.len();
        if in_flight > 0 {
            tracing::info!(in_flight, "waiting for executions in flight");
        }
        if tokio::time::timeout(self.options.drain, self.gateway.executions.wait()).await.is_err() {
            tracing::warn!(
                still_running = self.gateway.executions.len(),
                "executions still in flight; they stay dispatched and are recovered at the next start"
            );
        }
        if let Some(task) = http_task {
            // Open SSE streams would hold a graceful HTTP shutdown forever.
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        let _ = std::fs::remove_file(&self.endpoints.socket);
        let _ = std::fs::remove_file(&self.endpoints.control);
    }
}

/// The most open files the gateway asks for: room for every agent's calls under way, but not
/// so many that a child (an upstream server inherits the limit) that closes every possible
/// descriptor at start spends long doing it.
const OPEN_FILES_WANTED: u64 = 65_536;

/// Raises this process's soft limit on open files to its hard limit: every connection, call
/// target, upstream pipe and the journal are descriptors, and the soft limit many desktops start
/// programs with (1,024) is reached by a few busy agents, after which every agent's connections
/// fail. Each agent's calls under way are bounded by the engine; this gives the bound room.
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let wanted = limit.maximum.map_or(OPEN_FILES_WANTED, |max| max.min(OPEN_FILES_WANTED));
    match limit.current {
        Some(current) if current >= wanted => {}
        // `None` is unlimited already.
        None => {}
        Some(current) => match setrlimit(Resource::Nofile, Rlimit { current: Some(wanted), maximum: limit.maximum }) {
            Ok(()) => tracing::debug!(from = current, to = wanted, "raised the open-file limit"),
            Err(e) => tracing::warn!(limit = current, error = %e, "could not raise the open-file limit"),
        },
    }
}

#[cfg(test)]
mod tests {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

    /// Started with a desktop's usual soft limit, the gateway raises it (nextest runs each test
    /// in a process of its own, so lowering it here touches no other test).
    #[test]
    fn the_open_file_limit_is_raised_to_what_is_allowed() {
        let before = getrlimit(Resource::Nofile);
        setrlimit(Resource::Nofile, Rlimit { current: Some(256), maximum: before.maximum }).unwrap();
        super::raise_open_file_limit();
        let limit = getrlimit(Resource::Nofile);
        let allowed = limit.maximum.map_or(super::OPEN_FILES_WANTED, |max| max.min(super::OPEN_FILES_WANTED));
        assert!(limit.current.is_none_or(|current| current >= allowed), "{limit:?}");
    }
}
