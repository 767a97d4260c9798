//! The authority epoch: a count the journal writer advances after every commit that changed any
//! table but the journal and its per-call projections, so that what a reader read of the tables
//! granting authority (an agent's token, an agent run's standing) may be kept until it moves.
//!
//! The writer learns what a commit changed from SQLite itself (an update hook on its connection),
//! not from the jobs it ran: a job added later that revokes, ends or grants cannot forget to
//! advance it. A table is presumed to grant authority unless it is named in [`PER_CALL_TABLES`].
//! A commit by another process advances it too (the writer sees those by `data_version`, and
//! raises the authority alarm if the tables then differ from the journal).
//!
//! The same hook keeps a second count, the vault epoch, for the tables the vault's memory is read
//! from ([`VAULT_TABLES`]: the lock and the credentials): the vault's secret cache and the SSH
//! connection pool keep what they hold until it moves. It moves for nothing else (a new agent run
//! or MCP session leaves SSH connections open).

use rusqlite::Connection;
use std::{
    collections::HashMap,
    hash::Hash,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

/// The tables every call writes, none of which a remembered lookup reads: a commit that changed
/// only these leaves the epoch where it is.
pub(crate) const PER_CALL_TABLES: &[&str] = &["journal", "merkle_nodes", "executions", "results", "export_cursors"];

/// The tables the vault reads its lock and credentials from: a change to any of them moves the
/// vault epoch as well.
pub(crate) const VAULT_TABLES: &[&str] = &["credentials", "vault_state"];

/// How many lookups of one kind are remembered at most (then all are forgotten at once).
const MOST_REMEMBERED: usize = 4_096;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct AuthorityEpoch {
    count: AtomicU64,
    /// Set by the update hook while a transaction changes a table outside [`PER_CALL_TABLES`].
    touched: Arc<AtomicBool>,
    /// The vault epoch (see the module documentation).
    vault: AtomicU64,
    /// Set by the update hook while a transaction changes one of [`VAULT_TABLES`].
    vault_touched: Arc<AtomicBool>,
}

impl AuthorityEpoch {
    /// Watches every row the writer's connection inserts, updates or deletes. SQLite reports no
    /// row that a `DELETE` without `WHERE` removes in one go (its truncate optimization), so the
    /// connection's authorizer turns that optimization off: such a delete then goes row by row,
    /// each reported. (A table `WITHOUT ROWID` is not reported either: only per-call tables may be
    /// one, which `schema` tests.)
    pub(crate) fn watch(&self, conn: &mut Connection) -> rusqlite::Result<()> {
        use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
        conn.authorizer(Some(|context: AuthContext<'_>| match context.action {
            AuthAction::Delete { .. } => Authorization::Ignore,
            _ => Authorization::Allow,
        }))?;
        let (touched, vault_touched) = (Arc::clone(&self.touched), Arc::clone(&self.vault_touched));
        conn.update_hook(Some(move |_: rusqlite::hooks::Action, _: &str, table: &str, _: i64| {
            if !PER_CALL_TABLES.contains(&table) {
                touched.store(true, Ordering::Release);
            }
            if VAULT_TABLES.contains(&table) {
                vault_touched.store(true, Ordering::Release);
            }
        }))
    }

    /// After a transaction ended, committed or rolled back (and before its writers are answered,
    /// so a caller told "revoked" is never then let in by a remembered token): moves the epoch if
    /// the transaction touched a table that may grant authority.
    pub(crate) fn settle(&self) {
        if self.vault_touched.swap(false, Ordering::AcqRel) {
            self.vault.fetch_add(1, Ordering::AcqRel);
        }
        if self.touched.swap(false, Ordering::AcqRel) {
            self.count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Forgets every remembered lookup and moves the vault epoch too (another process committed,
    /// or whether one did is unknown).
    pub(crate) fn advance(&self) {
        self.vault.fetch_add(1, Ordering::AcqRel);
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    fn now(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// The vault epoch: moved by every commit or rollback that touched one of [`VAULT_TABLES`],
    /// before its writers are answered, and by [`advance`](Self::advance).
    pub(crate) fn vault_now(&self) -> u64 {
        self.vault.load(Ordering::Acquire)
    }
}

/// Lookups of one kind, all read in the epoch they are kept for.
#[derive(Debug)]
pub(crate) struct Remembered<K, V> {
    epoch: Arc<AuthorityEpoch>,
    /// The epoch the entries were read in, and the entries (all forgotten once it moved).
    entries: Mutex<(u64, HashMap<K, V>)>,
}

impl<K: Eq + Hash + Clone, V: Clone> Remembered<K, V> {
    pub(crate) fn new(epoch: Arc<AuthorityEpoch>) -> Self {
        Remembered { epoch, entries: Mutex::new((0, HashMap::new())) }
    }

    /// What `key` looked up to in this epoch, else `read()` (kept if `keep` says so and no commit
    /// moved the epoch meanwhile). The epoch is read before the database, so what a read saw
    /// before a commit is never kept for the epoch after it.
    pub(crate) fn get_or_read<Q, E>(
        &self,
        key: &Q,
        read: impl FnOnce() -> Result<V, E>,
        keep: impl FnOnce(&V) -> bool,
    ) -> Result<V, E>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let epoch = self.epoch.now();
        if let Ok(entries) = self.entries.lock()
            && entries.0 == epoch
            && let Some(value) = entries.1.get(key)
        {
            return Ok(value.clone());
        }
        let value = read()?;
        if keep(&value)
            && let Ok(mut entries) = self.entries.lock()
            && self.epoch.now() == epoch
        {
            let (kept_in, map) = &mut *entries;
            if *kept_in != epoch || map.len() >= MOST_REMEMBERED {
                // What an older epoch said (a revoked token's agent included) is not kept around.
                map.clear();
                *kept_in = epoch;
            }
            map.insert(key.to_owned(), value.clone());
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE agents (name TEXT PRIMARY KEY, revoked INTEGER); CREATE TABLE journal (seq INTEGER)",
        )
        .unwrap();
        conn
    }

    /// Each way a statement can change a row moves the epoch, a delete of every row included.
    #[test]
    fn every_shape_of_change_to_a_granting_table_moves_the_epoch() {
        let epoch = AuthorityEpoch::default();
        let mut conn = conn();
        epoch.watch(&mut conn).unwrap();
        let mut seen = 0;
        for sql in [
            "INSERT INTO agents VALUES ('a', 0)",
            "INSERT INTO agents VALUES ('a', 1) ON CONFLICT (name) DO UPDATE SET revoked = 1",
            "INSERT OR REPLACE INTO agents VALUES ('a', 0)",
            "UPDATE agents SET revoked = 1 WHERE name = 'a'",
            "DELETE FROM agents WHERE name = 'a'",
            "INSERT INTO agents VALUES ('b', 0)",
            "DELETE FROM agents",
        ] {
            conn.execute(sql, []).unwrap();
            epoch.settle();
            seen += 1;
            assert_eq!(epoch.now(), seen, "{sql}");
        }
        let left: i64 = conn.query_row("SELECT count(*) FROM agents", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 0, "a delete still deletes");
    }

    #[test]
    fn only_a_change_outside_the_per_call_tables_moves_the_epoch() {
        let epoch = AuthorityEpoch::default();
        let mut conn = conn();
        epoch.watch(&mut conn).unwrap();
        conn.execute("INSERT INTO journal VALUES (1)", []).unwrap();
        epoch.settle();
        assert_eq!(epoch.now(), 0, "a journal row grants nothing");
        conn.execute("INSERT INTO agents VALUES ('a', 0)", []).unwrap();
        epoch.settle();
        assert_eq!(epoch.now(), 1);
        // Rolled back still counts: the flag is cleared only by moving the epoch.
        conn.execute_batch("BEGIN; UPDATE agents SET revoked = 1; ROLLBACK").unwrap();
        epoch.settle();
        assert_eq!(epoch.now(), 2);
        epoch.settle();
        assert_eq!(epoch.now(), 2, "nothing touched since");
    }

    /// The vault epoch moves for the lock and the credentials only; another process's commit
    /// moves both counts.
    #[test]
    fn only_a_change_to_the_lock_or_a_credential_moves_the_vault_epoch() {
        let epoch = AuthorityEpoch::default();
        let mut conn = conn();
        conn.execute_batch("CREATE TABLE credentials (name TEXT); CREATE TABLE vault_state (locked INTEGER)").unwrap();
        epoch.watch(&mut conn).unwrap();
        let mut expected = (0, 0);
        for (sql, vault) in [
            ("INSERT INTO agents VALUES ('a', 0)", false),
            ("INSERT INTO journal VALUES (1)", false),
            ("INSERT INTO credentials VALUES ('stripe')", true),
            ("UPDATE agents SET revoked = 1", false),
            ("INSERT INTO vault_state VALUES (1)", true),
            ("UPDATE credentials SET name = 'github'", true),
            ("DELETE FROM credentials", true),
        ] {
            conn.execute(sql, []).unwrap();
            epoch.settle();
            expected.1 += u64::from(vault);
            expected.0 += u64::from(!sql.contains("journal"));
            assert_eq!((epoch.now(), epoch.vault_now()), expected, "{sql}");
        }
        epoch.advance();
        assert_eq!((epoch.now(), epoch.vault_now()), (expected.0 + 1, expected.1 + 1));
    }

    #[test]
    fn a_lookup_is_read_again_once_the_epoch_moved() {
        let epoch = Arc::new(AuthorityEpoch::default());
        let remembered: Remembered<String, Option<u32>> = Remembered::new(Arc::clone(&epoch));
        let reads = std::cell::Cell::new(0);
        let read = |v| {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(v)
        };
        assert_eq!(remembered.get_or_read("k", || read(Some(1)), Option::is_some), Ok(Some(1)));
        assert_eq!(remembered.get_or_read("k", || read(Some(2)), Option::is_some), Ok(Some(1)));
        assert_eq!(reads.get(), 1, "remembered within the epoch");
        epoch.advance();
        assert_eq!(remembered.get_or_read("k", || read(None), Option::is_some), Ok(None));
        assert_eq!(remembered.get_or_read("k", || read(Some(3)), Option::is_some), Ok(Some(3)));
        assert_eq!(reads.get(), 3, "an unkept answer is read again");
    }
}
