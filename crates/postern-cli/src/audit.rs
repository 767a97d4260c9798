//! `postern audit verify` and `postern audit checkpoint`: the incident responder's commands.

use crate::{Failure, location, render};
use anyhow::{Context, anyhow};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use postern_core::Timestamp;
use postern_store::{Checkpoint, Store, audit};
use std::{path::Path, process::ExitCode, time::Instant};

pub fn verify(db: &Path, checkpoint: Option<&Path>, chain_only: bool, json: bool) -> Result<ExitCode, Failure> {
    let checkpoint = match checkpoint {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure { code: 2, error: anyhow!("cannot read checkpoint {}: {e}", path.display()) })?;
            Some(Checkpoint::parse(&text).map_err(|e| Failure { code: 2, error: anyhow!("{}: {e}", path.display()) })?)
        }
    };
    // Drawn only when stderr is a terminal; scripts get clean output.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("verifying {wide_bar} {human_pos}/{human_len} rows, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let scope = if chain_only { audit::VerifyScope::ChainOnly } else { audit::VerifyScope::Full };
    let report = audit::verify_with(db, checkpoint.as_ref(), scope, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report?;
    let elapsed = started.elapsed();
    if json {
        let mut value = serde_json::to_value(&report).context("encode report")?;
        value["database"] = serde_json::json!(db.display().to_string());
        value["intact"] = serde_json::json!(report.intact());
        value["elapsed_ms"] = serde_json::json!(elapsed.as_millis() as u64);
        println!("{}", serde_json::to_string_pretty(&value).context("encode report")?);
    } else {
        let rate = report.rows as f64 / elapsed.as_secs_f64().max(1e-9);
        println!("database    {}", db.display());
        println!("rows        {}", report.rows);
        println!("executions  {}", report.executions);
        println!("sessions    {}", report.sessions);
        println!("head        {} (row {})", report.head.hash, report.head.size);
        match (&checkpoint, report.checkpoint_checked) {
            (None, _) => {
                println!("checkpoint  none given (a cut-off tail or a rewritten chain needs one to be caught)")
            }
            (Some(cp), true) if report.intact() => {
                println!("checkpoint  matches (row {})", cp.journal_size)
            }
            (Some(cp), true) => println!("checkpoint  row {}: does not match", cp.journal_size),
            (Some(_), false) => println!("checkpoint  not compared (the chain itself is broken)"),
        }
        if chain_only {
            println!("scope       chain only (current states and stored results were not compared)");
        }
        println!("elapsed     {:.3} s ({:.0} rows/s)", elapsed.as_secs_f64(), rate);
        if report.intact() {
            println!("result      INTACT");
        } else {
            println!("result      TAMPERING FOUND");
            for finding in &report.findings {
                println!("  - {finding}");
            }
        }
    }
    Ok(if report.intact() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub fn checkpoint(data_dir: &Path, out: Option<&Path>) -> Result<ExitCode, Failure> {
    let (store, _) = Store::open(&location::database(data_dir), now())?;
    let cp = store.checkpoint(now())?;
    let text = serde_json::to_string_pretty(&cp).context("encode checkpoint")? + "\n";
    match out {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("write {}", path.display()))?;
            eprintln!(
                "checkpoint of {} rows (head {}, {}) written to {}; keep a copy off this machine",
                cp.journal_size,
                cp.head_hash,
                render::time(cp.created_at.as_millis()),
                path.display()
            );
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// The wall clock, read here in the binary: the libraries take time as a parameter.
pub fn now() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millis(ms)
}
