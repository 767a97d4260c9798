//! What the rows say, checked once the chain holds: every event one its stream has, every
//! folded row a lifecycle, and the projections (`executions`, `results`) as the journal says.

use super::*;

/// The findings for rows whose event their stream does not have, with what they say they are.
pub(super) fn unknown_events(conn: &Connection, seqs: &[u64]) -> Result<Vec<Finding>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT body FROM journal WHERE seq = ?1")?;
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        let body: Vec<u8> = stmt.query_row([seq as i64], |r| r.get::<_, String>(0).map(String::into_bytes))?;
        let head = crate::journal::scan_head(&body);
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
        out.push(Finding::UnknownEvent {
            seq,
            stream: text(head.map(|h| h.stream)),
            event: text(head.map(|h| h.event)),
        });
    }
    Ok(out)
}

/// The findings for folded rows whose steps are not a lifecycle, with why.
pub(super) fn fold_differences(conn: &Connection, seqs: &[u64]) -> Result<Vec<Finding>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT body FROM journal WHERE seq = ?1")?;
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        let body: String = stmt.query_row([seq as i64], |r| r.get(0))?;
        let why = match crate::journal::JournalRow::from_body(body.as_bytes()) {
            Err(e) => e.to_string(),
            Ok(row) => match row.folded_steps() {
                Err(e) => e.to_string(),
                Ok(_) => continue,
            },
        };
        out.push(Finding::FoldDiffers { seq, why });
    }
    Ok(out)
}

/// Whether a folded row's steps walk the state machine from `accepted` to the state its head
/// names, read without building the payload (the walk's hot path: every read-only call has one).
pub(super) fn fold_reads(body: &[u8], ends_at: ExecutionState) -> bool {
    #[derive(serde::Deserialize)]
    struct Row {
        payload: Payload,
    }
    #[derive(serde::Deserialize)]
    struct Payload {
        steps: Vec<Step>,
    }
    // As strict as `FoldedStep`: a step missing its time or detail, or with a member more, does
    // not read there either (the detail is skipped, not built).
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Step {
        state: ExecutionState,
        #[allow(dead_code)]
        at: postern_core::Timestamp,
        #[allow(dead_code)]
        detail: serde::de::IgnoredAny,
    }
    let Ok(row) = serde_json::from_slice::<Row>(body) else { return false };
    ExecutionState::Accepted.walk(row.payload.steps.into_iter().map(|step| step.state)) == Ok(ends_at)
}

pub(super) fn key_text(key: &IdKey) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// Compares `executions` with the last state the journal recorded for every execution.
pub(super) fn check_projection(
    conn: &Connection,
    mut journal: HashMap<IdKey, ExecutionState>,
) -> Result<Vec<Finding>, StoreError> {
    let mut findings = Vec::new();
    let mut stmt = conn.prepare("SELECT id, state FROM executions")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (id, projection): (String, String) = (r.get(0)?, r.get(1)?);
        let recorded = id_key(id.as_bytes()).and_then(|k| journal.remove(&k));
        if recorded.map(ExecutionState::as_str) != Some(projection.as_str()) {
            let journal = recorded.map(|s| s.as_str().to_owned());
            findings.push(Finding::ProjectionMismatch { execution_id: id, projection, journal });
        }
    }
    findings.extend(journal.into_keys().map(|k| Finding::ProjectionMissing { execution_id: key_text(&k) }));
    findings.sort_by_cached_key(Finding::to_string);
    Ok(findings)
}

/// Compares every stored result with the digest its `completed` row recorded.
pub(super) fn check_results(
    conn: &Connection,
    mut journal: HashMap<IdKey, [u8; 64]>,
) -> Result<Vec<Finding>, StoreError> {
    let mut findings = Vec::new();
    let mut stmt = conn.prepare("SELECT execution_id, sha256, body FROM results")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let recorded: String = r.get(1)?;
        let mut actual = [0u8; 64];
        hex::encode_to_slice(Sha256::digest(r.get_ref(2)?.as_bytes().unwrap_or_default()), &mut actual)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let journaled = id_key(id.as_bytes()).and_then(|k| journal.remove(&k));
        let why = match journaled {
            None => Some("has no `completed` row in the journal"),
            Some(j) if j != actual => Some("does not match the digest in its `completed` journal row"),
            Some(_) if recorded.as_bytes() != actual => Some("does not match its own recorded digest"),
            Some(_) => None,
        };
        if let Some(why) = why {
            findings.push(Finding::ResultMismatch { execution_id: id, why: why.into() });
        }
    }
    findings.extend(journal.into_keys().map(|k| Finding::ResultMismatch {
        execution_id: key_text(&k),
        why: "is missing, though the journal recorded one".into(),
    }));
    findings.sort_by_cached_key(Finding::to_string);
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{FOLDED_STEPS, JournalRow, ROW_VERSION};
    use postern_core::{ExecutionId, Timestamp};
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// The walk's quick check of a folded row agrees with reading the row whole, whatever its
        /// steps say (hostile strings in the details included).
        #[test]
        fn the_walks_fold_check_agrees_with_reading_the_row(
            path in proptest::collection::vec(0usize..11, 0..5),
            end in 1usize..11,
            junk in "\\PC{0,24}",
            extra in any::<bool>(),
            // Per step: whole, without its time, without its detail, or with a member more.
            shapes in proptest::collection::vec(prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)], 5),
        ) {
            let steps: Vec<serde_json::Value> = path
                .iter()
                .zip(&shapes)
                .map(|(&i, shape)| {
                    let mut step = json!({"state": ExecutionState::ALL[i], "at": 5, "detail": {"state": junk, "steps": [junk]}});
                    match shape {
                        1 => drop(step.as_object_mut().and_then(|m| m.remove("at"))),
                        2 => drop(step.as_object_mut().and_then(|m| m.remove("detail"))),
                        3 => step["secret"] = json!(junk),
                        _ => {}
                    }
                    step
                })
                .collect();
            let mut detail = json!({"tool": junk, FOLDED_STEPS: steps});
            if extra {
                detail["steps_"] = json!([{"state": "paid"}]);
            }
            let row = JournalRow {
                v: ROW_VERSION,
                seq: 3,
                at: Timestamp::from_millis(5),
                event: crate::Event::Step(ExecutionState::Accepted),
                execution_id: Some(ExecutionId::from_parts(Timestamp::from_millis(5), 1)),
                session_id: None,
                state: Some(ExecutionState::ALL[end]),
                result_sha256: None,
                detail,
            };
            let body = row.canonical().expect("canonical");
            prop_assert_eq!(fold_reads(&body, ExecutionState::ALL[end]), row.folded_steps().is_ok());
            prop_assert_eq!(Fact::read(&body).expect("reads").bad_fold, row.folded_steps().is_err());
        }
    }
}
