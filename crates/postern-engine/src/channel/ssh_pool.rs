//! Authenticated SSH connections kept for reuse: one channel per execution on a connection that
//! already did its handshake, host-key check and public-key login (what OpenSSH's
//! `ControlMaster`/`ControlPersist` does), so a command does not pay for them every time.
//!
//! A connection is reused only for the same host, address, account, pinned key and vault epoch:
//! a re-pinned key, a changed or removed host, a lock or any credential change leaves the old
//! connections unused (they are dropped at the next look). Every new connection checks the
//! host key against the pin, as before. A pooled connection that turns out to be dead fails
//! before anything is sent (`NotSent`: the channel or the exec request could not be opened),
//! and only then is the command sent once on a fresh connection; an outcome that is uncertain
//! is never sent again here.

use crate::channel::ssh::{Connection, SshSent};
use postern_vault::{Sensitive, SshHost};
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Idle connections kept per host.
pub const DEFAULT_PER_HOST: usize = 4;
/// How long an idle connection is kept.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct PoolKey {
    name: String,
    address: String,
    port: u16,
    account: String,
    pinned: Option<String>,
    /// `Store::vault_epoch` when the connection was made.
    epoch: u64,
}

impl PoolKey {
    fn of(host: &SshHost, epoch: u64) -> PoolKey {
        PoolKey {
            name: host.name.clone(),
            address: host.address.clone(),
            port: host.port,
            account: host.account.clone(),
            pinned: host.host_key_fingerprint.clone(),
            epoch,
        }
    }
}

/// What one command needs: the host, its key, and the command as sent.
#[derive(Debug)]
pub struct SshJob<'a> {
    pub host: &'a SshHost,
    pub key: &'a Sensitive<String>,
    pub passphrase: Option<&'a Sensitive<String>>,
    pub command: &'a str,
    pub timeout: Duration,
    pub cap: usize,
    pub kill: Option<&'a str>,
}

/// The idle connections, per host.
pub struct SshPool {
    idle: Mutex<HashMap<PoolKey, Vec<(Connection, Instant)>>>,
    per_host: usize,
    keep: Duration,
}

impl std::fmt::Debug for SshPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshPool").field("idle", &self.idle_count()).finish_non_exhaustive()
    }
}

impl Default for SshPool {
    fn default() -> Self {
        SshPool::new(DEFAULT_PER_HOST, DEFAULT_IDLE)
    }
}

impl SshPool {
    pub fn new(per_host: usize, keep: Duration) -> SshPool {
        SshPool { idle: Mutex::default(), per_host, keep }
    }

    /// Idle connections kept now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.values().map(Vec::len).sum())
    }

    /// Drops every kept connection that is closed, idle too long, or from another vault epoch
    /// than `epoch` (a lock or a credential change since it was made).
    pub fn prune(&self, epoch: u64) {
        if let Ok(mut idle) = self.idle.lock() {
            Self::prune_locked(&mut idle, epoch, self.keep);
        }
    }

    fn prune_locked(idle: &mut HashMap<PoolKey, Vec<(Connection, Instant)>>, epoch: u64, keep: Duration) {
        let now = Instant::now();
        idle.retain(|k, conns| {
            conns.retain(|(c, since)| k.epoch == epoch && !c.is_closed() && now.duration_since(*since) < keep);
            !conns.is_empty()
        });
    }

    /// An idle connection for `key`, after dropping every one that is closed, expired or from
    /// another epoch.
    fn take(&self, key: &PoolKey) -> Option<Connection> {
        let mut idle = self.idle.lock().ok()?;
        Self::prune_locked(&mut idle, key.epoch, self.keep);
        idle.get_mut(key)?.pop().map(|(c, _)| c)
    }

    fn put(&self, key: PoolKey, connection: Connection) {
        if connection.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            let conns = idle.entry(key).or_default();
            if conns.len() < self.per_host {
                conns.push((connection, Instant::now()));
            }
        }
    }

    /// Runs `job` on an idle connection to its host if there is one, else on a new one; keeps
    /// the connection afterwards if the command finished (not on a timeout, not on an uncertain
    /// end).
    pub async fn exec(&self, job: SshJob<'_>, epoch: u64) -> SshSent {
        use postern_core::ErrorCode as _;
        let key = PoolKey::of(job.host, epoch);
        if let Some(connection) = self.take(&key) {
            match connection.exec(job.command, job.timeout, job.cap, job.kill).await {
                // Nothing was sent on it: the kept connection had died. Try a fresh one.
                SshSent::NotSent { .. } => connection.close().await,
                sent => return self.settle(key, connection, sent).await,
            }
        }
        let connection = match crate::channel::ssh::connect(job.host, job.key, job.passphrase).await {
            Ok(c) => c,
            Err(e) => return SshSent::NotSent { code: e.code(), reason: e.to_string() },
        };
        let sent = connection.exec(job.command, job.timeout, job.cap, job.kill).await;
        self.settle(key, connection, sent).await
    }

    async fn settle(&self, key: PoolKey, connection: Connection, sent: SshSent) -> SshSent {
        match &sent {
            SshSent::Finished { result, .. } if result.timed_out.is_none() => self.put(key, connection),
            _ => connection.close().await,
        }
        sent
    }
}
