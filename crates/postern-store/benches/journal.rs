//! Journal benchmarks (a bench binary that prints figures; tests never assert times):
//!
//! 1. durable single-event transactions (one writer, each append waits for its fsync);
//! 2. 64 concurrent writers with group commit, and the same with grouping disabled;
//! 3. `audit verify` on a generated 1,000,000-row journal, next to raw SHA-256 over the same
//!    bytes measured in the same run;
//! 4. read-only calls recorded as the engine records them (one detached job per call, committed
//!    unsynced in shared batches): the journal writer's own CPU time and the bytes written per
//!    call, the figure a change to the writer's per-call work moves;
//! 5. the Merkle tree on that journal: its nodes made at open (a journal from before the tree),
//!    the tree's own work per row, and a checkpoint's, a consistency proof's and an inclusion
//!    proof's time and size at 1M rows.
//!
//! Run: `cargo bench -p postern-store --bench journal` (`POSTERN_BENCH_ROWS` to change 1M).

use postern_core::{
    Actor, Channel, ExecutionId, ExecutionState, Fingerprint, IntentScope, ReplayContract, SessionId, Timestamp,
};
use postern_store::{
    Completion, NewExecution, Step, Store, StoreOptions, TreeReader,
    audit::{VerifyScope, verify_with},
    journal::{GENESIS, JournalRow, ROW_VERSION, chain_hash},
};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(1_764_445_000_000 + ms)
}

fn record(amount: u64) -> serde_json::Value {
    json!({
        "actor": "process:/usr/bin/claude@sha256:9f2c4b1e0d6a7c5b3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d",
        "arguments": {"amount": amount, "currency": "EUR", "reference": "invoice-2026-11-0042"},
        "channel": "http", "credential_ref": "pay-api", "headers": {"content-type": "application/json"},
        "intent_scope": "run:ses_01KB8HW4A00000000000000001", "method": "POST", "record_version": 1,
        "target": "https://pay.example/v1/payments", "tool": "create_payment",
    })
}

fn new_execution(id: ExecutionId, n: u64, session: SessionId) -> NewExecution {
    let fingerprint: Fingerprint =
        format!("hmac-sha256:{}", hex::encode(Sha256::digest(n.to_le_bytes()))).parse().expect("fp");
    NewExecution {
        id,
        fingerprint,
        // As a side-effecting call carries it (the effect index's cost is in the figures).
        effect_fingerprint: Some(fingerprint),
        actor: Actor::process("/usr/bin/claude", "9f2c"),
        intent_scope: IntentScope::agent_run(session),
        session_id: Some(session),
        tool: "create_payment".into(),
        channel: Channel::Http,
        contract: ReplayContract::read_only(),
        record: record(n),
        correlation: json!({"jsonrpc_id": n}),
        at: at(n as i64),
    }
}

/// One execution: an acceptance (ordered, not fsynced on its own) and three lifecycle
/// transitions, each its own fsynced transaction. Returns the number of fsynced appends.
fn appends(store: &Store, id: ExecutionId, n: u64, session: SessionId) -> u64 {
    store.admit(new_execution(id, n, session)).expect("admit");
    store.transition(id, ExecutionState::Authorized, json!({"rung": "session"}), at(1)).expect("auth");
    store.transition(id, ExecutionState::Dispatched, json!({}), at(2)).expect("dispatch");
    store.transition(id, ExecutionState::OutcomeUnknown, json!({"reason": "bench"}), at(3)).expect("unknown");
    3
}

fn bench_single(dir: &std::path::Path) {
    let (store, _) = Store::open(&dir.join("single.db"), at(0)).expect("open");
    let session = SessionId::from_parts(at(0), 1);
    let started = Instant::now();
    let mut count = 0;
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(4) {
        n += 1;
        count += appends(&store, ExecutionId::from_parts(at(n as i64), n as u128), n, session);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "journal appends, single-event durable transactions (1 writer, fsync each): {:>9.0} appends/s  ({count} appends in {secs:.2} s)",
        count as f64 / secs
    );
}

