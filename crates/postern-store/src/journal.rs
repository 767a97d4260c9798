//! The shape of one journal row and the hash chain that links rows together (docs/src/design.md, the journal).

use crate::event::Event;
use postern_core::{ExecutionId, ExecutionState, SessionId, Timestamp};
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
    /// Credentials and agents added or removed, the vault locked or unlocked, and refused
    /// attempts to approve or unlock from an agent's reach.
    Vault,
}

impl Stream {
    pub const ALL: [Stream; 3] = [Stream::Activity, Stream::Session, Stream::Vault];

    /// The stream stored as `text`, if there is one.
    pub fn from_name(text: &str) -> Option<Stream> {
        Stream::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Activity => "activity",
            Stream::Session => "session",
            Stream::Vault => "vault",
        }
    }
}

/// One journal row as chained. Its canonical JSON is the `body` column, laid out as
/// `{"head":{…},"payload":{…}}` (see [`RowHead`]).
#[derive(Clone, Debug, PartialEq)]
pub struct JournalRow {
    pub v: u32,
    pub seq: u64,
    pub at: Timestamp,
    /// What the row records; its stream follows ([`JournalRow::stream`]).
    pub event: Event,
    pub execution_id: Option<ExecutionId>,
    pub session_id: Option<SessionId>,
    /// The execution's state after this row (activity stream only).
    pub state: Option<ExecutionState>,
    /// SHA-256 (hex) of the stored result (`completed` rows only).
    pub result_sha256: Option<String>,
    /// Event-specific detail (never a secret).
    pub detail: Value,
}

/// The scalar facts of a row. In canonical order `head` sorts before `payload`, so a reader that
/// needs only these facts (audit cross-checks, listings) parses the head and stops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowHead {
    pub v: u32,
    pub seq: u64,
    pub at: Timestamp,
    pub stream: Stream,
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<ExecutionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ExecutionState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_sha256: Option<String>,
}

/// The stored shape of a row, as read back (the event is checked against the stream after).
#[derive(Deserialize)]
struct Stored {
    head: RowHead,
    payload: Value,
}

/// The stored shape of a row, as written (borrowing the payload).
#[derive(Serialize)]
struct StoredRef<'a> {
    head: RowHead,
    payload: &'a Value,
}

/// Every canonical body starts with this, because `head` is the first key in RFC 8785 order.
pub const HEAD_PREFIX: &[u8] = b"{\"head\":";

impl JournalRow {
    /// The stream the row is chained on: its event's.
    pub fn stream(&self) -> Stream {
        self.event.stream()
    }

    fn stored(&self) -> StoredRef<'_> {
        StoredRef {
            head: RowHead {
                v: self.v,
                seq: self.seq,
                at: self.at,
                stream: self.stream(),
                event: self.event.as_str().to_owned(),
                execution_id: self.execution_id,
                session_id: self.session_id,
                state: self.state,
                result_sha256: self.result_sha256.clone(),
            },
            payload: &self.detail,
        }
    }

    /// The RFC 8785 bytes that are stored and chained. The head's members are written here in
    /// RFC 8785 order (the journal writer's hot path); `canonical_is_rfc8785_of_the_stored_shape`
    /// checks the result against an independent canonicaliser over `StoredRef`.
    pub fn canonical(&self) -> Result<Vec<u8>, postern_core::CanonicalError> {
        fn member<T: Serialize + ?Sized>(out: &mut Vec<u8>, key: &[u8], value: &T) {
            out.extend_from_slice(key);
            serde_json::to_writer(&mut *out, value).expect("a row head serialises to a Vec");
        }
        let mut out = Vec::with_capacity(384);
        out.extend_from_slice(HEAD_PREFIX);
        member(&mut out, b"{\"at\":", &self.at);
        member(&mut out, b",\"event\":", self.event.as_str());
        if let Some(id) = &self.execution_id {
            member(&mut out, b",\"execution_id\":", id);
        }
        if let Some(sha) = &self.result_sha256 {
            member(&mut out, b",\"result_sha256\":", sha.as_str());
        }
        member(&mut out, b",\"seq\":", &self.seq);
        if let Some(id) = &self.session_id {
            member(&mut out, b",\"session_id\":", id);
        }
        if let Some(state) = &self.state {
            member(&mut out, b",\"state\":", state);
        }
        member(&mut out, b",\"stream\":", &self.stream());
        member(&mut out, b",\"v\":", &self.v);
        out.extend_from_slice(b"},\"payload\":");
        postern_core::canonical::write_canonical(&self.detail, &mut out)?;
        out.push(b'}');
        Ok(out)
    }

    /// Parses a stored body. An event its stream does not have makes the row unreadable.
    pub fn from_body(body: &[u8]) -> Result<Self, serde_json::Error> {
        let Stored { head, payload } = serde_json::from_slice(body)?;
        let event = Event::parse(head.stream, &head.event).ok_or_else(|| {
            <serde_json::Error as serde::de::Error>::custom(format!(
                "the {} stream has no event {:?}",
                head.stream.as_str(),
                head.event
            ))
        })?;
        Ok(JournalRow {
            v: head.v,
            seq: head.seq,
            at: head.at,
            event,
            execution_id: head.execution_id,
            session_id: head.session_id,
            state: head.state,
            result_sha256: head.result_sha256,
            detail: payload,
        })
    }
}

