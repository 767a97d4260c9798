//! `postern audit verify` / `checkpoint` / `prove` as an incident responder uses them, and as a
//! witness would read them (checked with the independent checker in `postern_testkit::tlog`).

use crate::support::*;
use postern_testkit::tlog;

#[test]
fn verify_refuses_unusable_input_with_exit_2_and_names_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.db");
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("write");
    let text = dir.path().join("text.db");
    std::fs::write(&text, "id,amount\n1,500\n".repeat(20)).expect("write");
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .expect("create")
        .execute_batch("CREATE TABLE notes (body TEXT)")
        .expect("table");
    let newer = journal(1);
    rusqlite::Connection::open(newer.db()).expect("open").pragma_update(None, "user_version", 42).expect("bump");

    let newer_message = format!(
        "schema version 42 is newer than this postern supports ({}); upgrade postern",
        postern_store::supported_version()
    );
    let cases = [
        (missing.clone(), "no such file"),
        (empty.clone(), "the file is empty (0 bytes)"),
        (text.clone(), "not an SQLite database"),
        (foreign.clone(), "not a Postern one"),
        (newer.db(), newer_message.as_str()),
    ];
    for (path, message) in cases {
        let before = std::fs::read(&path).ok();
        let run = postern(&["audit", "verify", "--db", path.to_str().expect("utf-8")], None);
        assert_eq!(run.code, 2, "{}: {}", path.display(), run.stderr);
        assert!(run.stderr.contains(message), "{}: {}", path.display(), run.stderr);
        assert!(run.stderr.contains(path.to_str().expect("utf-8")), "names the file: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        assert_eq!(std::fs::read(&path).ok(), before, "verify must not create or change {}", path.display());
    }
}

#[test]
fn verify_reports_intact_then_names_a_tampered_row() {
    let j = journal(4);
    let run = postern(&["audit", "verify"], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("rows        24\n"), "{}", run.stdout);
    assert!(run.stdout.contains("executions  5\n"), "{}", run.stdout);
    assert!(run.stdout.contains("sessions    1\n"), "{}", run.stdout);
    assert!(run.stdout.contains("result      INTACT"), "{}", run.stdout);

    tamper(&j.db(), "DELETE FROM journal WHERE seq = 7");
    let run = postern(&["audit", "verify", "--db", j.db().to_str().expect("utf-8")], None);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("TAMPERING FOUND\n  - row 7: missing (deleted)"), "{}", run.stdout);

    let run = postern(&["audit", "verify", "--json"], Some(j.data_dir()));
    assert_eq!(run.code, 1);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(report["intact"], false);
    assert_eq!(report["findings"][0], serde_json::json!({"kind": "missing", "from": 7, "to": 7}));
    assert!(report["elapsed_ms"].is_u64());
}

