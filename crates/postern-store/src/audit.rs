//! Offline audit: recompute the journal's hash chain from the database file alone, name the
//! first row that does not verify and why, compare the head with an exported checkpoint, and
//! check the projections (current execution states, stored results) against the journal.
//!
//! What the chain can and cannot prove: any change, deletion, reordering or insertion inside
//! the journal is detected. Rewriting the whole chain from some row onwards, or cutting rows off
//! the end, is only detectable against a checkpoint kept somewhere else.

use crate::{
    StoreError,
    journal::{GENESIS, HashHex, JournalHead, chain_hash, scan_head},
    view::open_checked,
};
use postern_core::merkle::{Frontier, Hash, Subtree, TreeHead};
use postern_core::{ExecutionState, Timestamp};
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::{collections::HashMap, fmt, path::Path, sync::mpsc};

mod rows;
use rows::{check_projection, check_results, fold_differences, fold_reads, key_text, unknown_events};

/// A checkpoint as the writer records it: the chain's head (the JSON [`Checkpoint`]) and the
/// Merkle tree's head (what a signed note carries) at the same size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpointed {
    pub journal: Checkpoint,
    /// The tree's head, or why the journal has no tree to sign (it was edited behind the
    /// writer: `audit verify` says how).
    pub tree: Result<TreeHead, String>,
}

/// What a checkpoint handed to [`verify`] says the journal was: a chain head (the JSON format)
/// or a Merkle tree head (a C2SP checkpoint note).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    Chain(Checkpoint),
    Tree(TreeHead),
}

impl Claim {
    /// The journal size it speaks of.
    pub fn size(&self) -> u64 {
        match self {
            Claim::Chain(cp) => cp.journal_size,
            Claim::Tree(t) => t.size,
        }
    }
}

/// A journal head exported for safekeeping outside the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub format: String,
    pub journal_size: u64,
    pub head_hash: HashHex,
    pub created_at: Timestamp,
    /// Ed25519 signature (hex) over [`Checkpoint::signed_bytes`], made with the installation's
    /// journal-signing key from the keychain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// The signer's public key (hex). Informative only: a verifier must compare it with a key it
    /// already trusts (`--pubkey`), since anyone can sign with a key of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

impl Checkpoint {
    pub const FORMAT: &'static str = "postern-checkpoint/1";

    pub fn new(head: JournalHead, at: Timestamp) -> Self {
        Checkpoint {
            format: Self::FORMAT.into(),
            journal_size: head.size,
            head_hash: head.hash,
            created_at: at,
            signature: None,
            public_key: None,
        }
    }

    /// What the signature covers: the RFC 8785 bytes of format, size, head hash and time.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let unsigned = serde_json::json!({
            "format": self.format,
            "journal_size": self.journal_size,
            "head_hash": self.head_hash,
            "created_at": self.created_at,
        });
        // Sizes and millisecond times are far below 2^53; this cannot fail.
        postern_core::canonical_bytes(&unsigned).unwrap_or_default()
    }

    /// Parses an exported checkpoint file, with a message naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let cp: Checkpoint = serde_json::from_str(text).map_err(|e| format!("not a Postern checkpoint: {e}"))?;
        if cp.format != Self::FORMAT {
            return Err(format!("unsupported checkpoint format {:?} (expected {:?})", cp.format, Self::FORMAT));
        }
        Ok(cp)
    }
}

