//! The journal's Merkle tree on real SQLite files, checked with the independent checker in
//! `postern_testkit::tlog` (never with Postern's own tree code): tree heads at checkpoints,
//! inclusion and consistency proofs across the kept-node boundary, a journal from before the
//! tree (its nodes made at open), and what rewriting history does to the proofs.

use crate::support::*;
use postern_store::{Claim, Finding, TreeReader, audit::verify, merkle::KEPT_LEVEL};
use postern_testkit::tlog;

/// Every row's leaf hash, as the independent checker makes it from the rows.
fn leaves(path: &std::path::Path) -> Vec<tlog::Hash> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT body FROM journal ORDER BY seq").unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0)).unwrap().map(|b| tlog::leaf(b.unwrap().as_bytes())).collect()
}

fn kept_nodes(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT count(*) FROM merkle_nodes", [], |r| r.get(0)).unwrap()
}

#[test]
fn checkpoints_and_proofs_match_the_tree_an_independent_checker_builds() {
    let fx = Fixture::new();
    let store = fx.open();
    // 140 executions of 5 rows: 700 rows, so subtrees of 256 and 512 rows are kept.
    let size = populate(&store, 140);
    assert!(size > 2 << KEPT_LEVEL, "{size}");
    let cp = store.checkpoint(at(900_000)).unwrap().tree.unwrap();
    let all = leaves(&fx.path);
    assert_eq!(cp.size, size);
    assert_eq!(cp.root, tlog::mth(&all), "the checkpoint's root is the tree of the rows");
    assert_eq!(kept_nodes(&fx.path), i64::try_from((size >> 8) + (size >> 9)).unwrap());

    let reader = TreeReader::open(&fx.path).unwrap();
    for seq in [1, 2, 255, 256, 257, 511, 512, 513, size - 1, size] {
        let p = reader.inclusion(seq, size).unwrap();
        let leaf = tlog::leaf(p.body.as_bytes());
        let index = usize::try_from(seq - 1).unwrap();
        assert_eq!(leaf, all[index]);
        assert!(tlog::inclusion_holds(&leaf, index, size as usize, &p.proof, &p.tree.root), "row {seq}");
    }
    for old in [0, 1, 3, 255, 256, 300, 512, size - 1, size] {
        let c = reader.consistency(old, size).unwrap();
        assert_eq!(c.old.root, tlog::mth(&all[..old as usize]), "old root at {old}");
        assert!(
            tlog::consistency_holds(old as usize, size as usize, &c.old.root, &c.new.root, &c.proof),
            "{old} → {size}"
        );
    }
    // A proof against a tree the journal does not have is refused, not made up.
    assert!(reader.inclusion(size + 1, size).is_err());
    assert!(reader.consistency(size, size + 1).is_err());
    drop(reader);

    // Reopened, the writer takes the tree's edge from the kept nodes and goes on.
    drop(store);
    let store = fx.open();
    let grown = populate_more(&store, 70);
    let cp2 = store.checkpoint(at(950_000)).unwrap().tree.unwrap();
    drop(store);
    let all = leaves(&fx.path);
    assert_eq!(cp2.size, grown);
    assert_eq!(cp2.root, tlog::mth(&all));
    let c = TreeReader::open(&fx.path).unwrap().consistency(cp.size, cp2.size).unwrap();
    assert!(tlog::consistency_holds(size as usize, grown as usize, &cp.root, &cp2.root, &c.proof));
    assert!(verify(&fx.path, Some(&Claim::Tree(cp)), &mut |_, _| {}).unwrap().intact());
}

/// `populate`'s executions again, with other ids, so the journal grows.
fn populate_more(store: &postern_store::Store, n: u128) -> u64 {
    let s = session(2);
    for i in 0..n {
        run_to_delivery(store, payment(exec_id(50_000 + i), 7 + i as u64, s, at(500_000 + i as i64 * 10)), 201);
    }
    store.view().head().unwrap().size
}

#[test]
fn a_journal_from_before_the_tree_gets_its_nodes_at_open() {
    let fx = Fixture::new();
    let store = fx.open();
    let size = populate(&store, 120);
    drop(store);
    // As a journal written before the tree was kept: no nodes at all.
    let conn = attacker(&fx.path);
    conn.execute_batch("DROP TRIGGER merkle_nodes_refuse_delete; DELETE FROM merkle_nodes;").unwrap();
    drop(conn);
    assert!(
        verify(&fx.path, None, &mut |_, _| {})
            .unwrap()
            .findings
            .iter()
            .any(|f| matches!(f, Finding::TreeDiffers { .. }))
    );
    let store = fx.open();
    let cp = store.checkpoint(at(900_000)).unwrap().tree.unwrap();
    drop(store);
    assert_eq!(cp.root, tlog::mth(&leaves(&fx.path)));
    assert_eq!(kept_nodes(&fx.path), i64::try_from((size >> 8) + (size >> 9)).unwrap());
    assert!(verify(&fx.path, Some(&Claim::Tree(cp)), &mut |_, _| {}).unwrap().intact());
}