fn bench_concurrent(dir: &std::path::Path, name: &str, max_batch: usize) {
    let (store, _) =
        Store::open_with(&dir.join(format!("{name}.db")), at(0), StoreOptions { max_batch, ..StoreOptions::default() })
            .expect("open");
    let store = Arc::new(store);
    let writers = 64u64;
    let per_writer = 40u64;
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let session = SessionId::from_parts(at(0), u128::from(w) + 1);
                let mut count = 0;
                for i in 0..per_writer {
                    let n = w * 1_000_000 + i;
                    count += appends(&store, ExecutionId::from_parts(at(n as i64), u128::from(n)), n, session);
                }
                count
            })
        })
        .collect();
    let count: u64 = handles.into_iter().map(|h| h.join().expect("writer")).sum();
    let secs = started.elapsed().as_secs_f64();
    let stats = store.writer_stats();
    println!(
        "journal appends, 64 concurrent writers, {name:<15}: {:>9.0} durable appends/s  ({count} in {secs:.2} s, {} transactions, {:.1} operations per transaction)",
        count as f64 / secs,
        stats.transactions(),
        stats.operations() as f64 / stats.transactions().max(1) as f64
    );
}

/// CPU time (user + system) of this process's thread named `name`, from its `stat` in procfs.
fn thread_cpu(name: &str) -> Duration {
    let ticks: u64 = std::fs::read_dir("/proc/self/task")
        .expect("procfs")
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter(|stat| stat.split_once(" (").is_some_and(|(_, rest)| rest.starts_with(&format!("{name})"))))
        .map(|stat| {
            let after_comm = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
            let fields: Vec<&str> = after_comm.split(' ').collect();
            // utime and stime are fields 14 and 15 of stat, 12 and 13 after the comm.
            fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0)
        })
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Bytes this process has caused to be written (`write_bytes` of /proc/self/io).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| io.lines().find_map(|l| l.strip_prefix("write_bytes: ").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(0)
}

/// Read-only calls as the engine records them: 8 submitting threads, one detached job per call
/// (its acceptance with the authorization and dispatch folded in, its completion and its kept
/// result), committed unsynced in shared batches.
fn bench_reads(dir: &std::path::Path, reads: u64, max_batch: usize) {
    let options = StoreOptions { max_batch, ..StoreOptions::default() };
    let (store, _) = Store::open_with(&dir.join(format!("reads-{max_batch}.db")), at(0), options).expect("open");
    let store = Arc::new(store);
    let threads = 8u64;
    let per_thread = reads / threads;
    let reads = per_thread * threads;
    let (cpu_before, written_before) = (thread_cpu("postern-journal"), written_bytes());
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let session = SessionId::from_parts(at(0), u128::from(t) + 1);
                for i in 0..per_thread {
                    let n = t * 100_000_000 + i;
                    let id = ExecutionId::from_parts(at(n as i64), u128::from(n));
                    let mut new = new_execution(id, n, session);
                    new.effect_fingerprint = None;
                    // As a call over Streamable HTTP carries it (the request index's cost is in
                    // the figures): one MCP session per submitter.
                    new.correlation = json!({
                        "transport": "streamable_http", "agent_session": session.to_string(),
                        "mcp_session_id": format!("6f1d2c3b-0a4e-4c7b-9d2e-{:012x}", t + 1),
                        "protocol_version": "2025-11-25", "jsonrpc_id": i,
                    });
                    let steps = vec![
                        Step { state: ExecutionState::Authorized, detail: json!({"rung": "allowlist"}), at: at(1) },
                        Step {
                            state: ExecutionState::Dispatched,
                            detail: json!({"method": "GET", "target": "http://127.0.0.1:8080/items"}),
                            at: at(2),
                        },
                    ];
                    let completion = Completion {
                        outcome: json!({"http_status": 200}),
                        result: br#"{"content":[{"type":"text","text":"{\"ok\":true}"}],"isError":false}"#.to_vec(),
                        at: at(3),
                    };
                    store.record_read_only_detached(new, steps, Some(completion)).expect("record");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("submitter");
    }
    store.flush().expect("flush");
    let secs = started.elapsed().as_secs_f64();
    let cpu = thread_cpu("postern-journal").saturating_sub(cpu_before);
    let written = written_bytes().saturating_sub(written_before);
    let stats = store.writer_stats();
    println!(
        "read-only calls, 8 submitters, detached, at most {max_batch:>3} per commit: {:>9.0} calls/s, journal writer {:.1} µs CPU per call, {:.1} KiB written per call ({reads} calls, {:.1} per transaction)",
        reads as f64 / secs,
        cpu.as_secs_f64() * 1e6 / reads as f64,
        written as f64 / 1024.0 / reads as f64,
        stats.operations() as f64 / stats.transactions().max(1) as f64
    );
}

