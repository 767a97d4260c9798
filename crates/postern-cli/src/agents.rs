//! `postern agents …`: bearer tokens for agents that reach Postern over Streamable HTTP. A token
//! is shown once, when it is created; Postern keeps only its SHA-256.

use crate::{Failure, location, render};
use anyhow::{Context, anyhow};
use postern_gateway::door::control::ControlRequest;
use sha2::{Digest, Sha256};
use std::{path::Path, process::ExitCode};

/// Tokens look like `pst_` + 64 hex digits (256 random bits).
pub const TOKEN_PREFIX: &str = "pst_";

pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

pub fn add(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    if !valid_name(name) {
        return Err(Failure {
            code: 2,
            error: anyhow!("agent name {name:?} must be 1–64 characters of letters, digits, '-', '_' or '.'"),
        });
    }
    let mut random = [0u8; 32];
    getrandom::fill(&mut random).map_err(|e| Failure { code: 1, error: anyhow!("no randomness from the OS: {e}") })?;
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(random));
    crate::route::perform(
        data_dir,
        ControlRequest::AddAgent { name: name.into(), token_sha256: token_sha256(&token) },
    )?;
    eprintln!("agent {name:?} added. Its token is printed below once; Postern keeps only a hash of it.");
    eprintln!("Give it to the agent's MCP client as an HTTP header:  Authorization: Bearer <token>");
    println!("{token}");
    Ok(ExitCode::SUCCESS)
}

pub fn list(data_dir: &Path, json: bool) -> Result<ExitCode, Failure> {
    let db = location::database(data_dir);
    let agents = postern_store::JournalView::open_read_only(&db)?.agents()?;
    if json {
        crate::render::print_json(&agents).context("encode")?;
        return Ok(ExitCode::SUCCESS);
    }
    if agents.is_empty() {
        println!("no agents yet (postern agents add NAME)");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = render::table(&["agent", "token (sha256 prefix)", "created (UTC)", "revoked (UTC)"]);
    for a in &agents {
        t.add_row(vec![
            a.name.clone(),
            a.token_sha256.chars().take(12).collect(),
            render::time(a.created_at),
            a.revoked_at.map(render::time).unwrap_or_else(|| "active".into()),
        ]);
    }
    println!("{}", t.trim_fmt());
    Ok(ExitCode::SUCCESS)
}

pub fn revoke(data_dir: &Path, name: &str) -> Result<ExitCode, Failure> {
    crate::route::perform(data_dir, ControlRequest::RevokeAgent { name: name.into() })?;
    eprintln!("agent {name:?} revoked: its token no longer authenticates");
    Ok(ExitCode::SUCCESS)
}
