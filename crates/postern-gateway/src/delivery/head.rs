//! One reading of what delivery needs from a client's JSON-RPC message, for both doors: its id,
//! its method, the tool a `tools/call` names, the request a cancellation withdraws and the
//! response the bridge acknowledges. It is read from the message as rmcp parsed it, never from
//! the raw JSON beside it: rmcp reads a `notifications/cancelled` whose params do not fit as a
//! custom notification (which cancels nothing), and ignores members it does not know, so any
//! reading of its own would disagree with what the handler runs (a request id freed while its
//! call still runs, or a call delivery does not follow).

use rmcp::{
    RoleServer,
    model::{ClientNotification, ClientRequest, JsonRpcMessage, NumberOrString},
    service::RxJsonRpcMessage,
};

/// The bridge's first line: "I am `postern mcp`, and I acknowledge what I relay".
pub const BRIDGE_HELLO_METHOD: &str = "notifications/postern/bridge";
/// The bridge's acknowledgement of a response it wrote and flushed to the agent.
pub const DELIVERED_METHOD: &str = "notifications/postern/delivered";
/// The prefix of the bridge's own methods: an agent's line that uses one is dropped.
pub const BRIDGE_METHOD_PREFIX: &str = "notifications/postern/";

/// What delivery acts on in one message rmcp accepted.
#[derive(Debug, Default, PartialEq)]
pub struct MessageHead {
    id: Option<NumberOrString>,
    method: Option<String>,
    tool: Option<String>,
    withdrawn: Option<NumberOrString>,
    acknowledgement: Option<Option<NumberOrString>>,
    hello: bool,
}

impl MessageHead {
    /// The head of a message as rmcp parsed it.
    pub fn of(message: &RxJsonRpcMessage<RoleServer>) -> MessageHead {
        match message {
            JsonRpcMessage::Request(r) => MessageHead {
                id: Some(r.id.clone()),
                method: Some(r.request.method().to_owned()),
                tool: match &r.request {
                    ClientRequest::CallToolRequest(call) => Some(call.params.name.to_string()),
                    _ => None,
                },
                ..MessageHead::default()
            },
            JsonRpcMessage::Notification(n) => match &n.notification {
                ClientNotification::CancelledNotification(c) => MessageHead {
                    method: Some("notifications/cancelled".to_owned()),
                    withdrawn: c.params.request_id.clone(),
                    ..MessageHead::default()
                },
                ClientNotification::CustomNotification(c) => MessageHead {
                    method: Some(c.method.clone()),
                    hello: c.method == BRIDGE_HELLO_METHOD,
                    acknowledgement: (c.method == DELIVERED_METHOD).then(|| {
                        let id = c.params.as_ref().and_then(|p| p.get("id"));
                        id.and_then(|id| serde_json::from_value(id.clone()).ok())
                    }),
                    ..MessageHead::default()
                },
                _ => MessageHead::default(),
            },
            _ => MessageHead::default(),
        }
    }

    /// The head of one message's bytes, if rmcp accepts them as a client message.
    pub fn parse(bytes: &[u8]) -> Option<MessageHead> {
        serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(bytes).ok().map(|m| MessageHead::of(&m))
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
        self.tool.as_deref()
    }

    /// The request a `notifications/cancelled` withdraws.
    pub fn withdrawn(&self) -> Option<&NumberOrString> {
        self.withdrawn.as_ref()
    }

    /// Is this the bridge's hello?
    pub fn is_bridge_hello(&self) -> bool {
        self.hello
    }

    /// Is this the bridge's acknowledgement, and of which response (`None` inside: it names none
    /// that can be matched)?
    pub fn acknowledgement(&self) -> Option<Option<&NumberOrString>> {
        self.acknowledgement.as_ref().map(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn head(message: &Value) -> Option<MessageHead> {
        MessageHead::parse(&serde_json::to_vec(message).unwrap())
    }

    #[test]
    fn a_call_names_its_tool_and_a_cancellation_its_request() {
        let call =
            head(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "pay"}})).unwrap();
        assert_eq!((call.id(), call.tool(), call.withdrawn()), (Some(&NumberOrString::Number(7)), Some("pay"), None));
        let cancel =
            head(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}}))
                .unwrap();
        assert_eq!((cancel.id(), cancel.tool()), (None, None));
        assert_eq!(cancel.withdrawn(), Some(&NumberOrString::String("a".into())));
        let ack = head(&json!({"jsonrpc": "2.0", "method": DELIVERED_METHOD, "params": {"id": 3}})).unwrap();
        assert_eq!(ack.acknowledgement(), Some(Some(&NumberOrString::Number(3))));
        assert!(head(&json!({"jsonrpc": "2.0", "method": BRIDGE_HELLO_METHOD})).unwrap().is_bridge_hello());
    }

    /// What rmcp reads otherwise than a reading of the raw JSON would (an attacker review's
    /// findings): the head follows rmcp.
    #[test]
    fn the_head_is_what_rmcp_runs() {
        // A cancellation whose params do not fit is a custom notification to rmcp: it cancels
        // nothing, so it frees no request id.
        let odd =
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5, "reason": 0}});
        assert_eq!(head(&odd).unwrap().withdrawn(), None);
        // A member rmcp ignores does not hide the call from delivery.
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "pay", "arguments": {}, "id": true}});
        assert_eq!(head(&call).unwrap().tool(), Some("pay"));
        // A call rmcp cannot read as one is not a call.
        let custom =
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "pay", "arguments": []}});
        assert_eq!(head(&custom).and_then(|h| h.tool().map(str::to_owned)), None);
        // An acknowledgement-shaped request is not the bridge's notification.
        let request = json!({"jsonrpc": "2.0", "id": 2, "method": DELIVERED_METHOD, "params": {"id": 3}});
        assert_eq!(head(&request).map(|h| h.acknowledgement().is_some()), Some(false));
    }

    #[test]
    fn what_rmcp_refuses_has_no_head() {
        for refused in [
            json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "pay"}}]),
            json!({"jsonrpc": "2.0", "id": null, "method": "notifications/cancelled", "params": {"requestId": 5}}),
            json!({"id": 1, "method": "tools/call", "params": {"name": "pay"}}),
            json!({"jsonrpc": "2.0", "id": true, "method": "tools/call"}),
            json!("tools/call"),
        ] {
            assert_eq!(head(&refused), None, "{refused}");
        }
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let head = MessageHead::parse(&bytes);
            if serde_json::from_slice::<Value>(&bytes).is_err() {
                prop_assert!(head.is_none());
            }
        }

        #[test]
        fn any_id_and_tool_read_back(id in prop_oneof![any::<i64>().prop_map(Value::from), ".*".prop_map(Value::from)], tool in ".*") {
            let head = head(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})).unwrap();
            prop_assert_eq!(head.tool(), Some(tool.as_str()));
            prop_assert!(head.id().is_some());
        }
    }
}
