//! The record builder over hostile arguments, methods, URLs and headers: never panics, and the
//! fingerprint depends only on the canonical bytes (building twice gives the same one).
#![no_main]
use libfuzzer_sys::fuzz_target;
use postern_core::{
    ActionRequest, ActionTarget, Actor, CanonicalAction, FingerprintKey, HttpAction, IntentScope, ReplayContract,
    SessionId, Timestamp,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\u{1}');
    let (method, url, header, args) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("{}"),
    );
    let Ok(arguments) = serde_json::from_str::<serde_json::Value>(args) else { return };
    let key = FingerprintKey::from_bytes([7; 32]);
    let mut contract = ReplayContract::read_only();
    contract.secret_fields.insert("pin".into());
    contract.semantic_headers.insert(header.to_ascii_lowercase());
    let request = ActionRequest {
        actor: Actor::process("/usr/bin/agent", "abc"),
        tool: "fuzz".into(),
        target: ActionTarget::Http(HttpAction {
            method: method.into(),
            url: url.into(),
            headers: vec![(header.into(), args.into())],
        }),
        credential_ref: None,
        arguments,
        intent_scope: IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1), 1)),
    };
    if let Ok(a) = CanonicalAction::build(&request, &contract, &key) {
        let b = CanonicalAction::build(&request, &contract, &key).expect("deterministic");
        assert_eq!(a.fingerprint(&key), b.fingerprint(&key));
        let reread: serde_json::Value = serde_json::from_slice(a.bytes()).expect("canonical bytes are JSON");
        let again = postern_core::canonical_bytes(&reread).expect("canonical bytes canonicalize");
        assert_eq!(again, a.bytes(), "the record's canonical bytes are a fixed point");
    }
});
