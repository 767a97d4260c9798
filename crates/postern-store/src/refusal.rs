//! A refused request is evidence of a possible self-approval attempt, and the one refused
//! chooses how many it makes and how long their text is. So every `request_refused` row, whoever
//! writes it (a door of the gateway, the control socket, a command), passes one budget per
//! minute, per peer and in all, and one bound on its text: here, in the store's only way to
//! write one.

use postern_core::Timestamp;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Rows journaled per minute for one peer at most; the rest are counted into its next row.
pub const REFUSALS_PER_MINUTE: u32 = 30;

/// Rows journaled per minute for all peers together at most (many peers cannot flood it either).
pub const REFUSALS_PER_MINUTE_IN_ALL: u32 = 300;

/// The most characters one text of a refusal keeps; a longer one is cut and says how much was.
pub const REFUSAL_TEXT_CHARS: usize = 512;

/// The most items one list of a refusal keeps (an ancestry, say).
const REFUSAL_LIST_ITEMS: usize = 64;

/// Peers whose counts are kept in a minute; refusals of peers beyond them share one count.
const PEERS_TRACKED: usize = 1024;

/// The key refusals of peers beyond [`PEERS_TRACKED`] are counted under.
const MANY_PEERS: &str = "(more peers than are tracked)";

/// Peers a minute's summary names, most refusals first.
const PEERS_IN_SUMMARY: usize = 32;

/// This minute's rows, per peer and in all, and the refusals counted instead of journaled.
#[derive(Debug, Default)]
pub(crate) struct RefusalBudget {
    minute: i64,
    /// Per peer: rows journaled this minute, refusals counted this minute.
    peers: HashMap<String, (u32, u64)>,
    used: u32,
    counted: u64,
}

/// What the budget says of one refusal.
#[derive(Debug, PartialEq)]
pub(crate) struct Admission {
    /// The refusal gets a row of its own.
    pub(crate) row: bool,
    /// The minute before had refusals counted instead: the detail of its one summary row, to
    /// journal first. Nothing carries over into the new minute, so no peer keeps a place.
    pub(crate) summary: Option<Value>,
}

impl RefusalBudget {
    /// Whether a refusal by `peer` at `at` gets a row (else it is counted, and the count goes
    /// into the summary row written with the first refusal of a later minute).
    pub(crate) fn admit(&mut self, peer: String, at: Timestamp) -> Admission {
        let minute = at.as_millis().div_euclid(60_000);
        let mut summary = None;
        if self.minute != minute {
            summary = self.summary();
            *self = RefusalBudget { minute, ..RefusalBudget::default() };
        }
        let peer = if self.peers.len() >= PEERS_TRACKED && !self.peers.contains_key(&peer) {
            MANY_PEERS.to_owned()
        } else {
            peer
        };
        let over_all = self.used >= REFUSALS_PER_MINUTE_IN_ALL;
        let entry = self.peers.entry(peer).or_default();
        if over_all || entry.0 >= REFUSALS_PER_MINUTE {
            entry.1 += 1;
            self.counted += 1;
            return Admission { row: false, summary };
        }
        entry.0 += 1;
        self.used += 1;
        Admission { row: true, summary }
    }

    /// The summary of this minute's counted refusals, if any were.
    fn summary(&self) -> Option<Value> {
        if self.counted == 0 {
            return None;
        }
        let mut counted: Vec<(&String, u64)> =
            self.peers.iter().filter(|(_, (_, n))| *n > 0).map(|(peer, (_, n))| (peer, *n)).collect();
        counted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let peers_counted = counted.len();
        let named: Vec<Value> = counted
            .into_iter()
            .take(PEERS_IN_SUMMARY)
            .map(|(peer, n)| serde_json::json!({ "peer": peer, "counted": n }))
            .collect();
        Some(serde_json::json!({
            "interface": "refusal_budget",
            "attempted": "(refusals over the budget: counted, not journaled one by one)",
            "minute_from": self.minute * 60_000,
            "counted": self.counted,
            "peers_counted": peers_counted,
            "peers": named,
        }))
    }
}

/// Who a refusal is budgeted to, from its `peer`: the agent run it came from if known, else
/// the actor, else the executable, else the pid.
pub(crate) fn peer_key(detail: &Value) -> String {
    let peer = &detail["peer"];
    ["agent_run", "actor", "executable", "pid"]
        .iter()
        .find_map(|k| peer.get(*k).filter(|v| !v.is_null()).map(|v| format!("{k}:{v}")))
        .map(|key| bounded_text(key, REFUSAL_TEXT_CHARS))
        .unwrap_or_else(|| "unknown".into())
}

