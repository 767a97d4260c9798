//! A full disk under the writer: whatever fails, the journal and its projections still agree,
//! and nothing a caller was told is written is missing (a real tmpfs; SQLite gets ENOSPC).

use crate::support::*;
use postern_core::ExecutionState;
use postern_store::{Store, audit::verify};
use serde_json::json;
use std::{io::Write, process::Command, sync::Arc};

struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(bytes: u64) -> SmallDisk {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount")
            .success();
        assert!(ok, "mounting a tmpfs needs root (CI runs as root)");
        SmallDisk(dir)
    }

    fn fill(&self) {
        let mut f = std::fs::File::create(self.0.path().join("filler")).expect("filler");
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.0.path().join("filler")).expect("free");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// Many writers at once while the disk is full, so failing operations share group-commit batches
/// with others: SQLite may roll the whole transaction back on ENOSPC, and no job of such a batch
/// may be reported written or committed on its own.
#[test]
fn a_full_disk_never_splits_the_journal_from_its_projections() {
    let disk = SmallDisk::mount(32 << 20);
    let path = disk.0.path().join("postern.db");
    let (store, _) = Store::open(&path, at(0)).expect("open");
    let store = Arc::new(store);
    let s = session(1);
    let ids: Vec<_> =
        (1..=64u128).map(|n| dispatch_new(&store, payment(exec_id(n), n as u64, s, at(n as i64 * 10)))).collect();
    disk.fill();
    let told: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = ids
            .iter()
            .map(|&id| {
                let store = Arc::clone(&store);
                scope.spawn(move || {
                    let big = json!({ "reason": "x".repeat(20_000) });
                    store.transition(id, ExecutionState::OutcomeUnknown, big, at(5_000)).ok().map(|_| id)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().expect("thread")).collect()
    });
    disk.free();
    for id in &told {
        let state = store.view().execution(*id).expect("read").expect("exists").state;
        assert_eq!(state, postern_core::ExecutionState::OutcomeUnknown, "{id} was reported written");
    }
    // The store keeps working once space is back.
    store.transition(ids[0], ExecutionState::OutcomeUnknown, json!({}), at(6_000)).ok();
    store.flush().expect("flush");
    drop(store);
    let report = verify(&path, None, &mut |_, _| {}).expect("verifiable");
    assert!(report.findings.is_empty(), "{:?}", report.findings);
}
