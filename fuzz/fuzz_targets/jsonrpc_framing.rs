//! The JSON-RPC framing Postern reads itself: the bridge's lines (which agent lines are its own
//! delivery notifications, which gateway lines it acknowledges) and the Streamable HTTP guard's
//! message head. Never a panic; an acknowledgement is always one line naming a string or number id.
#![no_main]
use libfuzzer_sys::fuzz_target;
use postern_gateway::{delivery::head::MessageHead, door::socket};

fuzz_target!(|data: &[u8]| {
    let _ = socket::is_bridge_notification(data);
    if let Some(ack) = socket::delivered_ack_line(data) {
        assert_eq!(ack.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&ack).expect("JSON");
        assert!(v["params"]["id"].is_string() || v["params"]["id"].is_number());
        assert!(socket::is_bridge_notification(&ack), "the bridge's own line is recognised");
    }
    if let Some(head) = MessageHead::parse(data) {
        let _ = (head.tool(), head.withdrawn());
    }
});