/// The most characters (keys and texts) and values a refusal's detail keeps in all.
const REFUSAL_CHARS_IN_ALL: usize = 8 * 1024;
const REFUSAL_VALUES_IN_ALL: usize = 512;

/// What is left of a detail's allowance as it is walked.
struct Allowance {
    chars: usize,
    values: usize,
}

/// `detail` held to its allowance: every text cut to [`REFUSAL_TEXT_CHARS`], every list or
/// object to 64 items, at most 8 KiB of characters and 512 values in all, 8 levels deep (each cut
/// says so); and an object however it came.
/// The peer (who asked: pid, executable, ancestry) has an allowance of its own, so a long text
/// of what was asked cannot leave who asked out.
pub(crate) fn bounded(detail: Value) -> Value {
    let fresh = || Allowance { chars: REFUSAL_CHARS_IN_ALL, values: REFUSAL_VALUES_IN_ALL };
    let (detail, peer) = match detail {
        Value::Object(mut fields) => {
            let peer = fields.remove("peer");
            (Value::Object(fields), peer)
        }
        other => (other, None),
    };
    let mut fields = match bound(detail, 0, &mut fresh()) {
        Value::Object(fields) => fields,
        other => Map::from_iter([("detail".to_owned(), other)]),
    };
    if let Some(peer) = peer {
        fields.insert("peer".into(), bound(peer, 1, &mut fresh()));
    }
    Value::Object(fields)
}

fn bound(value: Value, depth: usize, a: &mut Allowance) -> Value {
    if depth >= 8 || a.values == 0 {
        return Value::String("(left out)".into());
    }
    a.values -= 1;
    match value {
        Value::String(s) => Value::String(text(s, a)),
        Value::Array(items) => {
            let total = items.len();
            let mut kept = Vec::new();
            for item in items.into_iter().take(REFUSAL_LIST_ITEMS) {
                if a.values == 0 {
                    break;
                }
                kept.push(bound(item, depth + 1, a));
            }
            if kept.len() < total {
                kept.push(Value::String(format!("… {} more left out", total - kept.len())));
            }
            Value::Array(kept)
        }
        Value::Object(fields) => {
            let total = fields.len();
            let mut kept = Map::new();
            for (k, v) in fields.into_iter().take(REFUSAL_LIST_ITEMS) {
                if a.values == 0 {
                    break;
                }
                let k = text(k, a);
                let v = bound(v, depth + 1, a);
                kept.insert(k, v);
            }
            if kept.len() < total {
                kept.insert("left_out".into(), Value::from(total - kept.len()));
            }
            Value::Object(kept)
        }
        other => other,
    }
}

/// `s` cut to what one text and the allowance left allow.
fn text(s: String, a: &mut Allowance) -> String {
    let limit = REFUSAL_TEXT_CHARS.min(a.chars);
    let kept = s.chars().count().min(limit);
    a.chars -= kept;
    bounded_text(s, limit)
}