/// Writes a realistic journal of `rows` rows (5 per execution) straight into a database created
/// by `Store::open`, with matching executions and results, so that verify has all of its work.
fn generate(path: &std::path::Path, rows: u64) {
    drop(Store::open(path, at(0)).expect("create schema"));
    let mut conn = rusqlite::Connection::open(path).expect("open");
    conn.pragma_update(None, "synchronous", "OFF").expect("pragma");
    let tx = conn.transaction().expect("tx");
    let session = SessionId::from_parts(at(0), 1);
    let mut prev = GENESIS;
    let mut seq = 0u64;
    {
        let mut journal = tx.prepare("INSERT INTO journal (seq, body, row_hash) VALUES (?1, ?2, ?3)").expect("prep");
        let mut execs = tx
            .prepare(
                "INSERT INTO executions (id, fingerprint, actor, intent_scope, session_id, tool, channel, state,
                 accepted_at, updated_at, contract, record) VALUES (?1, ?2, 'a', 's', ?3, 't', 'http',
                 'result_delivered', ?4, ?4, '{}', '{}')",
            )
            .expect("prep");
        let mut results = tx
            .prepare("INSERT INTO results (execution_id, journal_seq, recorded_at, sha256, body) VALUES (?1, ?2, ?3, ?4, ?5)")
            .expect("prep");
        let result_body = br#"{"id":"pay_01KB8HW4A1","status":"succeeded","amount":1250}"#;
        let result_sha = hex::encode(Sha256::digest(result_body));
        let mut n = 0u64;
        while seq < rows {
            n += 1;
            let id = ExecutionId::from_parts(at(n as i64), u128::from(n));
            let fp = format!("hmac-sha256:{}", hex::encode(Sha256::digest(n.to_le_bytes())));
            let events: [(ExecutionState, serde_json::Value); 5] = [
                (
                    ExecutionState::Accepted,
                    json!({"tool": "create_payment", "channel": "http", "fingerprint": fp,
                    "record": record(n), "contract": {"class": "idempotency_key", "attach_window": {"millis": 600000}},
                    "correlation": {"jsonrpc_id": n}}),
                ),
                (ExecutionState::Authorized, json!({"rung": "session", "approved_by": "reviewer"})),
                (ExecutionState::Dispatched, json!({})),
                (
                    ExecutionState::Completed,
                    json!({"outcome": {"http_status": 201}, "result_bytes": result_body.len()}),
                ),
                (ExecutionState::ResultDelivered, json!({})),
            ];
            execs
                .execute(rusqlite::params![id.to_string(), fp, session.to_string(), at(n as i64).as_millis()])
                .expect("exec");
            for (state, detail) in events {
                if seq == rows {
                    break;
                }
                seq += 1;
                let row = JournalRow {
                    v: ROW_VERSION,
                    seq,
                    at: at(n as i64),
                    event: state.into(),
                    execution_id: Some(id),
                    session_id: Some(session),
                    state: Some(state),
                    result_sha256: (state == ExecutionState::Completed).then(|| result_sha.clone()),
                    detail,
                };
                let body = row.canonical().expect("canonical");
                let hash = chain_hash(&prev, &body);
                journal
                    .execute(rusqlite::params![seq as i64, std::str::from_utf8(&body).expect("utf-8"), hash.as_slice()])
                    .expect("insert");
                prev = hash;
                if state == ExecutionState::Completed {
                    let recorded = at(n as i64).as_millis();
                    results
                        .execute(rusqlite::params![id.to_string(), seq as i64, recorded, result_sha, &result_body[..]])
                        .expect("result");
                }
            }
        }
    }
    tx.commit().expect("commit");
}

