//! Throughput of building and fingerprinting a typical canonical action record.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use postern_core::{
    ActionRequest, ActionTarget, Actor, AttachWindow, CanonicalAction, FingerprintKey, HttpAction, IntentScope,
    ReplayClass, ReplayContract, SessionId, Timestamp,
};
use serde_json::json;
use std::hint::black_box;

fn typical() -> (ActionRequest, ReplayContract) {
    let contract = ReplayContract {
        class: ReplayClass::IdempotencyKey,
        idempotency_header: Some("Idempotency-Key".into()),
        defaults: [("region".to_string(), json!("us-east-1"))].into(),
        secret_fields: ["approval_code".to_string()].into(),
        semantic_headers: ["content-type".to_string()].into(),
        attach_window: AttachWindow::Millis(900_000),
        ..ReplayContract::read_only()
    };
    let request = ActionRequest {
        actor: Actor::process("/usr/bin/claude", "9f2c4b1e0d6a7c5b3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d"),
        tool: "deploy_release".into(),
        target: ActionTarget::Http(HttpAction {
            method: "POST".into(),
            url: "https://deploy-api.internal.example/v1/releases?dry_run=false&notify=team".into(),
            headers: vec![("Content-Type".into(), "application/json".into())],
        }),
        credential_ref: Some("deploy-service".into()),
        arguments: json!({"service": "catalog", "version": "2026.07.22", "approval_code": "x7-canary",
                          "replicas": 6, "labels": {"team": "search", "tier": "gold"}}),
        intent_scope: IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1_764_445_000_000), 7)),
    };
    (request, contract)
}

fn bench(c: &mut Criterion) {
    let key = FingerprintKey::from_bytes([9; 32]);
    let (request, contract) = typical();
    let mut group = c.benchmark_group("fingerprint");
    group.throughput(Throughput::Elements(1));
    group.bench_function("canonicalise_and_fingerprint_typical_record", |b| {
        b.iter(|| {
            let action = CanonicalAction::build(black_box(&request), &contract, &key).expect("builds");
            black_box(action.fingerprint(&key))
        })
    });
    let action = CanonicalAction::build(&request, &contract, &key).expect("builds");
    group.bench_function("hmac_only_over_canonical_bytes", |b| {
        b.iter(|| black_box(key.fingerprint(black_box(action.bytes()))))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
