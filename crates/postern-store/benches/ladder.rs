//! The approval ladder's decision cost on a large journal: the pure decision, the lookups that
//! feed it (a run's standing, the allowlist) and the retry lookup (the prior execution with the
//! same fingerprint, actor and scope), on a journal with 1,000,000 executions. Each lookup must
//! be an index search, not a scan: the query plans are printed too.
//!
//! Run: `cargo bench -p postern-store --bench ladder` (`POSTERN_BENCH_ROWS` to change 1M).

use postern_core::{Actor, ExecutionId, LadderInput, SessionId, SessionStanding, Timestamp, decide_ladder};
use postern_store::{SessionStart, Store};
use sha2::{Digest, Sha256};
use std::time::Instant;

fn fingerprint(n: u64) -> String {
    format!("hmac-sha256:{}", hex::encode(Sha256::digest(n.to_le_bytes())))
}

/// 1M executions (and one run per 1,000 of them), written straight into the projections the
/// lookups read; the journal rows themselves are not what these lookups touch.
fn generate(path: &std::path::Path, executions: u64) -> Vec<SessionId> {
    let store = Store::open(path, Timestamp::from_millis(1)).expect("create").0;
    let mut sessions = Vec::new();
    for s in 0..(executions / 1000).max(1) {
        let id = SessionId::from_parts(Timestamp::from_millis(2), u128::from(s) + 1);
        store
            .start_session(SessionStart {
                id,
                actor: Actor::process("/usr/bin/agent", "abcd"),
                pid: None,
                process_start: None,
                transport: "stdio".into(),
                client: None,
                at: Timestamp::from_millis(2),
            })
            .expect("session");
        if s % 2 == 0 {
            store
                .set_session_standing(id, true, "bench", serde_json::json!({}), Timestamp::from_millis(3))
                .expect("grant");
        }
        sessions.push(id);
    }
    store
        .set_allowlisted("process:/usr/bin/agent@sha256:abcd", true, "bench", Timestamp::from_millis(4))
        .expect("allow");
    drop(store);
    let mut conn = rusqlite::Connection::open(path).expect("open");
    conn.pragma_update(None, "synchronous", "OFF").expect("pragma");
    let tx = conn.transaction().expect("tx");
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO executions (id, fingerprint, actor, intent_scope, session_id, tool, channel, state,
                 accepted_at, updated_at, contract, record) VALUES (?1, ?2, 'process:/usr/bin/agent@sha256:abcd',
                 ?3, ?4, 'create_payment', 'http', 'result_delivered', ?5, ?5, '{}', '{}')",
            )
            .expect("prepare");
        for n in 0..executions {
            let session = sessions[(n / 1000) as usize % sessions.len()];
            let at = 1_000 + n as i64;
            insert
                .execute(rusqlite::params![
                    ExecutionId::from_parts(Timestamp::from_millis(at), u128::from(n) + 1).to_string(),
                    fingerprint(n),
                    format!("run:{session}"),
                    session.to_string(),
                    at
                ])
                .expect("insert");
        }
    }
    tx.commit().expect("commit");
    conn.execute_batch("ANALYZE").expect("analyze");
    sessions
}

fn per_second(name: &str, n: u64, mut f: impl FnMut(u64)) {
    let started = Instant::now();
    for i in 0..n {
        f(i);
    }
    let elapsed = started.elapsed();
    println!(
        "  {name:<44} {:>10.0} lookups/s  ({:.2} µs each)",
        n as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / n as f64
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("ladder bench: run with `cargo bench -p postern-store --bench ladder`");
        return;
    }
    let executions: u64 = std::env::var("POSTERN_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ladder.db");
    let started = Instant::now();
    let sessions = generate(&path, executions);
    println!("generated {executions} executions, {} runs in {:.1} s", sessions.len(), started.elapsed().as_secs_f64());
    let conn = rusqlite::Connection::open(&path).expect("open");
    for (what, sql) in [
        (
            "retry lookup",
            "EXPLAIN QUERY PLAN SELECT id FROM executions WHERE fingerprint = 'x' AND actor = 'a' AND intent_scope = 's' ORDER BY accepted_at DESC, id DESC LIMIT 1",
        ),
        (
            "run standing",
            "EXPLAIN QUERY PLAN SELECT g.standing FROM agent_sessions s LEFT JOIN session_grants g ON g.session_id = s.id WHERE s.id = 'x'",
        ),
        ("allowlist", "EXPLAIN QUERY PLAN SELECT 1 FROM allowlist WHERE actor = 'x' AND removed_at IS NULL"),
    ] {
        let plan: Vec<String> = conn
            .prepare(sql)
            .expect("plan")
            .query_map([], |r| r.get::<_, String>(3))
            .expect("plan")
            .map(|r| r.expect("row"))
            .collect();
        println!("  plan of the {what}: {}", plan.join("; "));
    }
    drop(conn);
    let store = Store::open(&path, Timestamp::from_millis(5)).expect("open").0;
    let view = store.view();
    let lookups = 200_000u64;
    let actor = "process:/usr/bin/agent@sha256:abcd";
    let spread = |i: u64| (i.wrapping_mul(2_654_435_761)) % executions;
    println!("on {executions} executions:");
    per_second("retry lookup, a prior exists", lookups, |i| {
        let n = spread(i);
        let session = sessions[(n / 1000) as usize % sessions.len()];
        let found = view.prior_execution(&fingerprint(n), actor, &format!("run:{session}")).expect("lookup");
        assert!(found.is_some());
    });
    per_second("retry lookup, a fresh call (no prior)", lookups, |i| {
        let found = view.prior_execution(&fingerprint(executions + i), actor, "run:none").expect("lookup");
        assert!(found.is_none());
    });
    per_second("run standing + allowlist + decide_ladder", lookups, |i| {
        let session = sessions[(spread(i) / 1000) as usize % sessions.len()];
        let standing = match view.session_standing(session).expect("standing") {
            Some(true) => SessionStanding::Authorized,
            Some(false) => SessionStanding::Revoked,
            None => SessionStanding::New,
        };
        let allowlisted = standing == SessionStanding::New && view.allowlisted(actor).expect("allowlist");
        let decision = decide_ladder(LadderInput {
            vault_locked: false,
            approve_every_use: false,
            session: standing,
            actor_allowlisted: allowlisted,
        });
        std::hint::black_box(decision);
    });
    per_second("decide_ladder alone (pure)", 10_000_000, |i| {
        std::hint::black_box(decide_ladder(LadderInput {
            vault_locked: i % 7 == 0,
            approve_every_use: i % 5 == 0,
            session: if i % 3 == 0 { SessionStanding::New } else { SessionStanding::Authorized },
            actor_allowlisted: i % 2 == 0,
        }));
    });
}
