//! MCP sessions over Streamable HTTP end to end: how many one agent token may hold, and the
//! 2026-07-28 revision, which has none.

use super::gateway::{initialize_request, post_initialize, post_mcp, post_sessionless_call, raw_http};
use super::gateway_support::{Gateway, Target};
use serde_json::{Value, json};

/// A gateway in front of a counting target, its HTTP address (`host:port`) and an agent token.
fn gateway_with_agent(agent: &str) -> (Target, Gateway, String, String) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let token = gw.add_agent(agent);
    (target, gw, addr, token)
}

/// One agent token cannot open MCP sessions without bound: beyond 64 open ones a new session is
/// refused with 429 `too_many_sessions` (journaled), whatever version its `initialize` names;
/// a 2026-07-28 call, which opens none, is still served; ending one makes room again, and only
/// what rmcp accepted counts (an unknown id takes no room; a refused DELETE makes none).
#[test]
fn an_agent_token_holds_a_bounded_number_of_sessions() {
    let (_target, _gw, addr, token) = gateway_with_agent("many");
    let auth = format!("Authorization: Bearer {token}\r\n");
    // Ids rmcp does not know (404) take no room: only sessions it opened count.
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    for n in 0..3 {
        let made_up = format!("{auth}Mcp-Session-Id: made-up-{n}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
        let (status, answer) = post_mcp(&addr, &made_up, ping);
        assert_eq!(status, 404, "{answer}");
    }
    let mut sessions = Vec::new();
    for n in 0..postern_gateway::door::streamable::MAX_SESSIONS_PER_AGENT {
        let (status, answer) = post_initialize(&addr, &auth);
        assert_eq!(status, 200, "session {n}: {answer}");
        sessions.push(session_id(&answer));
    }
    let (status, answer) = post_initialize(&addr, &auth);
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("too_many_sessions"), "{answer}");
    // Only an `initialize` opens a session: a 2026-07-28 call opens none and is served at the
    // cap; an `initialize` that names 2026-07-28 (rmcp still answers it with a session) is not.
    let (status, answer) = post_sessionless_call(&addr, &token, 7, "balance", json!({}));
    assert_eq!(status, 200, "a sessionless call at the cap: {answer}");
    assert!(answer.contains("\"completed\""), "{answer}");
    let modern = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2026-07-28","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let (status, answer) = post_mcp(&addr, &format!("{auth}MCP-Protocol-Version: 2026-07-28\r\n"), modern);
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("too_many_sessions"), "{answer}");
    let delete = |version: &str| {
        raw_http(
            &addr,
            &format!(
                "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\n{auth}Mcp-Session-Id: {}\r\n\
                 MCP-Protocol-Version: {version}\r\nConnection: close\r\n\r\n",
                sessions[0]
            ),
        )
    };
    // A DELETE rmcp refuses (it takes none at 2026-07-28) ends nothing and makes no room.
    let (refused, answer) = delete("2026-07-28");
    assert!(refused >= 400, "{answer}");
    let (status, answer) = post_initialize(&addr, &auth);
    assert_eq!(status, 429, "no room after a refused DELETE: {answer}");
    let (deleted, answer) = delete("2025-11-25");
    assert!(deleted < 300, "{answer}");
    let (status, answer) = post_initialize(&addr, &auth);
    assert_eq!(status, 200, "room again after one ended: {answer}");
}

/// The session id in an `initialize` answer.
fn session_id(answer: &str) -> String {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .unwrap_or_else(|| panic!("no session id: {answer}"))
        .trim()
        .to_owned()
}

/// Many `initialize`s sent at once cannot all pass a count taken before any of them was
/// answered: exactly the cap's worth of sessions opens, and the rest are refused.
#[test]
fn sessions_opened_at_once_are_held_to_the_cap() {
    let (_target, _gw, addr, token) = gateway_with_agent("eager");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let cap = postern_gateway::door::streamable::MAX_SESSIONS_PER_AGENT;
    let barrier = std::sync::Barrier::new(cap + 32);
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let sending: Vec<_> = (0..cap + 32)
            .map(|_| {
                let (addr, auth, barrier) = (&addr, &auth, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    post_initialize(addr, auth).0
                })
            })
            .collect();
        sending.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let opened = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((opened, refused), (cap, 32), "{statuses:?}");
}

