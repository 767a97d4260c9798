//! One reading of what delivery needs from a client's JSON-RPC message, for both doors: its id,
//! its method, the tool a `tools/call` names, the request a cancellation withdraws and the
//! response the bridge acknowledges. The socket reads it from the line it already parsed, the
//! Streamable HTTP guard from the POST's bytes; neither reads a field of its own.
//!
//! It is strict where a lenient reading would let delivery act on a message rmcp refuses: the
//! message and its `params` must be JSON objects (a struct read from an array would take
//! `[5, null]` as `{"requestId": 5}`), a member appears once, and each member it reads has its type.

use rmcp::model::NumberOrString;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::fmt;

/// The bridge's first line: "I am `postern mcp`, and I acknowledge what I relay".
pub const BRIDGE_HELLO_METHOD: &str = "notifications/postern/bridge";
/// The bridge's acknowledgement of a response it wrote and flushed to the agent.
pub const DELIVERED_METHOD: &str = "notifications/postern/delivered";

/// The members of one JSON-RPC message that delivery acts on.
#[derive(Debug, Default, PartialEq)]
pub struct MessageHead {
    id: Option<NumberOrString>,
    method: Option<String>,
    params: ParamsHead,
}

#[derive(Debug, Default, PartialEq)]
struct ParamsHead {
    /// `notifications/cancelled`: the request withdrawn.
    request_id: Option<NumberOrString>,
    /// `tools/call`: the tool.
    name: Option<String>,
    /// The bridge's `notifications/postern/delivered`: the response acknowledged.
    id: Option<NumberOrString>,
}

impl MessageHead {
    /// The head of one message's bytes; `None` for a batch, a non-object or a member of the
    /// wrong type (rmcp refuses those too).
    pub fn parse(bytes: &[u8]) -> Option<MessageHead> {
        serde_json::from_slice(bytes).ok()
    }

    /// The head of a message already parsed.
    pub fn read(value: &serde_json::Value) -> Result<MessageHead, serde_json::Error> {
        <MessageHead as serde::Deserialize>::deserialize(value)
    }

    /// The request id: `None` for a notification.
    pub fn id(&self) -> Option<&NumberOrString> {
        self.id.as_ref()
    }

    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// The tool a `tools/call` request names.
    pub fn tool(&self) -> Option<&str> {
        (self.method() == Some("tools/call") && self.id.is_some()).then_some(self.params.name.as_deref()).flatten()
    }

    /// The request a `notifications/cancelled` withdraws.
    pub fn withdrawn(&self) -> Option<&NumberOrString> {
        self.notification("notifications/cancelled").then_some(self.params.request_id.as_ref()).flatten()
    }

    /// Is this the bridge's hello?
    pub fn is_bridge_hello(&self) -> bool {
        self.notification(BRIDGE_HELLO_METHOD)
    }

    /// Is this the bridge's acknowledgement, and of which response (`None` inside: it names none
    /// that can be matched)?
    pub fn acknowledgement(&self) -> Option<Option<&NumberOrString>> {
        self.notification(DELIVERED_METHOD).then_some(self.params.id.as_ref())
    }

    fn notification(&self, method: &str) -> bool {
        self.id.is_none() && self.method() == Some(method)
    }
}

/// Reads one member's value, refusing a second appearance of it.
fn once<'de, A: MapAccess<'de>, T: serde::Deserialize<'de>>(
    slot: &mut Option<Option<T>>,
    map: &mut A,
    name: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

impl<'de> serde::Deserialize<'de> for MessageHead {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Head;
        impl<'de> Visitor<'de> for Head {
            type Value = MessageHead;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON-RPC message (an object)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MessageHead, A::Error> {
                let (mut id, mut method, mut params) = (None, None, None);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "id" => once(&mut id, &mut map, "id")?,
                        "method" => once(&mut method, &mut map, "method")?,
                        "params" => once(&mut params, &mut map, "params")?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(MessageHead {
                    id: id.flatten(),
                    method: method.flatten(),
                    params: params.flatten().unwrap_or_default(),
                })
            }
        }
        deserializer.deserialize_map(Head)
    }
}

