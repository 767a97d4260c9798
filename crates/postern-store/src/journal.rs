//! The shape of one journal row and the hash chain that links rows together (design §7).

use postern_core::{
    ExecutionId, ExecutionState, SessionId, Timestamp, canonical::canonical_bytes_of,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;

/// The hash the first row chains from.
pub const GENESIS: [u8; 32] = [0; 32];

/// Version of the row layout inside `body`.
pub const ROW_VERSION: u32 = 1;

/// `row_hash = SHA-256(prev_row_hash ‖ canonical(row))`.
pub fn chain_hash(prev: &[u8; 32], body: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(body);
    h.finalize().into()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Lifecycle and approval events of executions.
    Activity,
    /// Agent runs starting and ending.
    Session,
}

/// One journal row as chained. Its canonical JSON is the `body` column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalRow {
    pub v: u32,
    pub seq: u64,
    pub at: Timestamp,
    pub stream: Stream,
    /// A lifecycle state name (`dispatched`, …) or another event (`retry_received`,
    /// `session_started`, `session_ended`).
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<ExecutionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The execution's state after this row (activity stream only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ExecutionState>,
    pub detail: Value,
}

impl JournalRow {
    pub fn canonical(&self) -> Result<Vec<u8>, postern_core::CanonicalError> {
        canonical_bytes_of(self)
    }
}

/// A row read back, with its chain hash.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JournalEntry {
    #[serde(flatten)]
    pub row: JournalRow,
    pub row_hash: HashHex,
}

/// The end of the chain: how many rows, and the last row's hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalHead {
    pub size: u64,
    pub hash: HashHex,
}

impl JournalHead {
    pub const EMPTY: JournalHead = JournalHead {
        size: 0,
        hash: HashHex(GENESIS),
    };
}

/// A SHA-256 shown as `sha256:<hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashHex(pub [u8; 32]);

impl fmt::Display for HashHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for HashHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for HashHex {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let hex_part = s
            .strip_prefix("sha256:")
            .ok_or("hash must start with sha256:")?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out)
            .map_err(|e| format!("hash is not 64 hex digits: {e}"))?;
        Ok(HashHex(out))
    }
}

impl Serialize for HashHex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HashHex {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}
