//! The SSH channel (docs/src/design.md, the action record, the lifecycle, replay contracts): one connection per execution through russh, the host
//! key checked against the vault's pin before anything is sent, the private key only in memory,
//! and the marker protocol that lets Postern prove on the host whether an uncertain command ran.
//!
//! Send-phase classification, as for HTTP: everything up to and including a refused or failed
//! `exec` request is `NotSent` (connection refused, DNS, host-key mismatch, authentication);
//! once the `exec` request is out, a connection that drops before the exit status arrives is
//! `Unknown`.

use crate::catalog::template::shell_quote;
use postern_core::{ExecutionId, Outside};
use postern_vault::{HostKeyPolicy, Sensitive, SshHost};
use russh::{
    ChannelMsg, Sig,
    client::{self, Handle},
    keys::{HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate},
};
use serde::{Deserialize, Serialize};
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// How long connecting (TCP, key exchange, authentication) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a timeout's TERM, how long the command has to end before the channel is closed.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// What a command did, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshResult {
    pub exit_status: Option<u32>,
    /// The signal that ended the command (`TERM`, `KILL`, …), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<String>,
    pub stdout: String,
    pub stderr: String,
    /// The output went on past the limit (the outcome stage then keeps none of it).
    pub truncated: bool,
    /// Set when the tool's timeout expired: what Postern did about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<String>,
    /// The outcome was read from the marker on the host after the connection was lost: the exit
    /// status is the command's, its output is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_marker: bool,
    /// The output held a secret of the call (the host's key, a secret argument): masked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_echoed: bool,
    /// The output was larger than the limit (the number, in bytes): it was not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_too_large: Option<u64>,
}

#[derive(Debug)]
pub enum SshSent {
    Finished {
        result: SshResult,
        elapsed: Duration,
    },
    /// Nothing ran: `code` says why (`host_key_mismatch`, `ssh_auth_failed`, `ssh_unreachable`, …).
    NotSent {
        code: &'static str,
        reason: String,
    },
    Unknown {
        reason: String,
    },
}

impl SshSent {
    /// What happened, in words, without what the host wrote (its output is outside text that
    /// only the outcome stage may pass on): for errors about a marker probe or a clean-up.
    pub fn summary(&self) -> String {
        match self {
            SshSent::Finished { result, .. } => match (result.exit_status, &result.exit_signal) {
                (Some(status), _) => format!("it exited with status {status}"),
                (None, Some(signal)) => format!("it was ended by signal {}", Outside::line(signal)),
                (None, None) => "it ended without an exit status".to_owned(),
            },
            SshSent::NotSent { code, reason } => format!("{code}: {}", Outside::line(reason)),
            SshSent::Unknown { reason } => format!("its outcome is unknown: {}", Outside::line(reason)),
        }
    }
}

/// Why a connection could not be used; every one of these happens before a command is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshError {
    #[error(
        "HOST KEY MISMATCH for {host} ({address}): the vault pins {pinned}, the server presented {presented}. Nothing \
         was sent. If the host was re-installed, remove and re-add it with its new key."
    )]
    HostKeyMismatch { host: String, address: String, pinned: String, presented: String },
    #[error("cannot reach {host} ({address}): {reason}")]
    Unreachable { host: String, address: String, reason: String },
    #[error("{host} ({address}) refused the key for account {account:?}")]
    AuthFailed { host: String, address: String, account: String },
    #[error("the private key of {host} cannot be used: {reason}")]
    BadKey { host: String, reason: String },
    #[error("the host key {0:?} is not an OpenSSH public key")]
    BadHostKey(String),
}

impl postern_core::ErrorCode for SshError {
    fn code(&self) -> &'static str {
        match self {
            SshError::HostKeyMismatch { .. } => "host_key_mismatch",
            SshError::Unreachable { .. } => "ssh_unreachable",
            SshError::AuthFailed { .. } => "ssh_auth_failed",
            SshError::BadKey { .. } => "ssh_bad_key",
            SshError::BadHostKey(_) => "ssh_bad_host_key",
        }
    }
}