/// An `initialize` whose client hangs up before the answer still opens a session in rmcp (kept
/// for the client to carry on in): it counts like any other, so a token cannot open sessions
/// without bound by hanging up on each. Every session rmcp opens is remembered in the database:
/// with those the clients that hung up opened, the ones still allowed make the cap exactly.
#[test]
fn a_session_whose_client_hung_up_still_counts() {
    use std::io::Write;
    let (_target, gw, addr, token) = gateway_with_agent("hasty");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let cap = postern_gateway::door::streamable::MAX_SESSIONS_PER_AGENT;
    let request = initialize_request(&addr, &auth);
    std::thread::scope(|scope| {
        for _ in 0..cap + 16 {
            scope.spawn(|| {
                let mut stream = std::net::TcpStream::connect(&addr).unwrap();
                stream.write_all(request.as_bytes()).unwrap();
                drop(stream);
            });
        }
    });
    let remembered = || -> usize {
        let db = rusqlite::Connection::open(gw.path().join("postern.db")).unwrap();
        db.query_row("SELECT count(*) FROM mcp_sessions", [], |row| row.get::<_, i64>(0)).unwrap() as usize
    };
    // Those still under way hold their places: the sessions allowed now and the ones the clients
    // that hung up opened come to the cap exactly, never more.
    let allowed = (0..=cap).take_while(|_| post_initialize(&addr, &auth).0 == 200).count();
    let mut opened = remembered();
    for _ in 0..120 {
        assert!(opened <= cap, "{opened} sessions opened past the cap ({allowed} allowed after the hang-ups)");
        if opened == cap {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
        opened = remembered();
    }
    assert_eq!(opened, cap, "{allowed} allowed after the hang-ups");
}

/// A session Postern remembers across a restart (rmcp restores it when it is used) counts again
/// when it is used, as a new one would: a token at its cap cannot bring back its old sessions
/// on top of as many new ones.
#[test]
fn a_remembered_session_used_again_counts_under_the_cap() {
    let (target, gw, addr, token) = gateway_with_agent("returning");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let cap = postern_gateway::door::streamable::MAX_SESSIONS_PER_AGENT;
    let open_all = |addr: &str| -> Vec<String> {
        (0..cap)
            .map(|n| {
                let (status, answer) = post_initialize(addr, &auth);
                assert_eq!(status, 200, "session {n}: {answer}");
                session_id(&answer)
            })
            .collect()
    };
    let old = open_all(&addr);
    let gw = gw.crash_and_restart(&target.manifest());
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let new = open_all(&addr);
    let ping = |session: &str| {
        let headers = format!("{auth}Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
        post_mcp(&addr, &headers, r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
    };
    let (status, answer) = ping(&old[0]);
    assert_eq!(status, 429, "an old session on top of {cap} new ones: {answer}");
    assert!(answer.contains("too_many_sessions"), "{answer}");
    let (status, answer) = ping(&new[0]);
    assert_eq!(status, 200, "a session that counts is served at the cap: {answer}");
    let delete = format!(
        "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\n{auth}Mcp-Session-Id: {}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nConnection: close\r\n\r\n",
        new[1]
    );
    let (deleted, answer) = raw_http(&addr, &delete);
    assert!(deleted < 300, "{answer}");
    let (status, answer) = ping(&old[0]);
    assert_eq!(status, 200, "with room, the remembered session is restored: {answer}");
    let (status, answer) = post_initialize(&addr, &auth);
    assert_eq!(status, 429, "the restored session took the room: {answer}");
}

/// A client speaking protocol 2026-07-28 (no session: the version, capabilities and client in
/// each request's `_meta`) gets a `tools/call` answer as one `application/json` body, not an SSE
/// stream; its retry of a payment whose answer it lost is recognised (same process, same agent
/// run) and answered from the first execution, and the target is paid once.
#[test]
fn a_sessionless_client_gets_json_answers_and_its_retry_is_not_a_second_payment() {
    let (target, gw, addr, token) = gateway_with_agent("modern");
    let call = |id: u32| post_sessionless_call(&addr, &token, id, "pay", json!({"amount": 7}));
    let answer_of = |raw: &str| -> Value {
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    };
    let (status, first) = call(1);
    assert_eq!(status, 200, "{first}");
    let first = answer_of(&first);
    let id = first["result"]["structuredContent"]["execution_id"].as_str().unwrap_or_else(|| panic!("{first}"));
    assert_eq!(first["result"]["structuredContent"]["state"], "completed", "{first}");
    let (status, retry) = call(2);
    assert_eq!(status, 200, "{retry}");
    let retry = answer_of(&retry);
    assert_eq!(retry["result"]["structuredContent"]["execution_id"], id, "{retry}");
    assert_eq!(target.payments(), 1, "a retry of a sessionless client paid again");
    assert_eq!(gw.executions_of("pay"), vec![id.to_owned()]);
}