/// One thing that does not verify.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The row's content (or its stored hash) changed after it was appended.
    Modified { seq: u64, why: String },
    /// Rows `from..=to` are gone.
    Missing { from: u64, to: u64 },
    /// The row at `position` was appended as row `found_seq`, and the row appended at
    /// `position` appears later: rows were swapped or moved.
    Reordered { position: u64, found_seq: u64 },
    /// A row that was never appended by Postern sits at `position`; the rows after it are
    /// shifted by one.
    Inserted { position: u64 },
    /// The journal is shorter than an exported checkpoint says it was.
    Truncated { journal_size: u64, checkpoint_size: u64 },
    /// The journal's row at the checkpoint's size does not have the checkpointed hash: history
    /// up to that point was rewritten.
    HeadDiffers { seq: u64, checkpoint: HashHex, journal: HashHex },
    /// The Merkle tree the rows make has another root at the checkpoint's size: history up to
    /// that point was rewritten.
    RootDiffers { size: u64, checkpoint: String, journal: String },
    /// A kept node of the Merkle tree does not hash the rows under it, is missing, or is one too
    /// many: the tree was edited behind the journal's back (proofs read the rows, so they fail).
    TreeDiffers { why: String },
    /// `executions` says one state, the journal another.
    ProjectionMismatch { execution_id: String, projection: String, journal: Option<String> },
    /// The journal has an execution that `executions` lacks.
    ProjectionMissing { execution_id: String },
    /// A stored result does not match the digest journaled when it was recorded.
    ResultMismatch { execution_id: String, why: String },
    /// Row `seq` chains, but its event is not one its stream has: a row moved to another stream
    /// or renamed (a granting row hidden from the authority view), or written by another version.
    UnknownEvent { seq: u64, stream: String, event: String },
    /// Row `seq` chains, but it is a folded row (a read-only call's steps up to its dispatch in
    /// its `accepted` row) whose steps are not a lifecycle ending where the row says.
    FoldDiffers { seq: u64, why: String },
    /// Row `seq` chains, but it puts its execution in a state the lifecycle does not allow from
    /// where its earlier rows left it (`from`: none when it has no `accepted` row before): a step
    /// the state machine refuses, or a note that says another state than the steps left.
    StepRefused { seq: u64, execution_id: String, from: Option<String>, to: String },
    /// A table that grants authority (lock, credentials, agents, session grants, allowlist)
    /// differs from what the journal says.
    AuthorityMismatch { table: String, key: String, journal: String, table_value: String },
}