/// Decodes a private key (OpenSSH or PEM; Ed25519, ECDSA, RSA), with its passphrase if it has
/// one. Used when a host is added (to refuse a wrong passphrase then) and for every connection.
pub fn decode_key(text: &str, passphrase: Option<&str>) -> Result<PrivateKey, String> {
    russh::keys::decode_secret_key(text, passphrase).map_err(|e| match (e, passphrase) {
        (russh::keys::Error::KeyIsEncrypted, None) => "the key is encrypted: give its passphrase".to_owned(),
        (e, _) => e.to_string(),
    })
}

/// Parses an OpenSSH public key line and returns it with its `SHA256:` fingerprint.
pub fn host_key(line: &str) -> Result<(PublicKey, String), SshError> {
    let key = PublicKey::from_openssh(line.trim()).map_err(|_| SshError::BadHostKey(line.trim().to_owned()))?;
    let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
    Ok((key, fingerprint))
}

/// A key's `SHA256:` fingerprint, as pinned and shown.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

struct Client {
    pinned: Option<PublicKey>,
    presented: Arc<Mutex<Option<PublicKey>>>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            return Ok(false);
        };
        if let Ok(mut seen) = self.presented.lock() {
            *seen = Some(key.clone());
        }
        Ok(match &self.pinned {
            Some(pinned) => pinned.key_data() == key.key_data(),
            None => true,
        })
    }
}

/// An authenticated connection, and the host key it presented.
pub struct Connection {
    handle: Handle<Client>,
    pub presented: PublicKey,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("presented", &fingerprint(&self.presented)).finish_non_exhaustive()
    }
}

/// Connects, checks the host key (a pinned key must match; an `accept-new` host without a pin
/// accepts the first key, which the caller pins once this returns), and authenticates.
pub async fn connect(
    host: &SshHost,
    key: &Sensitive<String>,
    passphrase: Option<&Sensitive<String>>,
) -> Result<Connection, SshError> {
    let address = format!("{}:{}", host.address, host.port);
    let unreachable =
        |reason: String| SshError::Unreachable { host: host.name.clone(), address: address.clone(), reason };
    let private = decode_key(key.expose(), passphrase.map(|p| p.expose().as_str()))
        .map_err(|reason| SshError::BadKey { host: host.name.clone(), reason })?;
    let pinned = match (&host.host_key, host.policy) {
        (Some(line), _) => Some(host_key(line)?.0),
        (None, HostKeyPolicy::AcceptNew) => None,
        (None, HostKeyPolicy::Strict) => return Err(unreachable("strict host-key policy without a pinned key".into())),
    };
    let presented = Arc::new(Mutex::new(None));
    let client = Client { pinned: pinned.clone(), presented: Arc::clone(&presented) };
    let config = Arc::new(client::Config {
        keepalive_interval: Some(Duration::from_secs(15)),
        keepalive_max: 3,
        ..Default::default()
    });
    let connected =
        tokio::time::timeout(CONNECT_TIMEOUT, client::connect(config, (host.address.as_str(), host.port), client))
            .await
            .map_err(|_| unreachable(format!("no SSH handshake within {} s", CONNECT_TIMEOUT.as_secs())))?;
    let seen = presented.lock().ok().and_then(|s| s.clone());
    let mut handle = match connected {
        Ok(handle) => handle,
        Err(e) => {
            return Err(match (&pinned, &seen) {
                (Some(pinned), Some(seen)) if pinned.key_data() != seen.key_data() => SshError::HostKeyMismatch {
                    host: host.name.clone(),
                    address: address.clone(),
                    pinned: fingerprint(pinned),
                    presented: fingerprint(seen),
                },
                _ => unreachable(e.to_string()),
            });
        }
    };
    let presented = seen.ok_or_else(|| unreachable("the server presented no host key".into()))?;
    let hash = handle.best_supported_rsa_hash().await.ok().flatten().flatten();
    let auth = tokio::time::timeout(
        CONNECT_TIMEOUT,
        handle.authenticate_publickey(&host.account, PrivateKeyWithHashAlg::new(Arc::new(private), hash)),
    )
    .await
    .map_err(|_| unreachable("authentication timed out".into()))?
    .map_err(|e| unreachable(e.to_string()))?;
    if !auth.success() {
        return Err(SshError::AuthFailed { host: host.name.clone(), address, account: host.account.clone() });
    }
    Ok(Connection { handle, presented })
}