impl Serialize for JournalRow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.stored().serialize(s)
    }
}

/// The head's scalar fields located by byte scanning, for the hot path of `audit verify`.
///
/// Exact for canonical bodies because: `head` sorts before `payload`, so the head is everything
/// before the first `},"payload":`; the head holds only numbers and strings; and a raw `"` never
/// occurs inside a JSON string (it is escaped), so `"key":` patterns only match real keys. A
/// property test checks it against the full serde parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScannedHead<'a> {
    pub seq: u64,
    pub execution_id: Option<&'a [u8]>,
    pub state: Option<&'a [u8]>,
    pub result_sha256: Option<&'a [u8]>,
    pub stream: &'a [u8],
    pub event: &'a [u8],
}

impl ScannedHead<'_> {
    /// The row's event, if its stream has it (`None` for an event its stream lacks: a row
    /// written by another version, or edited).
    pub fn event(&self) -> Option<Event> {
        let stream = Stream::from_name(std::str::from_utf8(self.stream).ok()?)?;
        Event::parse(stream, std::str::from_utf8(self.event).ok()?)
    }
}

pub fn scan_head(body: &[u8]) -> Option<ScannedHead<'_>> {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Built once: constructing a searcher costs more than searching a 200-byte head.
    static HEAD_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"},\"payload\":"));
    static SEQ: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"seq\":"));
    static EXECUTION_ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"execution_id\":\""));
    static STATE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"state\":\""));
    static RESULT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"result_sha256\":\""));
    static STREAM: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"stream\":\""));
    static EVENT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"event\":\""));
    let rest = body.strip_prefix(HEAD_PREFIX)?;
    let head = &rest[..HEAD_END.find(rest)? + 1];
    let string = |key: &Finder<'_>| -> Option<&[u8]> {
        let at = key.find(head)? + key.needle().len();
        let len = memchr::memchr(b'"', &head[at..])?;
        Some(&head[at..at + len])
    };
    let seq_at = SEQ.find(head)? + SEQ.needle().len();
    let digits = head[seq_at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let seq = std::str::from_utf8(&head[seq_at..seq_at + digits]).ok()?.parse().ok()?;
    Some(ScannedHead {
        seq,
        execution_id: string(&EXECUTION_ID),
        state: string(&STATE),
        result_sha256: string(&RESULT),
        stream: string(&STREAM)?,
        event: string(&EVENT)?,
    })
}

/// Reads only the head of a canonical body, stopping before the payload.
pub fn read_head(body: &[u8]) -> Option<RowHead> {
    let rest = body.strip_prefix(HEAD_PREFIX)?;
    serde_json::Deserializer::from_slice(rest).into_iter::<RowHead>().next()?.ok()
}

/// A row read back, with its chain hash. Serialises flat (for `--json` output and the app):
/// `{"seq":…,"at":…,"event":…,…,"detail":{…},"row_hash":"sha256:…"}`.
#[derive(Clone, Debug, PartialEq)]
pub struct JournalEntry {
    pub row: JournalRow,
    pub row_hash: HashHex,
}

impl Serialize for JournalEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            #[serde(flatten)]
            head: RowHead,
            detail: &'a Value,
            row_hash: HashHex,
        }
        Flat { head: self.row.stored().head, detail: &self.row.detail, row_hash: self.row_hash }.serialize(s)
    }
}

