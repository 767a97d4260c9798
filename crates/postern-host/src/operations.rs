//! The operations the CLI (and later the app) performs on a data directory — agents, the vault's
//! credentials, SSH hosts and MCP servers, the lock, checkpoints — with one route chosen once:
//! the journal itself when no gateway holds it, else the running gateway's control socket, with
//! the same answer either way. Operations that grant authority (unlocking, approvals, grants)
//! are not among them: the socket refuses them.

use crate::HostError;
use postern_core::Timestamp;
use postern_engine::channel::upstream::{ToolOverride, Upstreams};
use postern_gateway::{
    caller::identity::ProcessKey,
    caller::provenance::Provenance,
    door::control::{self, Authority, ControlCode, ControlOp, ControlReply, ControlRequest},
};
use postern_store::Store;
use postern_vault::{OsKeychain, Vault};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

/// Per upstream server, per tool: the contract overrides of the manifest a local route uses.
pub type Overrides = BTreeMap<String, BTreeMap<String, ToolOverride>>;

/// Where an operation goes.
#[derive(Debug)]
pub enum Route {
    /// No gateway holds the journal: this process opens it.
    Local(Arc<Store>),
    /// A gateway holds it: its control socket in this data directory.
    Gateway(PathBuf),
}

impl Route {
    /// The route for `data_dir`: the journal if it can be opened, the gateway if one holds it.
    pub fn of(data_dir: &Path, now: Timestamp) -> Result<Route, HostError> {
        match crate::open_journal(data_dir, now) {
            Ok((store, _)) => Ok(Route::Local(store)),
            Err(HostError::InUse { .. }) => Ok(Route::Gateway(data_dir.to_owned())),
            Err(e) => Err(e),
        }
    }

    /// Carries out `request` the same way whichever the route: the answer is the control
    /// protocol's (`Done`, an answer, or `Refused` with a code and a message).
    pub fn perform(&self, request: ControlRequest, now: Timestamp) -> ControlReply {
        self.perform_with(request, now, &Overrides::new())
    }

    /// [`Route::perform`] where a local route starts upstream servers itself (`servers.tools`,
    /// `servers.contract`): with the contract overrides of the manifest the command found. A
    /// gateway uses its own.
    pub fn perform_with(&self, request: ControlRequest, now: Timestamp, overrides: &Overrides) -> ControlReply {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => return refused(format!("cannot start the runtime: {e}")),
        };
        match self {
            Route::Local(store) => {
                let vault = if request.needs_vault() {
                    let opened = OsKeychain::connect()
                        .and_then(|keychain| Vault::open(Arc::clone(store), Arc::new(keychain), now));
                    match opened {
                        Ok(v) => Some(Arc::new(v)),
                        Err(e) => return refused(e.to_string()),
                    }
                } else {
                    None
                };
                // Only a contract check or a tool listing starts a server in this process; without
                // upstreams, status says nothing runs and restart says no gateway runs.
                let starts = matches!(request.op(), ControlOp::SetToolContract | ControlOp::ServerTools);
                let upstreams = vault.as_ref().filter(|_| starts).map(|v| {
                    Arc::new(Upstreams::new(Arc::clone(v), overrides.clone(), postern_engine::engine::system_clock()))
                });
                let authority = Authority {
                    store: Arc::clone(store),
                    vault,
                    upstreams,
                    gateway: None,
                    approver: None,
                    approval_timeout: postern_engine::engine::DEFAULT_APPROVAL_TIMEOUT,
                    change_question: Authority::one_change_question(),
                };
                // This process is the one asking: traced like a control socket's peer, against the
                // agent runs the journal shows open (their process still alive).
                let from = this_process(store);
                runtime.block_on(async {
                    let reply = control::apply(&authority, request, now, &from).await;
                    if let Some(u) = &authority.upstreams {
                        u.stop_all().await;
                    }
                    reply
                })
            }
            Route::Gateway(data_dir) => runtime.block_on(control::request(data_dir, &request)).unwrap_or_else(|e| {
                refused(format!("the journal is held by a running gateway, and its control socket did not answer: {e}"))
            }),
        }
    }
}

/// This process and its ancestry, traced against the agent runs `store`'s journal shows open: a
/// command that opened the journal itself is checked like a control socket's peer.
pub fn this_process(store: &Store) -> Provenance {
    // The open runs, read once (the walk asks about every ancestor).
    let open: Vec<_> =
        store.view().sessions().unwrap_or_default().into_iter().filter(|s| s.ended_at.is_none()).collect();
    let run_of = |key: &ProcessKey| {
        open.iter()
            .find(|s| s.pid == Some(i64::from(key.pid)) && s.process_start == Some(key.start_ticks as i64))
            .map(|s| s.id.clone())
    };
    Provenance::of(Some(std::process::id()), &run_of)
}

fn refused(message: String) -> ControlReply {
    ControlReply::Refused { code: ControlCode::Failed, message }
}