impl Connection {
    /// Runs `command` (already wrapped) and collects its output up to `cap` bytes. On timeout the
    /// command is asked to end twice over: an RFC 4254 `signal` request (which OpenSSH refuses
    /// for sessions without privilege separation, e.g. root's) and `kill_command` on a second
    /// channel, which signals the wrapper by the pid it recorded.
    pub async fn exec(&self, command: &str, timeout: Duration, cap: usize, kill_command: Option<&str>) -> SshSent {
        let started = Instant::now();
        let mut channel = match self.handle.channel_open_session().await {
            Ok(c) => c,
            Err(e) => {
                return SshSent::NotSent {
                    code: "ssh_channel_refused",
                    reason: format!("could not open a session: {e}"),
                };
            }
        };
        if let Err(e) = channel.exec(true, command.as_bytes()).await {
            // The request could not be queued: the session is gone, nothing went out for it.
            return SshSent::NotSent { code: "ssh_exec_not_sent", reason: format!("the exec request failed: {e}") };
        }
        let mut out = Output::new(cap);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut timed_out = None;
        loop {
            let msg = tokio::select! {
                msg = channel.wait() => msg,
                () = tokio::time::sleep_until(deadline), if timed_out.is_none() => {
                    // Ask the host to end the command (RFC 4254 signal), give it a moment, then
                    // close the channel. Which of the two happened is recorded.
                    let _ = channel.signal(Sig::TERM).await;
                    if let Some(kill) = kill_command
                        && let Ok(killer) = self.handle.channel_open_session().await
                    {
                        let _ = killer.exec(false, kill.as_bytes()).await;
                    }
                    timed_out = Some("timeout: sent TERM to the remote command".to_owned());
                    let grace = tokio::time::sleep(TERM_GRACE);
                    tokio::pin!(grace);
                    loop {
                        tokio::select! {
                            msg = channel.wait() => match msg {
                                Some(m) => { if out.take(m) { break; } }
                                None => break,
                            },
                            () = &mut grace => {
                                let _ = channel.close().await;
                                timed_out = Some(
                                    "timeout: sent TERM; the command did not end within 2 s and the channel was closed \
                                     (the command may still be running on the host)".into());
                                break;
                            }
                        }
                    }
                    break;
                }
            };
            match msg {
                Some(m) => {
                    if out.take(m) {
                        break;
                    }
                }
                None => break,
            }
        }
        if out.exit_status.is_none() && out.exit_signal.is_none() {
            if timed_out.is_some() {
                return SshSent::Finished { result: out.result(timed_out), elapsed: started.elapsed() };
            }
            return SshSent::Unknown {
                reason: "the connection closed after the command was sent and before its exit status arrived".into(),
            };
        }
        SshSent::Finished { result: out.result(timed_out), elapsed: started.elapsed() }
    }

    /// The session has ended (the server closed it, keepalives went unanswered, or it was cut).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    pub async fn close(self) {
        let _ = self.handle.disconnect(russh::Disconnect::ByApplication, "", "en").await;
    }
}

/// Output collected under a cap, and how the command ended.
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cap: usize,
    truncated: bool,
    exit_status: Option<u32>,
    exit_signal: Option<String>,
}

impl Output {
    fn new(cap: usize) -> Self {
        Output { stdout: Vec::new(), stderr: Vec::new(), cap, truncated: false, exit_status: None, exit_signal: None }
    }

    /// Takes one message; `true` when the channel is done.
    fn take(&mut self, msg: ChannelMsg) -> bool {
        match msg {
            ChannelMsg::Data { data } => self.append(false, &data),
            ChannelMsg::ExtendedData { data, ext: 1 } => self.append(true, &data),
            ChannelMsg::ExitStatus { exit_status } => self.exit_status = Some(exit_status),
            ChannelMsg::ExitSignal { signal_name, .. } => self.exit_signal = Some(signal_name_of(&signal_name)),
            ChannelMsg::Close => return true,
            _ => {}
        }
        false
    }