impl<'de> serde::Deserialize<'de> for ParamsHead {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Params;
        impl<'de> Visitor<'de> for Params {
            type Value = ParamsHead;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("params as a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ParamsHead, A::Error> {
                let (mut request_id, mut name, mut id) = (None, None, None);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "requestId" => once(&mut request_id, &mut map, "requestId")?,
                        "name" => once(&mut name, &mut map, "name")?,
                        "id" => once(&mut id, &mut map, "id")?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ParamsHead { request_id: request_id.flatten(), name: name.flatten(), id: id.flatten() })
            }
        }
        deserializer.deserialize_map(Params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn both(message: &Value) -> Option<MessageHead> {
        let from_bytes = MessageHead::parse(&serde_json::to_vec(message).unwrap());
        let from_value = MessageHead::read(message).ok();
        assert_eq!(from_bytes, from_value, "the two doors read {message} alike");
        from_bytes
    }

    #[test]
    fn a_call_names_its_tool_and_a_cancellation_its_request() {
        let call =
            both(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "pay"}})).unwrap();
        assert_eq!((call.id(), call.tool(), call.withdrawn()), (Some(&NumberOrString::Number(7)), Some("pay"), None));
        let cancel =
            both(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}}))
                .unwrap();
        assert_eq!((cancel.id(), cancel.tool()), (None, None));
        assert_eq!(cancel.withdrawn(), Some(&NumberOrString::String("a".into())));
        let ack = both(&json!({"jsonrpc": "2.0", "method": DELIVERED_METHOD, "params": {"id": 3}})).unwrap();
        assert_eq!(ack.acknowledgement(), Some(Some(&NumberOrString::Number(3))));
        assert!(both(&json!({"jsonrpc": "2.0", "method": BRIDGE_HELLO_METHOD})).unwrap().is_bridge_hello());
    }

    #[test]
    fn a_member_is_read_only_where_its_method_gives_it_meaning() {
        // A cancellation sent as a request, or a call without an id, names nothing.
        let cancel = both(&json!({"id": 1, "method": "notifications/cancelled", "params": {"requestId": 5}})).unwrap();
        assert_eq!(cancel.withdrawn(), None);
        assert_eq!(both(&json!({"method": "tools/call", "params": {"name": "pay"}})).unwrap().tool(), None);
        // The agent's acknowledgement-shaped request is not the bridge's.
        assert_eq!(
            both(&json!({"id": 2, "method": DELIVERED_METHOD, "params": {"id": 3}})).unwrap().acknowledgement(),
            None
        );
    }

    #[test]
    fn what_rmcp_refuses_has_no_head() {
        for refused in [
            json!([{"id": 1, "method": "tools/call", "params": {"name": "pay"}}]),
            json!({"method": "notifications/cancelled", "params": [5, null]}),
            json!({"id": true, "method": "tools/call"}),
            json!({"id": 1, "method": 5}),
            json!({"id": 1, "method": "tools/call", "params": {"name": 5}}),
            json!("tools/call"),
        ] {
            assert_eq!(both(&refused), None, "{refused}");
        }
        let duplicate = br#"{"id": 1, "method": "tools/call", "params": {"name": "read", "name": "pay"}}"#;
        assert_eq!(MessageHead::parse(duplicate), None);
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic_and_a_head_read_twice_is_the_same(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let head = MessageHead::parse(&bytes);
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                // Bytes with a repeated member read as a Value keep the last; rmcp refuses them
                // from bytes, and so does the head.
                if head.is_some() {
                    prop_assert_eq!(head, MessageHead::read(&value).ok());
                }
            } else {
                prop_assert!(head.is_none());
            }
        }

        #[test]
        fn any_id_and_tool_read_back(id in prop_oneof![any::<i64>().prop_map(Value::from), ".*".prop_map(Value::from)], tool in ".*") {
            let head = both(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})).unwrap();
            prop_assert_eq!(head.tool(), Some(tool.as_str()));
            prop_assert!(head.id().is_some());
        }
    }
}