impl Finding {
    /// Findings about the chain itself (as opposed to the projections).
    pub fn is_chain(&self) -> bool {
        matches!(
            self,
            Finding::Modified { .. }
                | Finding::Missing { .. }
                | Finding::Reordered { .. }
                | Finding::Inserted { .. }
                | Finding::Truncated { .. }
                | Finding::HeadDiffers { .. }
                | Finding::RootDiffers { .. }
                | Finding::TreeDiffers { .. }
        )
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Modified { seq, why } => write!(f, "row {seq}: modified ({why})"),
            Finding::Missing { from, to } if from == to => {
                write!(f, "row {from}: missing (deleted)")
            }
            Finding::Missing { from, to } => write!(f, "rows {from}..{to}: missing (deleted)"),
            Finding::Reordered { position, found_seq } => write!(
                f,
                "row {position}: reordered (this position holds the row appended as {found_seq}; row {position} appears later)"
            ),
            Finding::Inserted { position } => write!(
                f,
                "row {position}: inserted (a row Postern never appended sits here; the rows after it are shifted by one)"
            ),
            Finding::Truncated { journal_size, checkpoint_size } => write!(
                f,
                "journal truncated: it ends at row {journal_size} but the checkpoint covers {checkpoint_size} rows"
            ),
            Finding::HeadDiffers { seq, checkpoint, journal } => write!(
                f,
                "row {seq}: chain head differs from the checkpoint (checkpoint {checkpoint}, journal {journal}); history was rewritten"
            ),
            Finding::RootDiffers { size, checkpoint, journal } => write!(
                f,
                "row {size}: the Merkle tree's root differs from the checkpoint (checkpoint {checkpoint}, journal \
                 {journal}); history was rewritten"
            ),
            Finding::TreeDiffers { why } => write!(f, "Merkle tree: {why} (edited behind the journal's back)"),
            Finding::ProjectionMismatch { execution_id, projection, journal } => write!(
                f,
                "execution {execution_id}: current state says {projection:?} but the journal says {}",
                journal.as_deref().map_or("nothing".to_string(), |j| format!("{j:?}"))
            ),
            Finding::ProjectionMissing { execution_id } => {
                write!(f, "execution {execution_id}: in the journal but missing from the executions table")
            }
            Finding::ResultMismatch { execution_id, why } => {
                write!(f, "execution {execution_id}: stored result {why}")
            }
            Finding::UnknownEvent { seq, stream, event } => write!(
                f,
                "row {seq}: the {stream:?} stream has no event {event:?} (the row was moved or renamed, or \
                 written by another version; what it granted or took away is not known)"
            ),
            Finding::FoldDiffers { seq, why } => {
                write!(f, "row {seq}: a folded row that does not read as a lifecycle: {why}")
            }
            Finding::StepRefused { seq, execution_id, from, to } => write!(
                f,
                "row {seq}: execution {execution_id} is {to:?} here, where its earlier rows left it {}: its \
                 lifecycle does not allow that (written by a faulty build, or edited and chained again)",
                from.as_deref().map_or("nowhere (no accepted row before)".to_string(), |from| format!("{from:?}"))
            ),
            Finding::AuthorityMismatch { table, key, journal, .. } if table == "journal" && key != "chain" => write!(
                f,
                "journal {key} grants authority but cannot be read: {journal} (the journal was edited; \
                 nothing is re-derived from it)"
            ),
            Finding::AuthorityMismatch { table, key, journal, table_value } => write!(
                f,
                "table `{table}`, row {key:?}: the journal says {journal}, the table holds {table_value} \
                 (edited behind the journal's back; `postern audit rederive` rebuilds it)"
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub rows: u64,
    pub executions: u64,
    pub sessions: u64,
    pub head: JournalHead,
    pub checkpoint_checked: bool,
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    pub fn intact(&self) -> bool {
        self.findings.is_empty()
    }
}

const PROGRESS_EVERY: u64 = 1 << 14;

/// Verifies the database at `path` without writing to it. `progress(done, total)` is called
/// periodically. Errors are reserved for files that cannot be verified at all (missing, not a
/// Postern database, newer schema); tampering is reported in [`VerifyReport::findings`].
pub fn verify(
    path: &Path,
    checkpoint: Option<&Claim>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport, StoreError> {
    verify_with(path, checkpoint, VerifyScope::Full, progress)
}

/// How much `verify_with` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyScope {
    /// The chain, the checkpoint, and the projections (`executions`, `results`) against it.
    Full,
    /// The chain and the checkpoint only: faster on very large journals, but a forged current
    /// state or stored result is not noticed.
    ChainOnly,
}

pub fn verify_with(
    path: &Path,
    checkpoint: Option<&Claim>,
    scope: VerifyScope,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport, StoreError> {
    let conn = open_for_scan(path)?;
    // One read transaction: every query below sees the same snapshot, so a gateway writing
    // beside the verification (a commit between the chain walk and the projection check) can
    // never look like tampering. Read-only; ended when `conn` is dropped.
    conn.execute_batch("BEGIN DEFERRED")?;
    let total: u64 = conn.query_row("SELECT count(*) FROM journal", [], |r| r.get::<_, i64>(0))? as u64;
    let tree = Walk::Tree { root_at: checkpoint.map(Claim::size) };
    let (head, chain_finding, tally) = check_chain(&conn, total, scope, tree, progress)?;
    let mut findings: Vec<Finding> = chain_finding.into_iter().collect();
    let mut checkpoint_checked = false;
    if findings.is_empty()
        && let Some(claim) = checkpoint
    {
        checkpoint_checked = true;
        findings.extend(match claim {
            Claim::Chain(cp) => check_checkpoint(&conn, head, cp)?,
            Claim::Tree(t) => check_tree_head(head, t, tally.root_at),
        });
    }
    if findings.is_empty() {
        findings.extend(
            crate::merkle::differences(&conn, &tally.kept, head.size)?
                .into_iter()
                .map(|why| Finding::TreeDiffers { why }),
        );
    }
    if findings.is_empty() {
        findings.extend(unknown_events(&conn, &tally.unknown_events)?);
        findings.extend(fold_differences(&conn, &tally.bad_folds)?);
        findings.extend(tally.bad_steps.iter().map(|&(seq, key, from, to)| Finding::StepRefused {
            seq,
            execution_id: key_text(&key),
            from: from.map(|from| from.as_str().to_owned()),
            to: to.as_str().to_owned(),
        }));
    }
    // The projections are compared only with a journal that verified.
    if findings.is_empty() && scope == VerifyScope::Full {
        findings.extend(check_projection(&conn, tally.last_state)?);
        findings.extend(check_results(&conn, tally.result_digests)?);
        findings.extend(crate::authority::check(&conn)?.into_iter().map(|m| Finding::AuthorityMismatch {
            table: m.table.to_owned(),
            key: m.key,
            journal: m.journal,
            table_value: m.table_value,
        }));
    }
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).map(|n| n as u64);
    Ok(VerifyReport {
        rows: total,
        executions: count("SELECT count(*) FROM executions")?,
        sessions: count("SELECT count(*) FROM agent_sessions")?,
        head,
        checkpoint_checked,
        findings,
    })
}

/// How the chain on `conn` compares with `head`, the head the (only) writer last wrote: `None`
/// when it walks intact to exactly that head, or what differs. The writer runs this when another
/// process committed to the database: every row a retry decision reads is then known to be the
/// row this process wrote (a body edited and its hashes recomputed changes the head).
pub(crate) fn chain_differs(conn: &Connection, head: JournalHead) -> Result<Option<String>, StoreError> {
    let total: u64 = conn.query_row("SELECT count(*) FROM journal", [], |r| r.get::<_, i64>(0))? as u64;
    let (walked, finding, _) = check_chain(conn, total, VerifyScope::ChainOnly, Walk::ChainOnly, &mut |_, _| {})?;
    Ok(match finding {
        Some(f) => Some(f.to_string()),
        None if walked != head => Some(format!(
            "the journal ends at row {} ({}), where this process last wrote row {} ({})",
            walked.size, walked.hash, head.size, head.hash
        )),
        None => None,
    })
}

fn open_for_scan(path: &Path) -> Result<Connection, StoreError> {
    let conn = open_checked(path)?;
    // Read-only tuning: a large page cache and memory-mapped reads for sequential scans.
    conn.pragma_update(None, "cache_size", -65_536)?;
    conn.pragma_update(None, "mmap_size", 1i64 << 32)?;
    Ok(conn)
}

/// Rows read from SQLite and handed to the hashing thread in one piece.
#[derive(Default)]
struct Batch {
    seqs: Vec<u64>,
    /// Bodies back to back; `ends[i]` is where body `i` ends.
    bodies: Vec<u8>,
    ends: Vec<usize>,
    hashes: Vec<[u8; 32]>,
    /// Each row's head, parsed by the reader (trusted only once the row's hash verifies).
    facts: Vec<Option<Fact>>,
}

impl Batch {
    const ROWS: usize = 2048;

    fn clear(&mut self) {
        self.seqs.clear();
        self.bodies.clear();
        self.ends.clear();
        self.hashes.clear();
        self.facts.clear();
    }
}

/// Where the walk stopped, if it did not reach the end.
enum Break {
    /// Row `seq` came after `expected - 1`: the rows in between are gone.
    Gap { expected: u64, seq: u64 },
    /// Row `seq` does not chain from the previous row's stored hash, or its content was
    /// appended at another position.
    Mismatch { seq: u64, body: Vec<u8>, stored: [u8; 32] },
    /// Row `seq` chains, but Postern cannot read it (written by an incompatible version).
    Unreadable { seq: u64 },
}

/// An execution id's text as a fixed-size key (ids are always 30 ASCII characters).
type IdKey = [u8; 30];

fn id_key(id: &[u8]) -> Option<IdKey> {
    id.try_into().ok()
}

/// A row's head in compact owned form.
#[derive(Clone, Copy)]
struct Fact {
    seq: u64,
    execution: Option<(IdKey, ExecutionState)>,
    result_sha256: Option<[u8; 64]>,
    /// Its event is one its stream has.
    known_event: bool,
    /// A folded row whose steps do not read as a lifecycle ending at its state.
    bad_fold: bool,
    /// The state its event moves the execution to (`None`: a note, or another stream's row).
    step: Option<ExecutionState>,
}

impl Fact {
    fn position_only(seq: u64) -> Fact {
        Fact { seq, execution: None, result_sha256: None, known_event: true, bad_fold: false, step: None }
    }

    /// `None` when the head is missing or names a state or id Postern does not know.
    fn read(body: &[u8]) -> Option<Fact> {
        let head = scan_head(body)?;
        let execution = match (head.execution_id, head.state) {
            (Some(id), Some(state)) => Some((id_key(id)?, std::str::from_utf8(state).ok()?.parse().ok()?)),
            _ => None,
        };
        let result_sha256 = match head.result_sha256 {
            Some(sha) => Some(sha.try_into().ok()?),
            None => None,
        };
        let bad_fold = match (head.event, execution) {
            (b"accepted", Some((_, state))) if state != ExecutionState::Accepted => !fold_reads(body, state),
            _ => false,
        };
        let event = head.event();
        let step = match event {
            Some(crate::event::Event::Step(state)) => Some(state),
            _ => None,
        };
        Some(Fact { seq: head.seq, execution, result_sha256, known_event: event.is_some(), bad_fold, step })
    }
}

/// What the verified journal says about each execution, collected during the walk.
#[derive(Default)]
struct Tally {
    last_state: HashMap<IdKey, ExecutionState>,
    result_digests: HashMap<IdKey, [u8; 64]>,
    /// Rows whose event their stream does not have (the first [`UNKNOWN_EVENTS_LISTED`]).
    unknown_events: Vec<u64>,
    /// Folded rows that do not read as a lifecycle (the first [`UNKNOWN_EVENTS_LISTED`]).
    bad_folds: Vec<u64>,
    /// Steps the lifecycle does not allow from where the execution was: the row, the execution,
    /// from, to (the first [`UNKNOWN_EVENTS_LISTED`]).
    bad_steps: Vec<(u64, IdKey, Option<ExecutionState>, ExecutionState)>,
    /// The Merkle tree's kept subtrees, recomputed from the rows (when the walk builds the tree).
    kept: Vec<(Subtree, Hash)>,
    /// The tree's root at the size asked for, if the walk got there.
    root_at: Option<Hash>,
}

/// Whether the chain walk also builds the Merkle tree from the rows.
#[derive(Clone, Copy)]
enum Walk {
    ChainOnly,
    /// The tree too, with its root at `root_at` rows taken on the way.
    Tree {
        root_at: Option<u64>,
    },
}

/// At most this many rows with an unknown event are listed one by one.
const UNKNOWN_EVENTS_LISTED: usize = 100;

impl Tally {
    fn record(&mut self, fact: &Fact) {
        if !fact.known_event && self.unknown_events.len() < UNKNOWN_EVENTS_LISTED {
            self.unknown_events.push(fact.seq);
        }
        if fact.bad_fold && self.bad_folds.len() < UNKNOWN_EVENTS_LISTED {
            self.bad_folds.push(fact.seq);
        }
        if let Some((key, state)) = fact.execution {
            let from = self.last_state.get(&key).copied();
            // An execution begins with `accepted` (a folded one's end is checked as a fold);
            // every later step is one the state machine allows, and a note (which moves nothing)
            // says the state the steps before it left: a forged note cannot move an execution.
            let (to, allowed) = match (fact.step, from) {
                (Some(to), None) => (to, to == ExecutionState::Accepted),
                (Some(to), Some(from)) => (to, to != ExecutionState::Accepted && from.transition(to).is_ok()),
                (None, from) => (state, from == Some(state)),
            };
            if !allowed && self.bad_steps.len() < UNKNOWN_EVENTS_LISTED {
                self.bad_steps.push((fact.seq, key, from, to));
            }
            self.last_state.insert(key, state);
            if let Some(sha) = fact.result_sha256 {
                self.result_digests.insert(key, sha);
            }
        }
    }
}

/// Walks the chain in `seq` order. Every row must chain from the stored hash of the row before
/// it; the first row that does not is diagnosed and the walk stops there.
///
/// Two threads share the work: this one steps through SQLite and copies rows into batches, a
/// second one hashes them (each row's check needs only the previous row's *stored* hash, so
/// hashing never waits on reading beyond the batch boundary).
fn check_chain(
    conn: &Connection,
    total: u64,
    scope: VerifyScope,
    walk: Walk,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(JournalHead, Option<Finding>, Tally), StoreError> {
    let (full_tx, full_rx) = mpsc::sync_channel::<Batch>(4);
    let (empty_tx, empty_rx) = mpsc::channel::<Batch>();
    let (walked, read_error) = std::thread::scope(|threads| {
        let hasher = threads.spawn(move || {
            let mut tally = Tally::default();
            let mut prev = GENESIS;
            let mut expected: u64 = 1;
            let mut tree = Frontier::default();
            if let Walk::Tree { root_at: Some(0) } = walk {
                tally.root_at = Some(tree.root());
            }
            for mut batch in full_rx {
                for i in 0..batch.seqs.len() {
                    let seq = batch.seqs[i];
                    let body = &batch.bodies[if i == 0 { 0 } else { batch.ends[i - 1] }..batch.ends[i]];
                    let stored = batch.hashes[i];
                    if seq != expected {
                        return (prev, expected - 1, Some(Break::Gap { expected, seq }), tally);
                    }
                    let fact = (chain_hash(&prev, body) == stored).then_some(batch.facts[i]);
                    if let Walk::Tree { root_at } = walk {
                        let completed = tree.push(postern_core::merkle::leaf_hash(body));
                        tally.kept.extend(completed.into_iter().filter(|(s, _)| s.level >= crate::merkle::KEPT_LEVEL));
                        if root_at == Some(seq) {
                            tally.root_at = Some(tree.root());
                        }
                    }
                    match fact {
                        Some(Some(fact)) if fact.seq == seq => tally.record(&fact),
                        Some(None) => return (prev, seq - 1, Some(Break::Unreadable { seq }), tally),
                        _ => {
                            let broke = Break::Mismatch { seq, body: body.to_vec(), stored };
                            return (prev, seq - 1, Some(broke), tally);
                        }
                    }
                    prev = stored;
                    expected += 1;
                }
                batch.clear();
                // The reader may already be done; then the batch is simply dropped.
                let _ = empty_tx.send(batch);
            }
            (prev, expected - 1, None, tally)
        });
        let read = read_rows(conn, total, scope, progress, &full_tx, &empty_rx);
        drop(full_tx);
        let walked = hasher.join();
        (walked, read.err())
    });
    let (prev, size, broke, tally) = walked.map_err(|_| StoreError::Corrupt("chain hashing thread panicked".into()))?;
    let head = JournalHead { size, hash: HashHex(prev) };
    let finding = match broke {
        None => {
            // Only a clean walk to the end is a result; a read error mid-way is not.
            if let Some(e) = read_error {
                return Err(e);
            }
            None
        }
        Some(Break::Gap { expected, seq }) => Some(Finding::Missing { from: expected, to: seq - 1 }),
        Some(Break::Mismatch { seq, body, stored }) => Some(diagnose(conn, seq, &body, &stored)?),
        Some(Break::Unreadable { seq }) => {
            return Err(StoreError::Corrupt(format!(
                "row {seq} verifies but cannot be read by this postern (written by an incompatible version?)"
            )));
        }
    };
    Ok((head, finding, tally))
}

/// Steps through the journal and feeds batches to the hashing thread until the end, or until
/// the hasher stops listening (it found the first broken row).
fn read_rows(
    conn: &Connection,
    total: u64,
    scope: VerifyScope,
    progress: &mut dyn FnMut(u64, u64),
    full: &mpsc::SyncSender<Batch>,
    empty: &mpsc::Receiver<Batch>,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare("SELECT seq, body, row_hash FROM journal ORDER BY seq")?;
    let mut rows = stmt.query([])?;
    let mut batch = Batch::default();
    let mut read: u64 = 0;
    loop {
        let row = rows.next()?;
        if let Some(row) = row {
            let seq = row.get::<_, i64>(0)? as u64;
            match (
                row.get_ref(1)?.as_bytes(),
                row.get_ref(2)?.as_bytes().ok().and_then(|h| <[u8; 32]>::try_from(h).ok()),
            ) {
                (Ok(body), Some(hash)) => {
                    batch.seqs.push(seq);
                    batch.bodies.extend_from_slice(body);
                    batch.ends.push(batch.bodies.len());
                    batch.hashes.push(hash);
                    batch.facts.push(match scope {
                        VerifyScope::Full => Fact::read(body),
                        // Only the position matters; it is read cheaply from the head.
                        VerifyScope::ChainOnly => body_seq(body).map(Fact::position_only),
                    });
                }
                // A value of the wrong type, or a hash of the wrong length: an empty body with a
                // zero hash can never chain, so the hasher stops here and the row is diagnosed.
                _ => {
                    batch.seqs.push(seq);
                    batch.ends.push(batch.bodies.len());
                    batch.hashes.push([0; 32]);
                    batch.facts.push(None);
                }
            }
            read += 1;
        }
        if batch.seqs.len() >= Batch::ROWS || (row.is_none() && !batch.seqs.is_empty()) {
            let next = empty.try_recv().unwrap_or_default();
            if full.send(std::mem::replace(&mut batch, next)).is_err() {
                return Ok(()); // the hasher stopped at a broken row
            }
            if read.is_multiple_of(PROGRESS_EVERY) {
                progress(read, total);
            }
        }
        if row.is_none() {
            progress(read, total);
            return Ok(());
        }
    }
}

fn body_seq(body: &[u8]) -> Option<u64> {
    scan_head(body).map(|h| h.seq)
}

/// Explains why the row at `position` does not chain, from the `seq` each row carries inside
/// its own hashed content.
///
/// A row whose content claims another position is only called *displaced* (reordered or
/// inserted-before) when it still chains from the hash of the row that originally preceded it,
/// which proves its content is untouched. Anything else is a modification.
fn diagnose(conn: &Connection, position: u64, body: &[u8], stored: &[u8]) -> Result<Finding, StoreError> {
    let modified = |why: &str| Ok(Finding::Modified { seq: position, why: why.into() });
    let Some(claimed) = body_seq(body) else {
        return modified("content is not a valid journal row");
    };
    if claimed == position || claimed == 0 {
        return modified("content does not match its recorded hash");
    }
    let predecessor =
        if claimed == 1 { Some((0, GENESIS.to_vec())) } else { row_claiming(conn, claimed - 1, position)? };
    match predecessor {
        Some((_, pred_hash)) => {
            let pred: [u8; 32] = pred_hash.try_into().unwrap_or([0; 32]);
            if chain_hash(&pred, body).as_slice() != stored {
                return modified("content does not match its recorded hash");
            }
            if claimed < position {
                Ok(Finding::Inserted { position: claimed })
            } else {
                Ok(Finding::Reordered { position, found_seq: claimed })
            }
        }
        None if claimed > position
            && row_claiming(conn, claimed, position)?.is_none()
            && row_claiming(conn, position, position)?.is_none() =>
        {
            Ok(Finding::Missing { from: position, to: claimed - 1 })
        }
        None => modified("content does not match its recorded hash"),
    }
}

/// The (position, row_hash) of a row other than `except` whose content claims `seq`.
fn row_claiming(conn: &Connection, seq: u64, except: u64) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT seq, row_hash FROM journal
             WHERE seq != ?2 AND (CASE WHEN json_valid(body) THEN json_extract(body, '$.head.seq') END) = ?1
             ORDER BY seq LIMIT 1",
            rusqlite::params![seq as i64, except as i64],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?)),
        )
        .optional()?)
}