    fn append(&mut self, stderr: bool, data: &[u8]) {
        let room = self.cap.saturating_sub(self.stdout.len() + self.stderr.len());
        if data.len() > room {
            self.truncated = true;
        }
        let kept = &data[..data.len().min(room)];
        if stderr { self.stderr.extend_from_slice(kept) } else { self.stdout.extend_from_slice(kept) }
    }

    fn result(self, timed_out: Option<String>) -> SshResult {
        SshResult {
            exit_status: self.exit_status,
            exit_signal: self.exit_signal,
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            truncated: self.truncated,
            timed_out,
            from_marker: false,
            secret_echoed: false,
            result_too_large: None,
        }
    }
}

fn signal_name_of(sig: &Sig) -> String {
    match sig {
        Sig::Custom(name) => name.clone(),
        other => format!("{other:?}"),
    }
}

/// Where a command without the marker protocol records its wrapper's pid (for the timeout).
fn pid_file(id: ExecutionId) -> String {
    format!("${{TMPDIR:-/tmp}}/postern-{id}.pid")
}

/// The remote command for an execution without the marker protocol: a wrapper that records its
/// pid (so a timeout can end it), `cd`, the command in the background with TERM passed on.
pub fn plain_command(id: ExecutionId, working_dir: Option<&str>, command: &str) -> String {
    let script = format!(
        r#"p="{pid}"
echo $$ > "$p"
{run}rm -f "$p"
exit $status"#,
        pid = pid_file(id),
        run = run_child(working_dir, command),
    );
    format!("sh -c {}", shell_quote(&script))
}

/// Signals the wrapper of execution `id` (by the pid it recorded) to end its command.
pub fn kill_command(marker_root: Option<&str>, id: ExecutionId) -> String {
    let file = match marker_root {
        Some(root) => format!("{root}/{id}/started"),
        None => pid_file(id),
    };
    let script = format!(r#"[ -f "{file}" ] && kill -TERM $(cut -d' ' -f1 "{file}")"#);
    format!("sh -c {}", shell_quote(&script))
}

/// The marker protocol's wrapper (docs/src/guide/ssh.md). It creates the execution's
/// directory atomically (`mkdir` fails if it exists, so an execution runs at most once), records
/// `started` (the wrapper's pid and the time) before the command starts, runs the command in the
/// background so a TERM can be passed on, and records `finished` (exit status and time) by
/// rename, so a reader sees a whole record or none.
pub fn marker_command(root: &str, id: ExecutionId, working_dir: Option<&str>, command: &str) -> String {
    let script = format!(
        r#"d="{root}/{id}"
mkdir -p "{root}" || {{ echo "postern-marker: cannot create {root}" >&2; exit 125; }}
mkdir "$d" 2>/dev/null || {{ echo "postern-marker: exists: $d (this execution already ran or is running; not running it again)" >&2; exit 125; }}
echo "$$ $(date +%s)" > "$d/started"
{run}echo "$status $(date +%s)" > "$d/finished.tmp" && mv "$d/finished.tmp" "$d/finished"
exit $status"#,
        run = run_child(working_dir, command),
    );
    format!("sh -c {}", shell_quote(&script))
}

/// The part both wrappers share: `cd`, the command in the background (stdin closed), TERM/INT/
/// HUP passed on to it, and its exit status in `$status` once it has really ended.
fn run_child(working_dir: Option<&str>, command: &str) -> String {
    let cd = working_dir.map_or(String::new(), |d| format!("cd {} || exit 126\n", shell_quote(d)));
    format!(
        "{cd}sh -c {} </dev/null &\nchild=$!\ntrap 'kill -TERM $child 2>/dev/null' TERM INT HUP\nwait $child\n\
         status=$?\nwhile kill -0 $child 2>/dev/null; do wait $child; status=$?; done\n",
        shell_quote(command)
    )
}

/// What the marker on the host says about an execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// No directory: the command never started; the execution may be dispatched again.
    Absent,
    /// The wrapper created the directory but did not get to record `started`.
    Created,
    Running {
        pid: u32,
        started_at: i64,
    },
    /// Started, not finished, and the wrapper's process is gone.
    Died {
        pid: u32,
        started_at: i64,
    },
    Finished {
        exit_status: u32,
        finished_at: i64,
    },
}