#[test]
fn an_exported_checkpoint_catches_a_cut_off_tail() {
    let j = journal(3);
    let cp = j.data_dir().join("head.json");
    let run = postern(&["audit", "checkpoint", "--json", "--out", cp.to_str().expect("utf-8")], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("keep a copy off this machine"), "{}", run.stderr);
    let exported: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cp).expect("read")).expect("json");
    assert_eq!(exported["format"], "postern-checkpoint/1");
    let size = exported["journal_size"].as_u64().expect("size");

    let cp_arg = cp.to_str().expect("utf-8");
    assert_eq!(postern(&["audit", "verify", "--checkpoint", cp_arg], Some(j.data_dir())).code, 0);
    tamper(&j.db(), &format!("DELETE FROM journal WHERE seq > {}", size - 2));
    let run = postern(&["audit", "verify", "--checkpoint", cp_arg], Some(j.data_dir()));
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout
            .contains(&format!("journal truncated: it ends at row {} but the checkpoint covers {size} rows", size - 2)),
        "{}",
        run.stdout
    );

    std::fs::write(&cp, "{\"format\": \"something-else\"}").expect("write");
    let run = postern(&["audit", "verify", "--checkpoint", cp_arg], Some(j.data_dir()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not a Postern checkpoint"), "{}", run.stderr);
    let run = postern(&["audit", "verify", "--checkpoint", "/nonexistent/cp.json"], Some(j.data_dir()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("cannot read checkpoint /nonexistent/cp.json"), "{}", run.stderr);
}

fn b64(hash: &tlog::Hash) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(hash)
}

#[test]
fn checkpoint_notes_and_proofs_hold_for_a_witness_until_history_is_rewritten() {
    let j = journal(4);
    // Over 256 rows: the first subtree of 256 rows is a kept node.
    grow(&j, 10..=69);
    let d = Some(j.data_dir());
    let vkey = postern(&["audit", "pubkey", "--vkey"], d);
    assert_eq!(vkey.code, 0, "{}", vkey.stderr);
    let vkey = vkey.stdout.trim().to_owned();
    let old_file = j.data_dir().join("old.checkpoint");
    let old_arg = old_file.to_str().expect("utf-8");
    let run = postern(&["audit", "checkpoint", "--out", old_arg], d);
    assert_eq!(run.code, 0, "{}", run.stderr);

    // The note: an origin naming the installation, its size and root, signed by the key
    // `audit pubkey --vkey` names (key ID as the signed-note spec computes it).
    let old = tlog::parse_note(&std::fs::read_to_string(&old_file).expect("read")).expect("a signed note");
    tlog::note_signed_by(&old, &vkey).expect("signed by the installation's key");
    let (origin, old_size, old_root) = tlog::read_checkpoint(&old).expect("a checkpoint");
    assert!(origin.starts_with("postern/inst_"), "{origin}");
    assert_eq!(vkey.split('+').next(), Some(origin.as_str()), "the key is named by the origin");
    let db_leaves = |db: &std::path::Path| -> Vec<tlog::Hash> {
        let conn = rusqlite::Connection::open(db).expect("open");
        let mut stmt = conn.prepare("SELECT body FROM journal ORDER BY seq").expect("prepare");
        stmt.query_map([], |r| r.get::<_, String>(0))
            .expect("rows")
            .map(|b| tlog::leaf(b.expect("body").as_bytes()))
            .collect()
    };
    let leaves = db_leaves(&j.db());
    assert_eq!(old_root, tlog::mth(&leaves[..old_size as usize]), "the root is the tree of the rows");
    let run = postern(&["audit", "verify", "--checkpoint", old_arg, "--pubkey", &vkey], d);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("checkpoint  matches (Merkle tree root at row"), "{}", run.stdout);
    assert!(run.stdout.contains("signature   valid, by the trusted key"), "{}", run.stdout);

    // The journal grows; `prove --from` prints a witness's add-checkpoint body that checks out.
    grow(&j, 70..=74);
    let proved = postern(&["audit", "prove", "--from", old_arg, "--pubkey", &vkey], d);
    assert_eq!(proved.code, 0, "{}", proved.stderr);
    let (from, proof, new) = tlog::read_witness_request(&proved.stdout).expect("a tlog-witness request body");
    assert_eq!(from, old_size);
    tlog::note_signed_by(&new, &vkey).expect("the new checkpoint is signed");
    let (new_origin, new_size, new_root) = tlog::read_checkpoint(&new).expect("a checkpoint");
    assert_eq!(new_origin, origin);
    assert!(new_size > old_size + 20, "{new_size}");
    assert!(tlog::consistency_holds(old_size as usize, new_size as usize, &old_root, &new_root, &proof));

    // `prove --row` proves a row against the old checkpoint's tree, and against today's.
    for size in [old_size.to_string(), new_size.to_string()] {
        let row = postern(&["audit", "prove", "--row", "3", "--size", &size, "--json"], d);
        assert_eq!(row.code, 0, "{}", row.stderr);
        let p: serde_json::Value = serde_json::from_str(&row.stdout).expect("json");
        let proof: Vec<tlog::Hash> = p["proof"]
            .as_array()
            .expect("proof")
            .iter()
            .map(|h| {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD.decode(h.as_str().expect("b64")).expect("b64");
                bytes.try_into().expect("32 bytes")
            })
            .collect();
        let leaf = tlog::leaf(p["body"].as_str().expect("body").as_bytes());
        let size: usize = size.parse().expect("size");
        let root = if size == old_size as usize { old_root } else { new_root };
        assert_eq!(p["root"], b64(&root));
        assert!(tlog::inclusion_holds(&leaf, 2, size, &proof, &root), "row 3 in the tree of {size}");
    }
    let beyond = postern(&["audit", "prove", "--row", &(new_size + 50).to_string()], d);
    assert_eq!(beyond.code, 2, "{}", beyond.stderr);
    let against = postern(&["audit", "prove", "--row", "5", "--checkpoint", old_arg, "--pubkey", &vkey], d);
    assert_eq!(against.code, 0, "row 5 is in the tree the old checkpoint signed: {}", against.stderr);

    // History rewritten behind Postern's back, the chain recomputed. First the rows alone: the
    // kept tree still commits to the old rows, so a witness would see a consistent proof, but
    // Postern verifies the rows first and says no (exit 1), and the forged row no longer proves
    // into the tree the old checkpoint signed.
    let conn = rusqlite::Connection::open(j.db()).expect("open");
    conn.execute_batch("DROP TRIGGER journal_refuses_update; DROP TRIGGER journal_refuses_delete;").expect("drop");
    let body: String = conn.query_row("SELECT body FROM journal WHERE seq = 5", [], |r| r.get(0)).expect("row 5");
    let forged = body.replace("201", "502");
    assert_ne!(forged, body, "row 5 is a completed payment");
    conn.execute("UPDATE journal SET body = ?1 WHERE seq = 5", [&forged]).expect("forge");
    let mut prev: Vec<u8> =
        conn.query_row("SELECT row_hash FROM journal WHERE seq = 4", [], |r| r.get(0)).expect("row 4");
    let last: i64 = conn.query_row("SELECT max(seq) FROM journal", [], |r| r.get(0)).expect("max");
    for seq in 5..=last {
        let body: String = conn.query_row("SELECT body FROM journal WHERE seq = ?1", [seq], |r| r.get(0)).expect("row");
        let hash = postern_store::journal::chain_hash(&prev.clone().try_into().expect("32"), body.as_bytes());
        conn.execute("UPDATE journal SET row_hash = ?2 WHERE seq = ?1", rusqlite::params![seq, hash.as_slice()])
            .expect("rechain");
        prev = hash.to_vec();
    }
    drop(conn);
    let rows_only = postern(&["audit", "prove", "--from", old_arg], d);
    assert_eq!(rows_only.code, 1, "{}", rows_only.stderr);
    assert!(rows_only.stderr.contains("root differs from the checkpoint"), "{}", rows_only.stderr);
    let (from, proof, new) = tlog::read_witness_request(&rows_only.stdout).expect("a request body");
    let (_, new_size, new_root) = tlog::read_checkpoint(&new).expect("a checkpoint");
    assert!(
        tlog::consistency_holds(from as usize, new_size as usize, &old_root, &new_root, &proof),
        "the tree itself still extends the old one: only Postern, which reads the rows, can tell"
    );
    let forged_row = postern(&["audit", "prove", "--row", "5", "--checkpoint", old_arg], d);
    assert_eq!(forged_row.code, 1, "{}", forged_row.stderr);
    assert!(forged_row.stderr.contains("does NOT prove"), "{}", forged_row.stderr);

    // Then the kept tree too, as an attacker who knows the format would: everything on the
    // machine agrees again, but not with the checkpoint kept elsewhere. The witness body Postern
    // prints fails the independent check, Postern says so (exit 1), and verify names the row.
    let conn = rusqlite::Connection::open(j.db()).expect("open");
    conn.execute_batch("DROP TRIGGER merkle_nodes_refuse_delete; DELETE FROM merkle_nodes;").expect("drop the tree");
    let leaves = db_leaves(&j.db());
    for idx in 0..leaves.len() >> 8 {
        let node = tlog::mth(&leaves[idx << 8..(idx + 1) << 8]);
        conn.execute(
            "INSERT INTO merkle_nodes (level, idx, hash) VALUES (8, ?1, ?2)",
            rusqlite::params![idx as i64, node.as_slice()],
        )
        .expect("replant");
    }
    drop(conn);
    let chain_only = postern(&["audit", "verify"], d);
    assert_eq!(chain_only.code, 0, "the rewritten journal is self-consistent: {}", chain_only.stdout);
    let rewritten = postern(&["audit", "prove", "--from", old_arg], d);
    assert_eq!(rewritten.code, 1, "{}", rewritten.stderr);
    assert!(rewritten.stderr.contains("does NOT extend"), "{}", rewritten.stderr);
    let (from, proof, new) = tlog::read_witness_request(&rewritten.stdout).expect("a request body all the same");
    let (_, new_size, new_root) = tlog::read_checkpoint(&new).expect("a checkpoint");
    assert!(!tlog::consistency_holds(from as usize, new_size as usize, &old_root, &new_root, &proof));
    let run = postern(&["audit", "verify", "--checkpoint", old_arg, "--pubkey", &vkey], d);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!("row {old_size}: the Merkle tree's root differs from the checkpoint")),
        "{}",
        run.stdout
    );

    // A JSON checkpoint holds no tree root: it cannot start a consistency proof.
    let json = j.data_dir().join("head.json");
    assert_eq!(postern(&["audit", "checkpoint", "--json", "--out", json.to_str().expect("utf-8")], d).code, 0);
    let refused = postern(&["audit", "prove", "--from", json.to_str().expect("utf-8")], d);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("holds no Merkle tree root"), "{}", refused.stderr);
}