fn check_checkpoint(conn: &Connection, head: JournalHead, cp: &Checkpoint) -> Result<Option<Finding>, StoreError> {
    if cp.journal_size > head.size {
        return Ok(Some(Finding::Truncated { journal_size: head.size, checkpoint_size: cp.journal_size }));
    }
    if cp.journal_size == 0 {
        return Ok(None);
    }
    let at: Option<Vec<u8>> = conn
        .query_row("SELECT row_hash FROM journal WHERE seq = ?1", [cp.journal_size as i64], |r| r.get(0))
        .optional()?;
    let journal = HashHex(at.and_then(|h| h.try_into().ok()).unwrap_or([0; 32]));
    Ok((journal != cp.head_hash).then_some(Finding::HeadDiffers {
        seq: cp.journal_size,
        checkpoint: cp.head_hash,
        journal,
    }))
}

/// A tree head claimed for the first `claimed.size` rows, against the root the walk computed.
fn check_tree_head(head: JournalHead, claimed: &TreeHead, computed: Option<Hash>) -> Option<Finding> {
    if claimed.size > head.size {
        return Some(Finding::Truncated { journal_size: head.size, checkpoint_size: claimed.size });
    }
    let journal = computed.unwrap_or_default();
    (journal != claimed.root).then(|| Finding::RootDiffers {
        size: claimed.size,
        checkpoint: hex::encode(claimed.root),
        journal: hex::encode(journal),
    })
}
