//! Did the result reach the agent? A tool result is journaled `result_delivered` only once the
//! transport handed its bytes to the client's connection, and `completed_result_not_delivered`
//! when the connection was gone first (design §3), so a later retry is answered from the record.
//!
//! A [`DeliveryTicket`] travels with one response. The MCP handler registers the executions
//! whose outcome it carries; the transport settles the ticket when it wrote the response
//! (`delivered`) or lost it (`lost`, or dropped unsettled). Whichever happens second journals.

use crate::Engine;
use postern_core::ExecutionId;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
enum Slot {
    /// The response is not written yet; these executions ride on it.
    Open(Vec<ExecutionId>),
    /// The transport settled before the handler registered: `true` if it was written.
    Settled(bool),
}

/// One response's delivery, shared by the handler (which knows the execution) and the
/// transport (which knows whether the bytes went out).
#[derive(Debug, Clone)]
pub struct DeliveryTicket {
    slot: Arc<Mutex<Slot>>,
    engine: Arc<Engine>,
}

impl DeliveryTicket {
    pub fn new(engine: Arc<Engine>) -> Self {
        DeliveryTicket { slot: Arc::new(Mutex::new(Slot::Open(Vec::new()))), engine }
    }

    /// The handler's side: this response carries execution `id`'s outcome.
    pub fn carries(&self, id: ExecutionId) {
        let settled = match self.slot.lock() {
            Ok(mut slot) => match &mut *slot {
                Slot::Open(ids) => {
                    ids.push(id);
                    None
                }
                Slot::Settled(written) => Some(*written),
            },
            Err(_) => Some(false),
        };
        if let Some(written) = settled {
            self.record(vec![id], written);
        }
    }

    /// The executions whose outcome rides on this response (so far).
    pub fn carried(&self) -> Vec<ExecutionId> {
        match self.slot.lock().as_deref() {
            Ok(Slot::Open(ids)) => ids.clone(),
            _ => Vec::new(),
        }
    }

    /// The transport's side: the response was handed to the connection (`true`) or could not be
    /// (`false`). Only the first settlement counts.
    pub fn settle(&self, written: bool) {
        let ids = match self.slot.lock() {
            Ok(mut slot) => match std::mem::replace(&mut *slot, Slot::Settled(written)) {
                Slot::Open(ids) => ids,
                first @ Slot::Settled(_) => {
                    *slot = first;
                    return;
                }
            },
            Err(_) => return,
        };
        if !ids.is_empty() {
            self.record(ids, written);
        }
    }

    fn record(&self, ids: Vec<ExecutionId>, written: bool) {
        let engine = Arc::clone(&self.engine);
        let journal = async move {
            for id in ids {
                if let Err(e) = engine.delivered(id, written).await {
                    tracing::error!(execution = %id, error = %e, "could not journal delivery");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(journal);
            }
            Err(_) => tracing::error!("delivery settled outside the runtime; not journaled"),
        }
    }
}