/// The payload member of a folded row: the lifecycle steps a read-only call took before its
/// first byte left (`authorized`, `dispatched`, each with its time and detail), recorded on its
/// `accepted` row instead of a row each. Nothing waits between those steps, so one row says as
/// much as three; a call that waits for anything (an approval, a question, a join) keeps a row
/// per step.
pub const FOLDED_STEPS: &str = "steps";

/// One step a folded row records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FoldedStep {
    pub state: ExecutionState,
    pub at: Timestamp,
    pub detail: Value,
}

/// Why a folded row cannot be read as its steps.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    #[error("its steps do not read: {0}")]
    Unreadable(String),
    #[error("its steps are not a lifecycle: {0}")]
    Illegal(#[from] postern_core::IllegalTransition),
    #[error("its steps end at {ended} but the row says {row}")]
    Ends { ended: ExecutionState, row: ExecutionState },
}

impl JournalRow {
    /// The row's head with an empty payload (to build another step of the same row from).
    fn clone_head(&self) -> JournalRow {
        JournalRow {
            v: self.v,
            seq: self.seq,
            at: self.at,
            event: self.event,
            execution_id: self.execution_id,
            session_id: self.session_id,
            state: self.state,
            result_sha256: None,
            detail: Value::Null,
        }
    }

    /// An `accepted` row whose state is already beyond `accepted`: a folded row.
    pub fn is_folded(&self) -> bool {
        self.event == Event::Step(ExecutionState::Accepted) && self.state.is_some_and(|s| s != ExecutionState::Accepted)
    }

    /// The steps a folded row records after `accepted`, checked: each a legal transition from
    /// the one before, starting at `accepted` and ending at the state the row's head names.
    /// Empty for a row that is not folded.
    pub fn folded_steps(&self) -> Result<Vec<FoldedStep>, FoldError> {
        if !self.is_folded() {
            return Ok(Vec::new());
        }
        let steps: Vec<FoldedStep> = serde_json::from_value(self.detail.get(FOLDED_STEPS).cloned().unwrap_or_default())
            .map_err(|e| FoldError::Unreadable(e.to_string()))?;
        let state = ExecutionState::Accepted.walk(steps.iter().map(|step| step.state))?;
        match self.state {
            Some(row) if row != state => Err(FoldError::Ends { ended: state, row }),
            _ => Ok(steps),
        }
    }
}

impl JournalEntry {
    /// The entry as one entry per lifecycle step: a folded row becomes its `accepted` step (its
    /// detail without the folded steps) followed by each step it records, all with the row's
    /// sequence number and hash; any other row is itself. A folded row whose steps do not read
    /// stays as stored (`postern audit verify` reports it).
    pub fn unfold(self) -> Vec<JournalEntry> {
        let steps = match self.row.folded_steps() {
            Ok(steps) if !steps.is_empty() => steps,
            _ => return vec![self],
        };
        let JournalEntry { mut row, row_hash } = self;
        if let Value::Object(m) = &mut row.detail {
            m.remove(FOLDED_STEPS);
        }
        row.state = Some(ExecutionState::Accepted);
        let mut out = Vec::with_capacity(steps.len() + 1);
        for step in steps {
            let at_step = JournalRow {
                event: Event::Step(step.state),
                state: Some(step.state),
                at: step.at,
                detail: step.detail,
                result_sha256: None,
                ..row.clone_head()
            };
            out.push(JournalEntry { row: at_step, row_hash });
        }
        out.insert(0, JournalEntry { row, row_hash });
        out
    }
}

/// The end of the chain: how many rows, and the last row's hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalHead {
    pub size: u64,
    pub hash: HashHex,
}

