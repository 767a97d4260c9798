//! The one shape of a step's detail: why an execution reached a state. The engine writes it on
//! the step row and in the call's outcome; the doors (the agent's explanation, the task's
//! status) and the retry review read it back by field, never by key, and a row whose detail does
//! not have this shape reads as an error, not as an empty reason.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Why a step happened. Its named fields are the ones something reads back; anything else a
/// step records (the resend a recovery attempted, the marker's start time, …) rides in `more`
/// and is stored as it is. Serialized flat, so stored rows and MCP results keep their shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepDetail {
    /// What happened, in words an agent or a reviewer reads; [`CANCELLED`] for a call its
    /// client withdrew before the send.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A machine-readable code (`upstream_unavailable`, `approval_timed_out`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// An error's own message (a locked vault's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The rung of the approval ladder that decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rung: Option<String>,
    /// Who decided (a reviewer, `postern`, a policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// How an uncertain outcome can be settled (the contract's class, `ssh_marker`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
    /// Where a dispatched request went, as shown (`dispatched` rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The request's method (`dispatched` rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The digest of the request a `dispatched` row sent (a recovery re-sends only that one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_digest: Option<String>,
    /// Nothing was sent again (a retry or a recovery that stopped short).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_resent: bool,
    /// What else the step records.
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// The reason of a call its client cancelled before it was sent.
pub const CANCELLED: &str = "cancelled";

/// A stored detail that does not have the shape of a [`StepDetail`].
#[derive(Debug, thiserror::Error)]
#[error("a step's detail does not have its shape: {0}")]
pub struct UnreadableDetail(#[from] serde_json::Error);

impl StepDetail {
    /// A detail that says why, in words.
    pub fn because(reason: impl Into<String>) -> StepDetail {
        StepDetail { reason: Some(reason.into()), ..StepDetail::default() }
    }

    /// Reads a stored detail back: an absent one (`null`) reads as empty; a field of the wrong
    /// type is an error.
    pub fn read(stored: &Value) -> Result<StepDetail, UnreadableDetail> {
        match stored {
            Value::Null => Ok(StepDetail::default()),
            v => Ok(StepDetail::deserialize(v)?),
        }
    }

    /// With a machine-readable code.
    pub fn code(self, code: impl Into<String>) -> StepDetail {
        StepDetail { code: Some(code.into()), ..self }
    }

    /// With an error's message.
    pub fn message(self, message: impl Into<String>) -> StepDetail {
        StepDetail { message: Some(message.into()), ..self }
    }

    /// Decided on `rung` by `by`.
    pub fn decided(self, rung: impl Into<String>, by: impl Into<String>) -> StepDetail {
        StepDetail { rung: Some(rung.into()), by: Some(by.into()), ..self }
    }

    /// Settled, or to be settled, by `recovery`.
    pub fn recovery(self, recovery: impl Into<String>) -> StepDetail {
        StepDetail { recovery: Some(recovery.into()), ..self }
    }

    /// Nothing was sent again.
    pub fn not_resent(self) -> StepDetail {
        StepDetail { not_resent: true, ..self }
    }

    /// With another field the step records.
    pub fn with(mut self, key: &str, value: impl Serialize) -> StepDetail {
        self.more.insert(key.to_owned(), serde_json::to_value(value).unwrap_or(Value::Null));
        self
    }

    /// Whether the call was cancelled by its client before it was sent.
    pub fn is_cancelled(&self) -> bool {
        self.reason.as_deref() == Some(CANCELLED)
    }

    /// Applies `mask` to every text the detail holds (the outcome stage masks secrets so).
    pub fn mask_with(&mut self, mask: impl Fn(&mut Value)) {
        let named = [
            &mut self.reason,
            &mut self.code,
            &mut self.message,
            &mut self.rung,
            &mut self.by,
            &mut self.recovery,
            &mut self.target,
            &mut self.method,
            &mut self.request_digest,
        ];
        for field in named {
            if let Some(text) = field.take() {
                let mut v = Value::String(text);
                mask(&mut v);
                *field = Some(match v {
                    Value::String(masked) => masked,
                    other => other.to_string(),
                });
            }
        }
        self.more.values_mut().for_each(mask);
    }

    /// As the journal stores it.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl From<StepDetail> for Value {
    fn from(detail: StepDetail) -> Value {
        detail.to_value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_detail_is_stored_flat_and_reads_back_the_same() {
        let d = StepDetail::because("vault_locked")
            .message("the vault is locked")
            .not_resent()
            .with("resend", json!({"n": 1}));
        let stored = d.to_value();
        assert_eq!(
            stored,
            json!({ "reason": "vault_locked", "message": "the vault is locked", "not_resent": true, "resend": {"n": 1} })
        );
        assert_eq!(StepDetail::read(&stored).unwrap(), d);
    }

    #[test]
    fn an_absent_detail_is_empty_and_an_empty_one_stays_an_object() {
        assert_eq!(StepDetail::read(&Value::Null).unwrap(), StepDetail::default());
        assert_eq!(StepDetail::default().to_value(), json!({}));
    }

    #[test]
    fn a_field_of_the_wrong_type_does_not_read_as_no_reason() {
        for bad in [json!({ "reason": 7 }), json!({ "rung": ["x"] }), json!({ "not_resent": "yes" }), json!("text")] {
            assert!(StepDetail::read(&bad).is_err(), "{bad} read");
        }
    }

    #[test]
    fn only_a_cancelled_reason_is_a_cancellation() {
        assert!(StepDetail::because(CANCELLED).is_cancelled());
        assert!(!StepDetail::because("cancelled by the reviewer").is_cancelled());
        assert!(!StepDetail::default().is_cancelled());
    }

    proptest! {
        /// Whatever object a row holds, reading it either fails or keeps every field: nothing a
        /// step recorded is dropped on the way back.
        #[test]
        fn reading_a_stored_object_loses_nothing(
            fields in proptest::collection::btree_map(
                prop_oneof![Just("reason".to_owned()), Just("rung".to_owned()), Just("not_resent".to_owned()), "[a-z_]{1,8}"],
                prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::from), "[ -~]{0,12}".prop_map(Value::from), any::<i64>().prop_map(Value::from)],
                0..6,
            )
        ) {
            let stored = Value::Object(fields.into_iter().collect());
            if let Ok(read) = StepDetail::read(&stored) {
                let mut want = stored.as_object().cloned().unwrap_or_default();
                // An explicit `null` of a named field, or `not_resent: false`, is the same as none.
                want.retain(|k, v| !(v.is_null() && is_named(k) || k == "not_resent" && v == &Value::Bool(false)));
                prop_assert_eq!(read.to_value(), Value::Object(want));
            }
        }
    }

    fn is_named(key: &str) -> bool {
        ["reason", "code", "message", "rung", "by", "recovery", "target", "method", "request_digest", "not_resent"]
            .contains(&key)
    }
}