fn bounded_text(text: String, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text,
        Some((cut, _)) => {
            let more = text[cut..].chars().count();
            format!("{}… ({more} more characters left out)", &text[..cut])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_peer_spends_its_own_budget_and_its_excess_is_summed_up_next_minute() {
        let mut b = RefusalBudget::default();
        let admitted = (0..100).filter(|_| b.admit("agent_run:\"spammer\"".into(), at(60_000)).row).count();
        assert_eq!(admitted, REFUSALS_PER_MINUTE as usize);
        let quiet = b.admit("agent_run:\"quiet\"".into(), at(60_001));
        assert_eq!(quiet, Admission { row: true, summary: None }, "another peer still gets a row");
        let next = b.admit("agent_run:\"spammer\"".into(), at(120_000));
        assert!(next.row, "a new minute, a new budget");
        let summary = next.summary.expect("the minute before is summed up");
        assert_eq!(summary["counted"], 70);
        assert_eq!(summary["peers"], json!([{ "peer": "agent_run:\"spammer\"", "counted": 70 }]));
        assert_eq!(b.admit("x".into(), at(120_001)).summary, None, "summed up once");
    }

    /// Found in review: peers with counts carried from minute to minute kept their places, so a
    /// minute's flood of new keys filled the table for good. Nothing carries over now.
    #[test]
    fn many_peers_cannot_grow_the_budget_or_keep_their_places() {
        let mut b = RefusalBudget::default();
        let admitted = (0..5_000).filter(|n| b.admit(format!("pid:{n}"), at(60_000)).row).count();
        assert_eq!(admitted, REFUSALS_PER_MINUTE_IN_ALL as usize, "rows in all are bounded");
        assert!(b.peers.len() <= PEERS_TRACKED + 1, "peers tracked: {}", b.peers.len());
        let next = b.admit("agent_run:\"victim\"".into(), at(120_000));
        assert!(next.row, "a new peer next minute gets a row of its own");
        let summary = next.summary.unwrap();
        assert_eq!(summary["counted"], 5_000 - REFUSALS_PER_MINUTE_IN_ALL as u64);
        assert_eq!(summary["peers"].as_array().unwrap().len(), PEERS_IN_SUMMARY);
        assert_eq!(summary["peers"][0]["peer"], MANY_PEERS, "the untracked peers' refusals, as one count");
        assert_eq!(b.peers.len(), 1);
    }

    #[test]
    fn the_run_a_refusal_came_from_is_its_peer() {
        let detail = json!({ "peer": { "pid": 7, "executable": "/usr/bin/postern", "agent_run": "run-1" } });
        assert_eq!(peer_key(&detail), "agent_run:\"run-1\"");
        assert_eq!(peer_key(&json!({ "peer": { "pid": 7, "agent_run": null } })), "pid:7");
        assert_eq!(peer_key(&json!({})), "unknown");
    }

    #[test]
    fn a_long_text_is_cut_and_says_so() {
        let d = bounded(json!({ "attempted": "é".repeat(10_000), "peer": { "ancestry": vec![1; 500] } }));
        let attempted = d["attempted"].as_str().unwrap();
        assert!(attempted.starts_with(&"é".repeat(REFUSAL_TEXT_CHARS)), "{attempted}");
        assert!(attempted.ends_with(&format!("({} more characters left out)", 10_000 - REFUSAL_TEXT_CHARS)));
        let ancestry = d["peer"]["ancestry"].as_array().unwrap();
        assert_eq!(ancestry.len(), REFUSAL_LIST_ITEMS + 1);
        assert_eq!(ancestry.last().unwrap(), &json!(format!("… {} more left out", 500 - REFUSAL_LIST_ITEMS)));
        assert_eq!(bounded(json!("not an object")), json!({ "detail": "not an object" }));
    }

    fn hostile_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(Value::from),
            ".{0,700}".prop_map(Value::from),
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
        ];
        leaf.prop_recursive(11, 1_500, 70, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..70).prop_map(Value::from),
                prop::collection::btree_map(".{0,520}", inner, 0..70)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever a peer sends, the row's detail is an object of bounded size.
        #[test]
        fn whatever_is_refused_the_detail_is_bounded(detail in hostile_json(), peer in hostile_json()) {
            let mut detail = detail;
            if let Value::Object(fields) = &mut detail {
                fields.insert("peer".into(), peer);
            }
            let bounded = bounded(detail);
            prop_assert!(bounded.is_object());
            fn check(v: &Value, depth: usize) -> Result<(), TestCaseError> {
                prop_assert!(depth <= 9);
                match v {
                    Value::String(s) => prop_assert!(s.chars().count() <= REFUSAL_TEXT_CHARS + 60),
                    Value::Array(a) => {
                        prop_assert!(a.len() <= REFUSAL_LIST_ITEMS + 1);
                        for x in a { check(x, depth + 1)?; }
                    }
                    Value::Object(o) => {
                        // The top level may have the peer beside its 64 fields and the count left out.
                        prop_assert!(o.len() <= REFUSAL_LIST_ITEMS + 1 + usize::from(depth == 0));
                        for (k, x) in o {
                            prop_assert!(k.chars().count() <= REFUSAL_TEXT_CHARS + 60);
                            check(x, depth + 1)?;
                        }
                    }
                    _ => {}
                }
                Ok(())
            }
            check(&bounded, 0)?;
            // And in all (the peer has an allowance of its own): the characters kept, plus what
            // each cut and marker adds.
            let size = serde_json::to_string(&bounded).unwrap().len();
            prop_assert!(size <= 2 * (4 * REFUSAL_CHARS_IN_ALL + 64 * REFUSAL_VALUES_IN_ALL), "{size} bytes");
        }
    }
}