/// The read-only command that reports an execution's marker.
pub fn marker_probe(root: &str, id: ExecutionId) -> String {
    let script = format!(
        r#"d="{root}/{id}"
if [ -f "$d/finished" ]; then echo "finished $(cat "$d/finished")"
elif [ -f "$d/started" ]; then set -- $(cat "$d/started"); if kill -0 "$1" 2>/dev/null; then echo "running $1 $2"; else echo "died $1 $2"; fi
elif [ -d "$d" ]; then echo created
else echo absent
fi"#
    );
    format!("sh -c {}", shell_quote(&script))
}

/// Parses [`marker_probe`]'s answer.
pub fn parse_marker(line: &str) -> Option<Marker> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| words.get(i).and_then(|w| w.parse::<i64>().ok());
    // Seconds from the host, as milliseconds; a time no clock can show is refused (the answer
    // comes from a host that may be hostile: an overflow must not wrap into a plausible time).
    let millis = |i: usize| num(i)?.checked_mul(1000);
    match words.first().copied()? {
        "absent" => Some(Marker::Absent),
        "created" => Some(Marker::Created),
        "running" => Some(Marker::Running { pid: u32::try_from(num(1)?).ok()?, started_at: millis(2)? }),
        "died" => Some(Marker::Died { pid: u32::try_from(num(1)?).ok()?, started_at: millis(2)? }),
        "finished" => Some(Marker::Finished { exit_status: u32::try_from(num(1)?).ok()?, finished_at: millis(2)? }),
        _ => None,
    }
}

/// What a clean-up of a host's marker directories did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MarkerGc {
    /// Removed: their executions are settled (the outcome is on record).
    pub removed: u64,
    /// Kept: their executions are unsettled (dispatched, uncertain, under review, not executed):
    /// the marker is how such a command is checked without running it again.
    pub kept_unsettled: u64,
    /// Kept: this journal has no such execution (another installation's, or a journal lost).
    pub kept_unknown: u64,
}

/// An execution whose outcome is on record: nothing will ever read its marker again.
fn settled(state: postern_core::ExecutionState) -> bool {
    use postern_core::ExecutionState as S;
    matches!(
        state,
        S::Completed | S::CompletedResultNotDelivered | S::ResultDelivered | S::FailedBeforeDispatch | S::Denied
    )
}

/// Removes, on SSH host `name`, the marker directories older than `days` whose executions the
/// journal at `view` shows settled; every other one is kept, whatever its age.
pub async fn marker_gc_on(
    vault: &postern_vault::Vault,
    view: &postern_store::JournalView,
    name: &str,
    days: u32,
) -> Result<MarkerGc, String> {
    let host = vault.ssh_host(name).map_err(|e| e.to_string())?;
    let (key, passphrase) = vault.ssh_key_of(&host).map_err(|e| e.to_string())?;
    let connection = connect(&host, &key, passphrase.as_ref()).await.map_err(|e| e.to_string())?;
    let listed = connection.exec(&marker_list(&host.marker_root, days), Duration::from_secs(120), 1 << 20, None).await;
    let names = match listed {
        SshSent::Finished { result, .. } if result.exit_status == Some(0) => result.stdout,
        other => {
            connection.close().await;
            return Err(format!("the marker listing on {name} did not finish: {}", other.summary()));
        }
    };
    let mut report = MarkerGc::default();
    let mut remove = Vec::new();
    // What the host lists is outside text: only names that are execution IDs are considered.
    for id in names.lines().filter_map(|line| line.trim().parse::<ExecutionId>().ok()) {
        // From the chain, not the projection: a forged `executions` row cannot get a marker
        // removed.
        let state = view
            .journal_state(id)
            .map_err(|e| e.to_string())?
            .and_then(|state| state.parse::<postern_core::ExecutionState>().ok());
        match state {
            Some(state) if settled(state) => remove.push(id),
            Some(_) => report.kept_unsettled += 1,
            None => report.kept_unknown += 1,
        }
    }
    for chunk in remove.chunks(200) {
        let sent =
            connection.exec(&marker_remove(&host.marker_root, chunk), Duration::from_secs(120), 4096, None).await;
        match sent {
            SshSent::Finished { result, .. } if result.exit_status == Some(0) => report.removed += chunk.len() as u64,
            other => {
                connection.close().await;
                return Err(format!("the clean-up on {name} did not finish: {}", other.summary()));
            }
        }
    }
    connection.close().await;
    Ok(report)
}