#[test]
fn rewritten_history_no_longer_proves_against_an_older_checkpoint() {
    let fx = Fixture::new();
    let store = fx.open();
    populate(&store, 120);
    let old = store.checkpoint(at(900_000)).unwrap().tree.unwrap();
    let size = populate_more(&store, 30);
    drop(store);

    // Rows only: a body changed and the chain recomputed. The kept nodes no longer hash their
    // rows (audit verify says so) and the changed row's inclusion proof fails.
    let conn = attacker(&fx.path);
    let (body, _) = row(&conn, 39); // an execution's `completed` row
    let forged = body.replace("201", "502");
    assert_ne!(forged, body);
    conn.execute("UPDATE journal SET body = ?1 WHERE seq = 39", [forged]).unwrap();
    rechain_from(&conn, 39);
    drop(conn);
    let report = verify(&fx.path, None, &mut |_, _| {}).unwrap();
    assert!(report.findings.iter().any(|f| matches!(f, Finding::TreeDiffers { .. })), "{:?}", report.findings);
    let reader = TreeReader::open(&fx.path).unwrap();
    let p = reader.inclusion(39, old.size).unwrap();
    assert!(!tlog::inclusion_holds(&tlog::leaf(p.body.as_bytes()), 38, old.size as usize, &p.proof, &old.root));
    drop(reader);

    // The whole tree rewritten too (what an attacker who knows the format does): everything on
    // the machine agrees again, but not with the checkpoint kept elsewhere.
    let conn = attacker(&fx.path);
    conn.execute_batch("DROP TRIGGER merkle_nodes_refuse_delete; DELETE FROM merkle_nodes;").unwrap();
    let all = leaves(&fx.path);
    for level in KEPT_LEVEL..12 {
        for idx in 0..(all.len() >> level) {
            let start = idx << level;
            conn.execute(
                "INSERT INTO merkle_nodes (level, idx, hash) VALUES (?1, ?2, ?3)",
                rusqlite::params![level, idx as i64, tlog::mth(&all[start..start + (1 << level)]).as_slice()],
            )
            .unwrap();
        }
    }
    drop(conn);
    assert!(verify(&fx.path, None, &mut |_, _| {}).unwrap().intact(), "self-consistent on the machine");
    let c = TreeReader::open(&fx.path).unwrap().consistency(old.size, size).unwrap();
    assert!(!tlog::consistency_holds(old.size as usize, size as usize, &old.root, &c.new.root, &c.proof));
    let f = verify(&fx.path, Some(&Claim::Tree(old)), &mut |_, _| {}).unwrap().findings;
    assert!(matches!(f.as_slice(), [Finding::RootDiffers { size, .. }] if *size == old.size), "{f:?}");
}

/// A node planted ahead of the rows (a plain INSERT: the triggers refuse only UPDATE and DELETE)
/// never stops the journal: rows go on being appended, the tree is no longer signed (a note is
/// refused, saying why), the chain's head still is, and `audit verify` names the node.
#[test]
fn a_node_planted_ahead_of_the_rows_stops_the_tree_not_the_journal() {
    let fx = Fixture::new();
    let store = fx.open();
    populate(&store, 10);
    rusqlite::Connection::open(&fx.path)
        .unwrap()
        .execute("INSERT INTO merkle_nodes (level, idx, hash) VALUES (8, 0, zeroblob(32))", [])
        .unwrap();
    let size = populate_more(&store, 60);
    assert!(size > 256, "appends went on past the planted node: {size}");
    let cp = store.checkpoint(at(990_000)).unwrap();
    assert_eq!(cp.journal.journal_size, size, "the chain's head is still recorded");
    let why = cp.tree.unwrap_err();
    assert!(why.contains("node 8/0"), "{why}");
    drop(store);
    let f = verify(&fx.path, None, &mut |_, _| {}).unwrap().findings;
    assert!(f.iter().any(|f| matches!(f, Finding::TreeDiffers { why } if why.contains("node 8/0"))), "{f:?}");
}
