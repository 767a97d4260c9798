//! `postern audit verify` and `postern audit checkpoint`: the incident responder's commands.

use crate::{Failure, location, render};
use anyhow::{Context, anyhow};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use postern_host::now;
use postern_store::{Checkpoint, Store, audit};
use std::{path::Path, process::ExitCode, time::Instant};

/// How far a checkpoint's signature was checked.
enum Signature {
    Trusted,
    /// Valid for the key embedded in the checkpoint, which nothing vouches for.
    SelfConsistent,
    Unsigned,
}

fn check_signature(cp: &Checkpoint, path: &Path, pubkey: Option<&str>) -> Result<Signature, Failure> {
    let unusable = |e: String| Failure { code: 2, error: anyhow!("checkpoint {}: {e}", path.display()) };
    match (pubkey, cp.signature.is_some()) {
        (Some(key), _) => {
            let key = match key.strip_prefix('@') {
                Some(file) => {
                    std::fs::read_to_string(file).map_err(|e| unusable(format!("cannot read {file}: {e}")))?
                }
                None => key.to_owned(),
            };
            postern_vault::verify_checkpoint_signature(cp, &key).map_err(|e| unusable(e.to_string()))?;
            Ok(Signature::Trusted)
        }
        (None, true) => {
            let embedded = cp.public_key.clone().unwrap_or_default();
            postern_vault::verify_checkpoint_signature(cp, &embedded).map_err(|e| unusable(e.to_string()))?;
            Ok(Signature::SelfConsistent)
        }
        (None, false) => Ok(Signature::Unsigned),
    }
}

pub fn verify(
    db: &Path,
    checkpoint: Option<&Path>,
    pubkey: Option<&str>,
    chain_only: bool,
    json: bool,
) -> Result<ExitCode, Failure> {
    let (checkpoint, signature) = match checkpoint {
        None => (None, None),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure { code: 2, error: anyhow!("cannot read checkpoint {}: {e}", path.display()) })?;
            let cp =
                Checkpoint::parse(&text).map_err(|e| Failure { code: 2, error: anyhow!("{}: {e}", path.display()) })?;
            let signature = check_signature(&cp, path, pubkey)?;
            (Some(cp), Some(signature))
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
        crate::render::print_json(&value).context("encode report")?;
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
        match signature {
            Some(Signature::Trusted) => println!("signature   valid, by the trusted key"),
            Some(Signature::SelfConsistent) => println!(
                "signature   valid for the key inside the checkpoint; pass --pubkey to check that key is yours"
            ),
            Some(Signature::Unsigned) => println!("signature   none (an unsigned checkpoint proves less)"),
            None => {}
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
                println!("  - {}", postern_core::Outside::line(&finding.to_string()));
            }
        }
    }
    Ok(if report.intact() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `audit checkpoint`: signed by this process, or by the running gateway that holds the journal.
pub fn checkpoint(data_dir: &Path, out: Option<&Path>) -> Result<ExitCode, Failure> {
    let answer = crate::route::perform(data_dir, postern_gateway::door::control::ControlRequest::Checkpoint)?;
    let cp: postern_store::Checkpoint = serde_json::from_value(answer).context("read the checkpoint")?;
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

/// `audit rederive`: the authority tables rebuilt from a verified journal; says what changed.
pub fn rederive(data_dir: &Path) -> Result<ExitCode, Failure> {
    let changed = match Store::rederive_authority(&location::database(data_dir), now()) {
        Err(postern_store::StoreError::InUse { .. }) => {
            return Err(Failure {
                code: 1,
                error: anyhow::anyhow!(
                    "`audit rederive` rebuilds the tables every decision is read from, so it needs the journal to \
                     itself: stop the running gateway (or quit the desktop app), run it, and start the gateway again"
                ),
            });
        }
        other => other?,
    };
    if changed.is_empty() {
        println!("the authority tables already match the journal; nothing changed");
    } else {
        for c in &changed {
            println!("rebuilt: {c}");
        }
        println!("{} row(s) rebuilt from the journal (journaled as authority_rederived)", changed.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit pubkey`: the journal-signing key's public half (asked of the gateway when one runs).
pub fn pubkey(data_dir: &Path) -> Result<ExitCode, Failure> {
    let answer = crate::route::perform(data_dir, postern_gateway::door::control::ControlRequest::PublicKey)?;
    println!("{}", answer.as_str().unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}
