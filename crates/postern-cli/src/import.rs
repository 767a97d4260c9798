//! `postern servers import`: the plan printed (secrets by name and length only), confirmed, and
//! carried out by `postern_host::import`; `--undo` restores the files.

use crate::Failure;
use anyhow::{Context, anyhow};
use postern_core::Outside;
use postern_host::{
    import::{self, ImportError},
    now,
};
use std::{path::Path, process::ExitCode, sync::Arc};

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// Where to look: claude-code (~/.claude.json and ./.mcp.json), claude-desktop, cursor
    /// (~/.cursor/mcp.json), vscode (./.vscode/mcp.json), or a file path. Default: all of them.
    #[arg(long = "from", value_name = "SOURCE")]
    from: Vec<String>,
    /// Apply the plan without asking.
    #[arg(long)]
    yes: bool,
    /// Print the plan and change nothing.
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
    /// Restore the config files of the last import, byte for byte, and remove its servers.
    #[arg(long, conflicts_with_all = ["yes", "dry_run", "from"])]
    undo: bool,
}

fn postern_command() -> String {
    std::env::current_exe().ok().and_then(|p| p.to_str().map(str::to_owned)).unwrap_or_else(|| "postern".into())
}

/// Exit code 2 for what the user named wrong, 1 for what went wrong.
fn failure(e: ImportError) -> Failure {
    let code = match e {
        ImportError::UnknownSource(_) | ImportError::NothingToUndo => 2,
        _ => 1,
    };
    Failure { code, error: anyhow!(e) }
}

pub fn import(data_dir: &Path, args: ImportArgs) -> Result<ExitCode, Failure> {
    // The import's target: the data directory through the route every change takes (the journal
    // itself, or the running gateway's control socket), so it passes the same checks.
    let keychain = Arc::new(postern_vault::OsKeychain::connect()?);
    let target = import::ThroughRoute::new(data_dir, keychain).map_err(failure)?;
    let vault: &dyn import::ImportTarget = &target;
    if args.undo {
        let undone = import::undo(vault, data_dir, now()).map_err(failure)?;
        for path in undone.restored {
            println!("restored {}", path.display());
        }
        for name in undone.removed {
            println!("removed Postern server {name:?}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let plan = import::plan(vault, &args.from, &postern_command()).map_err(failure)?;
    // Everything from the config files is outside text (a cloned repository's `.mcp.json` is
    // someone else's): printed escaped, so an entry cannot rewrite the lines of the plan.
    let path = |p: &Path| Outside::line(&p.display().to_string()).to_string();
    for (source, why) in &plan.left_alone {
        println!("{} ({}): {}; left alone", source.label, path(&source.path), Outside::line(why));
    }
    for file in &plan.files {
        println!("{} ({})", file.source.label, path(&file.source.path));
        if let Some(real) = &file.real_path {
            println!("  a link to {}: that file is rewritten, the link is kept", path(real));
        }
        for s in &file.skipped {
            println!("  {:<24} left as it is: {}", Outside::line(&s.key).to_string(), s.reason);
        }
        if file.named.is_empty() {
            println!("  no server to import");
            continue;
        }
        for (f, name) in &file.named {
            let (server, secrets) = f.to_server(name);
            println!(
                "  {:<24} → Postern server {name:?}: {}",
                Outside::line(&f.key).to_string(),
                Outside::line(&server.launched())
            );
            if !server.env.is_empty() {
                let plain: Vec<String> =
                    server.env.iter().map(|(k, v)| Outside::line(&format!("{k}={v}")).to_string()).collect();
                println!("      environment: {}", plain.join(" "));
            }
            let loaders = server.loader_variables();
            if !loaders.is_empty() {
                println!(
                    "      WARNING: it sets {}, which change(s) what code the program loads: import it only if you \
                     wrote this file or read what it points to",
                    Outside::line(&loaders.join(", "))
                );
            }
            for (k, v) in &secrets {
                println!(
                    "      secret → OS keychain: {} ({} characters)",
                    Outside::line(k),
                    v.expose().chars().count()
                );
            }
        }
        let after: Vec<String> = file.servers_after().iter().map(|k| Outside::line(k).to_string()).collect();
        println!("  afterwards its servers are: {}", after.join(", "));
        if let Some(repo) = &file.in_git {
            println!(
                "  WARNING: {} is in the git repository {}: its history still holds these secrets. Rotate them.",
                path(file.real_path.as_deref().unwrap_or(&file.source.path)),
                path(repo)
            );
        }
    }
    if plan.servers() == 0 {
        println!("nothing to import");
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} MCP server(s) with {} plaintext secret(s) would move into Postern.", plan.servers(), plan.secrets());
    if args.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    if !args.yes && !confirm()? {
        println!("nothing changed");
        return Ok(ExitCode::SUCCESS);
    }
    let moved = import::apply(vault, data_dir, plan, now()).map_err(failure)?;
    println!(
        "moved {} server(s) into Postern; their agents now start `postern mcp`. `postern servers import --undo` \
         restores the files (the originals are kept in the OS keychain, not on disk).",
        moved.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn confirm() -> Result<bool, Failure> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err(Failure { code: 2, error: anyhow!("not a terminal: pass --yes to apply the plan, or --dry-run") });
    }
    print!("Move them into Postern? [y/N] ");
    std::io::stdout().flush().ok();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("read the answer")?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}