/// Lists (one per line) the names of the marker directories under `root` older than `days`.
pub fn marker_list(root: &str, days: u32) -> String {
    let script = format!(
        r#"[ -d "{root}" ] || exit 0
find "{root}" -mindepth 1 -maxdepth 1 -type d -name 'act_*' -mtime +{days} | while read -r d; do echo "${{d##*/}}"; done"#
    );
    format!("sh -c {}", shell_quote(&script))
}

/// Removes the marker directories of `ids` under `root` (each an execution ID: nothing else
/// reaches the command).
pub fn marker_remove(root: &str, ids: &[ExecutionId]) -> String {
    let paths: Vec<String> = ids.iter().map(|id| format!("\"{root}/{id}\"")).collect();
    let script = format!("rm -rf -- {}", paths.join(" "));
    format!("sh -c {}", shell_quote(&script))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_every_quote() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", shell_quote("a'b\"c $HOME `x` \\")))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "a'b\"c $HOME `x` \\");
    }

    /// The probe's answer comes from the host: a time beyond what milliseconds can hold is
    /// refused instead of wrapping into a plausible one (fuzz target `marker`, with overflow
    /// checks on).
    #[test]
    fn a_hostile_marker_answer_is_refused_not_wrapped() {
        assert_eq!(parse_marker("finished 0 9223372036854775807"), None);
        assert_eq!(parse_marker("running 7 -9223372036854775808"), None);
        assert_eq!(parse_marker("died 4294967296 1"), None, "not a pid");
        assert_eq!(
            parse_marker("finished 3 1764445000"),
            Some(Marker::Finished { exit_status: 3, finished_at: 1_764_445_000_000 })
        );
    }

    proptest::proptest! {
        /// Any line at all: parsed or refused, never a panic.
        #[test]
        fn any_probe_answer_parses_or_is_refused(line in "\\PC{0,60}|(absent|created|running|died|finished)( -?[0-9]{1,21}){0,3}") {
            let _ = parse_marker(&line);
        }
    }

    #[test]
    fn the_marker_wrapper_runs_once_and_records_start_and_finish() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("markers");
        let root = root.to_str().unwrap();
        let id: ExecutionId = "act_01JB8K8Z7Q7W6T2J0N5RZ1X2Y3".parse().unwrap();
        let file = dir.path().join("ran");
        let command = format!("echo once >> {} && exit 3", shell_quote(file.to_str().unwrap()));
        let wrapped = marker_command(root, id, Some("/"), &command);
        let first = std::process::Command::new("sh").arg("-c").arg(&wrapped).output().unwrap();
        assert_eq!(first.status.code(), Some(3));
        let second = std::process::Command::new("sh").arg("-c").arg(&wrapped).output().unwrap();
        assert_eq!(second.status.code(), Some(125));
        assert!(String::from_utf8_lossy(&second.stderr).contains("postern-marker: exists"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "once\n", "the command ran exactly once");
        let probe = std::process::Command::new("sh").arg("-c").arg(marker_probe(root, id)).output().unwrap();
        let marker = parse_marker(&String::from_utf8_lossy(&probe.stdout)).unwrap();
        assert!(matches!(marker, Marker::Finished { exit_status: 3, .. }), "{marker:?}");
        let other: ExecutionId = "act_01JB8K8Z7Q7W6T2J0N5RZ1X2Y4".parse().unwrap();
        let probe = std::process::Command::new("sh").arg("-c").arg(marker_probe(root, other)).output().unwrap();
        assert_eq!(parse_marker(&String::from_utf8_lossy(&probe.stdout)), Some(Marker::Absent));
    }
}