impl JournalHead {
    pub const EMPTY: JournalHead = JournalHead { size: 0, hash: HashHex(GENESIS) };
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
        let hex_part = s.strip_prefix("sha256:").ok_or("hash must start with sha256:")?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|e| format!("hash is not 64 hex digits: {e}"))?;
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
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn row_strategy() -> impl Strategy<Value = JournalRow> {
        let detail = prop_oneof![
            Just(json!({})),
            "\\PC{0,40}".prop_map(|s| json!({"note": s, "seq": 99, "state": "x\"y", "nested": {"execution_id": s}})),
            "\\PC{0,40}".prop_map(|s| json!({"},\"payload\":": s, "\"seq\":1": [s]})),
        ];
        (1u64..(1 << 53), any::<bool>(), 0usize..11, any::<bool>(), detail, 0i64..(1 << 47)).prop_map(
            |(seq, activity, state, with_result, detail, at)| JournalRow {
                v: ROW_VERSION,
                seq,
                at: Timestamp::from_millis(at),
                event: if activity {
                    Event::Note(crate::event::ActivityNote::RetryReceived)
                } else {
                    Event::Session(crate::event::SessionEvent::SessionStarted)
                },
                execution_id: activity.then(|| ExecutionId::from_parts(Timestamp::from_millis(at), u128::from(seq))),
                session_id: Some(SessionId::from_parts(Timestamp::from_millis(at), 7)),
                state: activity.then(|| ExecutionState::ALL[state]),
                result_sha256: (activity && with_result).then(|| "ab".repeat(32)),
                detail,
            },
        )
    }

    proptest! {
        #[test]
        fn scanning_the_head_agrees_with_parsing_it(
            mut row in row_strategy(),
            event in proptest::sample::select(Event::all().collect::<Vec<_>>()),
        ) {
            row.event = event;
            let body = row.canonical().expect("canonical");
            let scanned = scan_head(&body).expect("scans");
            let parsed = read_head(&body).expect("parses");
            prop_assert_eq!(scanned.seq, parsed.seq);
            prop_assert_eq!(scanned.execution_id.map(<[u8]>::to_vec), parsed.execution_id.map(|e| e.to_string().into_bytes()));
            prop_assert_eq!(scanned.state.map(<[u8]>::to_vec), parsed.state.map(|s| s.as_str().as_bytes().to_vec()));
            prop_assert_eq!(scanned.result_sha256.map(<[u8]>::to_vec), parsed.result_sha256.map(String::into_bytes));
            prop_assert_eq!(scanned.stream, parsed.stream.as_str().as_bytes());
            prop_assert_eq!(scanned.event, parsed.event.as_bytes());
            prop_assert_eq!(scanned.event(), Some(row.event));
            prop_assert_eq!(JournalRow::from_body(&body).expect("round trip"), row);
        }
    }

    fn folded(steps: Value, state: ExecutionState) -> JournalRow {
        JournalRow {
            v: ROW_VERSION,
            seq: 7,
            at: Timestamp::from_millis(1_000),
            event: Event::Step(ExecutionState::Accepted),
            execution_id: Some(ExecutionId::from_parts(Timestamp::from_millis(1_000), 3)),
            session_id: None,
            state: Some(state),
            result_sha256: None,
            detail: json!({"tool": "get_items", FOLDED_STEPS: steps}),
        }
    }

    #[test]
    fn a_folded_row_unfolds_into_its_steps_with_its_seq_and_hash() {
        use ExecutionState::*;
        let row = folded(
            json!([
                {"state": "authorized", "at": 1_001, "detail": {"rung": "allowlist"}},
                {"state": "dispatched", "at": 1_002, "detail": {"method": "GET"}},
            ]),
            Dispatched,
        );
        let hash = HashHex([9; 32]);
        let steps = JournalEntry { row: row.clone(), row_hash: hash }.unfold();
        let seen: Vec<_> = steps.iter().map(|e| (e.row.event, e.row.state, e.row.at.as_millis(), e.row.seq)).collect();
        assert_eq!(
            seen,
            vec![
                (Event::Step(Accepted), Some(Accepted), 1_000, 7),
                (Event::Step(Authorized), Some(Authorized), 1_001, 7),
                (Event::Step(Dispatched), Some(Dispatched), 1_002, 7),
            ]
        );
        assert!(steps.iter().all(|e| e.row_hash == hash));
        assert_eq!(steps[0].row.detail, json!({"tool": "get_items"}), "the accepted step without the folded ones");
        assert_eq!(steps[1].row.detail, json!({"rung": "allowlist"}));
        // A row that is not folded is itself.
        let plain = JournalRow { state: Some(Accepted), ..row };
        assert_eq!(
            JournalEntry { row: plain.clone(), row_hash: hash }.unfold(),
            vec![JournalEntry { row: plain, row_hash: hash }]
        );
    }

    #[test]
    fn a_folded_row_that_is_not_a_lifecycle_says_why_and_stays_as_stored() {
        use ExecutionState::*;
        let cases = [
            (
                json!([{"state": "dispatched", "at": 1, "detail": {}}]),
                Dispatched,
                "illegal lifecycle transition from accepted to dispatched",
            ),
            (
                json!([{"state": "authorized", "at": 1, "detail": {}}]),
                Dispatched,
                "end at authorized but the row says dispatched",
            ),
            (json!("authorized"), Authorized, "do not read"),
            (json!([{"state": "authorized", "at": 1, "detail": {}, "secret": 1}]), Authorized, "do not read"),
            (json!([{"state": "paid", "at": 1, "detail": {}}]), Authorized, "do not read"),
        ];
        for (steps, state, why) in cases {
            let row = folded(steps, state);
            let err = row.folded_steps().unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            let entry = JournalEntry { row, row_hash: HashHex([1; 32]) };
            assert_eq!(entry.clone().unfold(), vec![entry]);
        }
    }

    proptest! {
        /// Whatever a folded row's payload holds, reading its steps never panics, succeeds exactly
        /// when the steps walk the state machine from `accepted` to the row's state, and an
        /// unfolded row has one entry per step after `accepted`.
        #[test]
        fn folded_steps_are_exactly_the_legal_walks(
            path in proptest::collection::vec(0usize..11, 0..5),
            end in 0usize..11,
            junk in "\\PC{0,12}",
        ) {
            let states: Vec<ExecutionState> = path.iter().map(|&i| ExecutionState::ALL[i]).collect();
            let end = ExecutionState::ALL[end];
            let steps: Vec<Value> = states.iter().map(|s| json!({"state": s, "at": 5, "detail": {"junk": junk}})).collect();
            let row = folded(Value::Array(steps), end);
            let mut walk = Ok(ExecutionState::Accepted);
            for s in &states {
                walk = walk.and_then(|w| w.transition(*s));
            }
            let legal = end != ExecutionState::Accepted && walk == Ok(end);
            match row.folded_steps() {
                Ok(read) if row.is_folded() => {
                    prop_assert!(legal);
                    prop_assert_eq!(read.len(), states.len());
                    let unfolded = JournalEntry { row, row_hash: HashHex([0; 32]) }.unfold();
                    prop_assert_eq!(unfolded.len(), if states.is_empty() { 1 } else { states.len() + 1 });
                }
                Ok(read) => prop_assert!(read.is_empty() && end == ExecutionState::Accepted),
                Err(_) => prop_assert!(!legal),
            }
        }
    }

    #[test]
    fn a_row_whose_stream_lacks_its_event_does_not_read() {
        let row = JournalRow {
            v: ROW_VERSION,
            seq: 1,
            at: Timestamp::from_millis(5),
            event: Event::Vault(crate::event::VaultEvent::CredentialAdded),
            execution_id: None,
            session_id: None,
            state: None,
            result_sha256: None,
            detail: json!({}),
        };
        let body = String::from_utf8(row.canonical().expect("canonical")).expect("utf-8");
        assert_eq!(JournalRow::from_body(body.as_bytes()).expect("reads"), row);
        for forged in [body.replace("\"vault\"", "\"session\""), body.replace("credential_added", "credential_granted")]
        {
            let err = JournalRow::from_body(forged.as_bytes()).unwrap_err().to_string();
            assert!(err.contains("has no event"), "{err}");
        }
    }

    proptest! {
        /// The hand-ordered head and the payload writer give byte for byte what an independent
        /// RFC 8785 implementation gives for the stored shape, hostile strings included.
        #[test]
        fn canonical_is_rfc8785_of_the_stored_shape(
            mut row in row_strategy(),
            event in proptest::sample::select(Event::all().collect::<Vec<_>>()),
            key in any::<String>(),
            text in any::<String>(),
            n in -(1i64 << 53) + 1..(1i64 << 53),
            f in any::<f64>().prop_filter("finite, not an unsafe integer", |f| f.is_finite() && (f.abs() < 9e15 || f.abs() >= 1e21)),
        ) {
            row.event = event;
            row.detail = json!({"note": text.clone(), key: [text, n, f, null, true, {"\u{e000}": 1, "\u{10000}": 2}]});
            let oracle = serde_json_canonicalizer::to_vec(&row.stored()).expect("the oracle canonicalises");
            prop_assert_eq!(row.canonical().expect("canonical"), oracle);
        }
    }

    #[test]
    fn a_body_that_is_not_a_row_does_not_scan() {
        assert!(scan_head(b"").is_none());
        assert!(scan_head(b"{\"payload\":{},\"head\":{\"seq\":1}}").is_none());
        assert!(scan_head(b"{\"head\":{\"seq\":1}").is_none());
    }
}
