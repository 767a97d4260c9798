//! The operations the CLI (and later the app) performs on a data directory — add or revoke an
//! agent token, revoke an agent run, lock the vault — with one route chosen once: the journal
//! itself when no gateway holds it, else the running gateway's control socket. Operations that
//! grant authority (unlocking, approvals, grants) are not among them: the socket refuses them.

use crate::HostError;
use postern_core::Timestamp;
use postern_gateway::control::{self, ControlCode, ControlReply, ControlRequest};
use postern_store::Store;
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

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
    /// protocol's (`Done`, or `Refused` with a code and a message).
    pub fn perform(&self, request: ControlRequest, now: Timestamp) -> ControlReply {
        match self {
            Route::Local(store) => control::apply(store, request, now),
            Route::Gateway(data_dir) => {
                let asked = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .and_then(|runtime| runtime.block_on(control::request(data_dir, &request)));
                asked.unwrap_or_else(|e| ControlReply::Refused {
                    code: ControlCode::Failed,
                    message: format!(
                        "the journal is held by a running gateway, and its control socket did not answer: {e}"
                    ),
                })
            }
        }
    }
}
