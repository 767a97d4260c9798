//! `postern call`: the engine end to end from the command line, against a real HTTP server.

use crate::support::*;
use serde_json::Value;
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

/// A minimal HTTP/1.1 server on 127.0.0.1 that counts POSTs and answers 201.
fn counting_server() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let posts = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&posts);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            reader.read_line(&mut request_line).ok();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).ok();
            let n = if request_line.starts_with("POST") { counter.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
            let reply = format!("{{\"order\":{n}}}");
            let _ = write!(
                stream,
                "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (base, posts)
}

#[test]
fn call_runs_a_tool_and_the_same_scope_is_one_intent() {
    let (base, posts) = counting_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Some(dir.path());
    let tools = dir.path().join("tools.toml");
    std::fs::write(
        &tools,
        format!(
            "[[tool]]\nname = \"place_order\"\nmethod = \"POST\"\nurl = \"{base}/v1/orders\"\ncredential = \"shop\"\n\
             input_schema = {{ type = \"object\", required = [\"sku\"], properties = {{ sku = {{ type = \"string\" }} }} }}\n\
             contract = {{ class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\" }}\n"
        ),
    )
    .expect("write");
    let add = ["vault", "add", "shop", "--kind", "bearer", "--host", "127.0.0.1"];
    assert_eq!(postern_with(&add, d, Some("shop-token\n"), &[]).code, 0);
    let t = tools.to_str().expect("utf-8");
    let order = |scope: Option<&str>| {
        let mut args = vec!["call", "place_order", "--args", r#"{"sku":"A-1"}"#, "--tools", t, "--json"];
        if let Some(s) = scope {
            args.extend(["--scope", s]);
        }
        let run = postern(&args, d);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        serde_json::from_str::<Value>(&run.stdout).expect("json")
    };
    let first = order(Some("order-17"));
    assert_eq!(first["state"], "completed");
    assert_eq!(first["result"]["status"], 201);
    assert_eq!(posts.load(Ordering::SeqCst), 1);
    let again = order(Some("order-17"));
    assert_eq!(again["execution_id"], first["execution_id"], "same scope, same arguments: a retry");
    assert_eq!(again["decision"], "return_stored_result");
    assert_eq!(again["result"]["body"], first["result"]["body"]);
    assert_eq!(posts.load(Ordering::SeqCst), 1, "the retry was answered from the journal");
    let fresh = order(None);
    assert_ne!(fresh["execution_id"], first["execution_id"], "no scope: a new intent");
    assert_eq!(posts.load(Ordering::SeqCst), 2);

    let run = postern(&["call", "place_order", "--args", r#"{"sku":7}"#, "--tools", t], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("/sku"), "{}", run.stderr);
    let run = postern(&["call", "nope", "--tools", t], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("unknown tool \"nope\""), "{}", run.stderr);
}

/// `call` finds its manifest the way `serve` does (one lookup, in `postern-host`): with no
/// `tools.toml`, the built-in tools are there; a manifest named explicitly must exist.
#[test]
fn call_without_a_manifest_has_the_built_in_tools() {
    let (base, posts) = counting_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tempfile::tempdir().expect("config home");
    let env = [("XDG_CONFIG_HOME", config.path().to_str().expect("utf-8"))];
    let args = format!(r#"{{"method":"POST","url":"{base}/v1/orders","body":{{"sku":"A-1"}}}}"#);
    let run = postern_with(&["call", "http_request", "--args", &args, "--json"], Some(dir.path()), None, &env);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let out: Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(out["state"], "completed", "{out}");
    assert_eq!(posts.load(Ordering::SeqCst), 1);
    let missing = dir.path().join("missing.toml");
    let named = ["call", "http_request", "--args", &args, "--tools", missing.to_str().expect("utf-8")];
    let run = postern_with(&named, Some(dir.path()), None, &env);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("cannot read the tool manifest"), "{}", run.stderr);

    // `tools list` and `tools check` find it the same way.
    let listed = postern_with(&["tools", "list", "--json"], Some(dir.path()), None, &env);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let names: Vec<String> = serde_json::from_str::<Vec<Value>>(&listed.stdout)
        .expect("json")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, ["http_request", "ssh_exec"]);
    let checked = postern_with(&["tools", "check"], Some(dir.path()), None, &env);
    assert_eq!(checked.code, 0, "{}", checked.stderr);
    assert!(checked.stderr.contains("the built-in tools only"), "{}", checked.stderr);
    let named =
        postern_with(&["tools", "list", "--tools", missing.to_str().expect("utf-8")], Some(dir.path()), None, &env);
    assert_eq!(named.code, 2, "{}", named.stderr);
    assert!(named.stderr.contains("cannot read the tool manifest"), "{}", named.stderr);
}