fn bench_verify(dir: &std::path::Path, rows: u64) {
    let path = dir.join("verify.db");
    let gen_started = Instant::now();
    generate(&path, rows);
    println!(
        "generated a {rows}-row journal in {:.1} s ({:.0} MiB)",
        gen_started.elapsed().as_secs_f64(),
        std::fs::metadata(&path).expect("meta").len() as f64 / 1048576.0
    );
    // Written straight into the file, the journal has no tree yet: opening makes its nodes, as
    // it does for a journal written before the tree was kept.
    let tree_started = Instant::now();
    drop(Store::open(&path, at(0)).expect("open"));
    println!(
        "Merkle tree made from the {rows} rows at open:      {:>7.3} s  ({:.0} rows/s)",
        tree_started.elapsed().as_secs_f64(),
        rows as f64 / tree_started.elapsed().as_secs_f64()
    );
    bench_tree(&path, rows);

    // The exact bytes verify hashes: prev_hash ‖ body for every row.
    let conn = rusqlite::Connection::open(&path).expect("open");
    let mut inputs: Vec<u8> = Vec::new();
    let mut offsets: Vec<usize> = vec![0];
    {
        let mut stmt = conn.prepare("SELECT body, row_hash FROM journal ORDER BY seq").expect("prep");
        let mut q = stmt.query([]).expect("query");
        let mut prev = GENESIS.to_vec();
        while let Some(r) = q.next().expect("row") {
            inputs.extend_from_slice(&prev);
            inputs.extend_from_slice(r.get_ref(0).expect("body").as_bytes().expect("bytes"));
            offsets.push(inputs.len());
            prev = r.get::<_, Vec<u8>>(1).expect("hash");
        }
    }
    drop(conn);
    let mib = inputs.len() as f64 / 1048576.0;

    let best_of = |f: &mut dyn FnMut()| -> f64 {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let raw = best_of(&mut || {
        std::hint::black_box(Sha256::digest(&inputs));
    });
    let per_row = best_of(&mut || {
        for w in offsets.windows(2) {
            std::hint::black_box(Sha256::digest(&inputs[w[0]..w[1]]));
        }
    });
    let run = |scope: VerifyScope| {
        let mut report = None;
        let secs = best_of(&mut || {
            report = Some(verify_with(&path, None, scope, &mut |_, _| {}).expect("verify"));
        });
        let report = report.expect("ran");
        assert!(report.intact(), "generated journal must verify: {:?}", report.findings);
        secs
    };
    let chain_secs = run(VerifyScope::ChainOnly);
    let verify_secs = run(VerifyScope::Full);
    let rate = |secs: f64| rows as f64 / secs;
    println!(
        "raw SHA-256, one stream over the same {mib:.0} MiB:        {:>7.3} s  {:>6.0} MiB/s  ({:.0} rows/s equivalent)",
        raw,
        mib / raw,
        rate(raw)
    );
    println!(
        "SHA-256 per row over the same bytes (no SQLite):   {:>7.3} s  {:>6.0} MiB/s  {:>9.0} rows/s",
        per_row,
        mib / per_row,
        rate(per_row)
    );
    for (name, secs) in
        [("audit verify --chain-only", chain_secs), ("audit verify (full: chain + projections + results)", verify_secs)]
    {
        println!(
            "{name:<51} {secs:>7.3} s  {:>6.0} MiB/s  {:>9.0} rows/s   = {:>3.0}% of raw SHA-256 speed ({:.0}% of per-row)",
            mib / secs,
            rate(secs),
            100.0 * raw / secs,
            100.0 * per_row / secs
        );
    }
}

/// The tree's costs on a journal of `rows` rows: the in-memory work an append adds (a leaf hash
/// over the row's body and the frontier's node hashes), and proofs and checkpoints at its size.
fn bench_tree(path: &std::path::Path, rows: u64) {
    use postern_core::merkle::{Frontier, leaf_hash};
    let conn = rusqlite::Connection::open(path).expect("open");
    let bodies: Vec<String> = {
        let mut stmt = conn.prepare("SELECT body FROM journal ORDER BY seq LIMIT 100000").expect("prep");
        stmt.query_map([], |r| r.get(0)).expect("query").map(|b| b.expect("body")).collect()
    };
    drop(conn);
    let started = Instant::now();
    let mut tree = Frontier::default();
    for body in &bodies {
        std::hint::black_box(tree.push(leaf_hash(body.as_bytes())));
    }
    let per_row = started.elapsed().as_secs_f64() / bodies.len() as f64;
    let started = Instant::now();
    let mut prev = GENESIS;
    for body in &bodies {
        prev = chain_hash(&prev, body.as_bytes());
    }
    std::hint::black_box(prev);
    let chain_per_row = started.elapsed().as_secs_f64() / bodies.len() as f64;
    println!(
        "the tree's work per appended row (in memory):      {:>7.2} µs  (the chain hash: {:.2} µs; one kept node per 128 rows)",
        per_row * 1e6,
        chain_per_row * 1e6
    );
    let timed = |f: &mut dyn FnMut() -> usize| {
        let t = Instant::now();
        let size = f();
        (t.elapsed().as_secs_f64() * 1e3, size)
    };
    let reader = TreeReader::open(path).expect("reader");
    let (head_ms, _) = timed(&mut || {
        std::hint::black_box(reader.head(rows).expect("head"));
        0
    });
    let old = rows / 2 + 17;
    let (cons_ms, cons_hashes) = timed(&mut || reader.consistency(old, rows).expect("consistency").proof.len());
    let (incl_ms, incl_hashes) = timed(&mut || reader.inclusion(old, rows).expect("inclusion").proof.len());
    let note = note_size(rows);
    println!(
        "tree head at {rows} rows: {head_ms:.1} ms; consistency proof {old}→{rows}: {cons_ms:.1} ms, {cons_hashes} hashes \
         ({} B; as a witness request {} B with the checkpoint); inclusion proof of row {old}: {incl_ms:.1} ms, \
         {incl_hashes} hashes ({} B); checkpoint note {note} B",
        cons_hashes * 32,
        format!("old {old}\n").len() + cons_hashes * 45 + 1 + note,
        incl_hashes * 32
    );
}

/// A checkpoint note's length at `rows` rows: the origin (`postern/inst_` and a 26-character
/// ULID), the size, the base64 root (44), the blank line and one signature line (em dash, space,
/// the key name, space, 92 characters of base64 for a key ID and an Ed25519 signature).
fn note_size(rows: u64) -> usize {
    let origin = "postern/inst_".len() + 26;
    origin + 1 + rows.to_string().len() + 1 + 44 + 1 + 1 + "— ".len() + origin + 1 + 92 + 1
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no such flag.
    if !std::env::args().any(|a| a == "--bench") {
        println!("journal bench: run with `cargo bench -p postern-store --bench journal`");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // POSTERN_BENCH_KEEP=DIR keeps the generated databases there for inspection.
    let kept = std::env::var_os("POSTERN_BENCH_KEEP").map(std::path::PathBuf::from);
    let dir_path = kept.as_deref().unwrap_or(dir.path());
    let rows = std::env::var("POSTERN_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let reads = std::env::var("POSTERN_BENCH_READS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    if std::env::var_os("POSTERN_BENCH_ONLY_READS").is_some() {
        bench_reads(dir_path, reads, 16);
        return bench_reads(dir_path, reads, StoreOptions::default().max_batch);
    }
    if std::env::var_os("POSTERN_BENCH_ONLY_VERIFY").is_none() {
        bench_single(dir_path);
        bench_concurrent(dir_path, "group commit", StoreOptions::default().max_batch);
        bench_concurrent(dir_path, "no grouping", 1);
        // As many per commit as a busy gateway gathers in a linger, then as many as it may.
        bench_reads(dir_path, reads, 16);
        bench_reads(dir_path, reads, StoreOptions::default().max_batch);
    }
    bench_verify(dir_path, rows);
}
