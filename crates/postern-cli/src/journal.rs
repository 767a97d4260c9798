//! `postern status`, `activity`, `sessions` and `execution show`: reading the journals.

use crate::{Failure, location, render};
use anyhow::{Context, anyhow};
use postern_core::{ExecutionId, ExecutionState, Outside, SessionId};
use postern_store::{ActivityFilter, ActivityNote, Event, JournalEntry, JournalView, StoreError, Unusable};
use serde_json::json;
use std::{path::Path, process::ExitCode};

/// Opens the journal read-only, with a hint when there is none yet.
pub fn view(data_dir: &Path) -> Result<JournalView, Failure> {
    let db = location::database(data_dir);
    JournalView::open_read_only(&db).map_err(|e| match e {
        StoreError::Unusable { problem: Unusable::Missing, .. } => Failure {
            code: 2,
            error: anyhow!(
                "no Postern journal at {} (run `postern status` to create one, or pass --data-dir)",
                db.display()
            ),
        },
        other => other.into(),
    })
}

fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    render::print_json(value).context("encode JSON")?;
    Ok(())
}

/// `postern status`: opens (or creates) the journal and recovers it — or, while a gateway holds
/// it, reads it and asks that gateway about itself.
pub fn status(data_dir: &Path, as_json: bool) -> Result<ExitCode, Failure> {
    let db = location::database(data_dir);
    let (recovered, gateway) = match postern_host::open_journal(data_dir, postern_host::now()) {
        // Opened (created if new) and recovered; it is read below like any journal.
        Ok((_store, recovery)) => (recovery.outcome_unknown, None),
        Err(postern_host::HostError::InUse { .. }) => {
            let answer =
                crate::route::perform(data_dir, postern_gateway::door::control::ControlRequest::GatewayStatus)?;
            let info: postern_gateway::door::control::GatewayInfo =
                serde_json::from_value(answer).context("read the gateway's status")?;
            (vec![], Some(info))
        }
        Err(e) => return Err(e.into()),
    };
    let view = view(data_dir)?;
    let head = view.head()?;
    let states = view.state_counts()?;
    let sessions = view.sessions()?;
    let export = view.export_cursor(postern_otel::CURSOR)?;
    let lag = export.as_ref().map(|c| head.size.saturating_sub(c.seq));
    if as_json {
        print_json(&json!({
            "export": export.as_ref().map(|c| json!({
                "otlp": c, "lag_rows": lag,
            })),
            "data_dir": data_dir.display().to_string(),
            "database": db.display().to_string(),
            "schema_version": postern_store::supported_version(),
            "journal": head,
            "executions_by_state": states.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "active_sessions": sessions.iter().filter(|s| s.ended_at.is_none()).count(),
            "recovered_to_outcome_unknown": recovered,
            "gateway": gateway,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("data dir    {}", data_dir.display());
    println!("database    {} (schema v{})", db.display(), postern_store::supported_version());
    println!("journal     {} rows, head {}", head.size, head.hash);
    let total: i64 = states.iter().map(|(_, n)| n).sum();
    let by_state: Vec<String> = states.iter().map(|(s, n)| format!("{s} {n}")).collect();
    println!(
        "executions  {total}{}",
        if by_state.is_empty() { String::new() } else { format!(" ({})", by_state.join(", ")) }
    );
    println!("sessions    {} ({} active)", sessions.len(), sessions.iter().filter(|s| s.ended_at.is_none()).count());
    match &gateway {
        Some(g) => {
            let up = (postern_host::now().as_millis() - g.started_at).max(0) / 1000;
            println!(
                "gateway     running: pid {}, up {}, approver {}, socket {}{}",
                g.pid,
                render::duration_secs(u64::try_from(up).unwrap_or_default()),
                g.approver,
                g.socket,
                g.http.as_deref().map(|h| format!(", {h}")).unwrap_or_default()
            );
            println!("secrets     {} kept in the gateway's memory (none while the vault is locked)", g.kept_secrets);
        }
        None => println!("gateway     not running (start one with `postern serve` or the desktop app)"),
    }
    if let (Some(c), Some(lag)) = (&export, lag) {
        println!(
            "export      OpenTelemetry to {}: {} row(s) behind, last sent {}{}",
            Outside::line(&c.target),
            lag,
            render::time(c.updated_at),
            match (&c.last_error, c.error_at) {
                (Some(e), Some(at)) => format!("; last error at {}: {}", render::time(at), Outside::line(e)),
                _ => String::new(),
            }
        );
    }
    if !recovered.is_empty() {
        println!(
            "recovered   {} execution(s) left dispatched by a previous run are now outcome_unknown:",
            recovered.len()
        );
        for id in &recovered {
            println!("  - {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn activity_table(rows: &[JournalEntry]) -> render::Table {
    let mut t = render::table(&["seq", "time (UTC)", "execution", "event", "state", "detail"]);
    for e in rows {
        let r = &e.row;
        t.add_row(vec![
            r.seq.to_string(),
            render::time(r.at.as_millis()),
            r.execution_id.map(|id| id.to_string()).unwrap_or_default(),
            r.event.to_string(),
            r.state.map(|s| s.to_string()).unwrap_or_default(),
            render::brief(&summary(e), 60),
        ]);
    }
    t
}

/// What is worth a glance in a row's detail (the full record is in `execution show --json`).
fn summary(e: &JournalEntry) -> serde_json::Value {
    let d = &e.row.detail;
    match e.row.event {
        Event::Step(ExecutionState::Accepted) => {
            let mut brief = json!({"tool": d["tool"], "actor": d["actor"], "fingerprint": d["fingerprint"]});
            // A folded row (a read-only call up to its dispatch): the steps it holds, by name.
            if let Ok(steps) = e.row.folded_steps()
                && !steps.is_empty()
            {
                brief["then"] = steps.iter().map(|s| json!(s.state)).collect();
            }
            brief
        }
        Event::Note(ActivityNote::RetryReceived) => {
            json!({"decision": d["decision"]["decision"], "correlation": d["correlation"]})
        }
        _ => d.clone(),
    }
}

pub fn activity(
    data_dir: &Path,
    execution: Option<ExecutionId>,
    session: Option<SessionId>,
    limit: usize,
    as_json: bool,
) -> Result<ExitCode, Failure> {
    let rows = view(data_dir)?.activity(&ActivityFilter { execution, session, limit })?;
    if as_json {
        print_json(&rows)?;
    } else if rows.is_empty() {
        println!("no activity yet");
    } else {
        println!("{}", activity_table(&rows).trim_fmt());
    }
    Ok(ExitCode::SUCCESS)
}

/// `postern sessions revoke ID`: directly, or through a running gateway's control socket.
pub fn revoke(data_dir: &Path, id: postern_core::SessionId) -> Result<ExitCode, Failure> {
    crate::route::perform(data_dir, postern_gateway::door::control::ControlRequest::RevokeSession { id })?;
    eprintln!("agent run {id} revoked: its calls are denied, and it is never authorized again");
    Ok(ExitCode::SUCCESS)
}

pub fn sessions(data_dir: &Path, as_json: bool) -> Result<ExitCode, Failure> {
    let sessions = view(data_dir)?.sessions()?;
    if as_json {
        print_json(&sessions)?;
        return Ok(ExitCode::SUCCESS);
    }
    if sessions.is_empty() {
        println!("no agent sessions yet");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = render::table(&[
        "session",
        "actor",
        "pid",
        "transport",
        "client",
        "started (UTC)",
        "ended (UTC)",
        "calls",
        "authorization",
    ]);
    for s in &sessions {
        t.add_row(vec![
            s.id.clone(),
            s.actor.clone(),
            s.pid.map(|p| p.to_string()).unwrap_or_default(),
            s.transport.clone(),
            s.client.clone().unwrap_or_default(),
            render::time(s.started_at),
            s.ended_at.map(render::time).unwrap_or_else(|| "active".into()),
            s.executions.to_string(),
            match (&s.authorization, &s.authorized_by) {
                (Some(standing), Some(by)) => format!("{standing} by {by}"),
                (Some(standing), None) => standing.clone(),
                _ => "not yet asked".into(),
            },
        ]);
    }
    println!("{}", t.trim_fmt());
    Ok(ExitCode::SUCCESS)
}

pub fn show(data_dir: &Path, id: ExecutionId, as_json: bool) -> Result<ExitCode, Failure> {
    let view = view(data_dir)?;
    let missing = || Failure { code: 2, error: anyhow!("no execution {id} in this journal") };
    let summary = view.execution(id)?.ok_or_else(missing)?;
    let incident = view.incident(id)?.ok_or_else(missing)?;
    let timeline = view.timeline(id)?;
    let result = view.result(id)?;
    if as_json {
        print_json(&json!({ "incident": incident, "execution": summary, "timeline": timeline, "result": result }))?;
        return Ok(ExitCode::SUCCESS);
    }
    // Much of an incident is what an agent or a target said: every such value is shown escaped.
    let o = |text: &str| Outside::line(text).to_string();
    println!("execution     {}", incident.execution_id);
    println!("tool          {} ({})", o(&incident.tool), o(&incident.channel));
    match &incident.target {
        serde_json::Value::Object(t) if t.contains_key("url") => {
            println!("target        {} {}", o(t["method"].as_str().unwrap_or("")), o(t["url"].as_str().unwrap_or("")))
        }
        other => println!("target        {}", render::brief(other, 200)),
    }
    println!("actor         {}", o(&incident.actor));
    println!("intent scope  {}", o(&incident.intent_scope));
    println!("fingerprint   {}", o(&incident.fingerprint));
    println!("contract      {}", o(incident.replay_contract.as_str().unwrap_or("?")));
    if let Some(key) = &incident.idempotency_key {
        println!("idempotency   {}: {}", o(&key.header), o(&key.value));
    }
    println!("state         {}", incident.state);
    let times = &incident.times;
    let at = |t: Option<i64>| t.map(render::time).unwrap_or_else(|| "-".into());
    println!(
        "times         accepted {}, dispatched {}, settled {}, delivered {}",
        render::time(times.accepted_at),
        at(times.first_dispatched_at),
        at(times.completed_at),
        at(times.result_delivered_at)
    );
    if let Some(outcome) = &incident.target_outcome {
        println!("target said   {}", render::brief(outcome, 100));
    }
    if let Some(r) = &incident.result_ref {
        println!("result        {} bytes, sha256:{} (journal row {})", r.bytes, o(&r.sha256), r.journal_seq);
    }
    for c in &incident.calls {
        let part = |label: &str, v: &Option<serde_json::Value>| match v {
            Some(serde_json::Value::Null) | None => String::new(),
            Some(serde_json::Value::String(s)) => format!(" {label} {}", o(s)),
            Some(v) => format!(" {label} {}", render::brief(v, 200)),
        };
        println!(
            "call          {} {}{}{}{}{}",
            render::time(c.at),
            o(&c.event),
            part("decision", &c.decision),
            part("run", &c.agent_session),
            part("mcp-session", &c.mcp_session_id),
            part("jsonrpc-id", &c.jsonrpc_id)
        );
    }
    for r in &incident.related {
        println!(
            "related       {} {} (accepted {}, {})",
            o(&r.execution_id.to_string()),
            r.state,
            render::time(r.accepted_at),
            o(&r.intent_scope)
        );
    }
    println!();
    let mut t = render::table(&["seq", "time (UTC)", "event", "state", "detail"]);
    for e in &timeline {
        t.add_row(vec![
            e.row.seq.to_string(),
            render::time(e.row.at.as_millis()),
            e.row.event.to_string(),
            e.row.state.map(|s| s.to_string()).unwrap_or_default(),
            render::brief(
                &if e.row.event == Event::Step(ExecutionState::Accepted) {
                    json!({"correlation": e.row.detail["correlation"]})
                } else {
                    e.row.detail.clone()
                },
                80,
            ),
        ]);
    }
    println!("{}", t.trim_fmt());
    Ok(ExitCode::SUCCESS)
}
