//! The `postern` command line: the entry point users, scripts and incident responders share.
//!
//! Exit codes are part of the interface: 0 success / intact, 1 tampering found, 2 unusable
//! input (missing file, not a Postern database, newer schema, bad arguments).

mod audit;
mod journal;
mod location;
mod render;

use clap::{Parser, Subcommand};
use postern_core::{ErrorCode, ExecutionId, SessionId};
use std::{path::PathBuf, process::ExitCode};

#[derive(Parser, Debug)]
#[command(name = "postern", version, about = "Credential vault and MCP gateway with execution identity")]
struct Cli {
    /// Data directory (default: the OS data dir, e.g. ~/.local/share/postern on Linux).
    #[arg(long, global = true, env = "POSTERN_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Open (creating if needed) the data directory and journal, recover executions a previous
    /// run left dispatched, and print a summary.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Verify the journal or export a checkpoint of it.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Show the Activity journal (most recent rows, oldest first).
    Activity {
        #[arg(long, value_name = "ID")]
        execution: Option<ExecutionId>,
        #[arg(long, value_name = "ID")]
        session: Option<SessionId>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Show the Sessions journal (agent runs).
    Sessions {
        #[arg(long)]
        json: bool,
    },
    /// Inspect one execution.
    Execution {
        #[command(subcommand)]
        command: ExecutionCommand,
    },
}

#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Recompute the journal's hash chain offline and name the first row that does not verify.
    /// Exit 0 = intact, 1 = tampering found, 2 = unusable input.
    Verify {
        /// Database file (default: postern.db in the data directory).
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
        /// An exported checkpoint to compare the journal head with.
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
        /// Check the chain (and checkpoint) only, not the current-state and result tables
        /// against it: faster on very large journals.
        #[arg(long)]
        chain_only: bool,
        #[arg(long)]
        json: bool,
    },
    /// Record the current journal head and write it as a checkpoint file to keep off-machine.
    Checkpoint {
        /// Where to write the checkpoint (default: standard output).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum ExecutionCommand {
    /// Print the lifecycle timeline of one execution.
    Show {
        id: ExecutionId,
        #[arg(long)]
        json: bool,
    },
}

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error: anyhow::Error = e.into();
        // Anything the store says about the input file is "unusable input".
        let code = match error.downcast_ref::<postern_store::StoreError>() {
            Some(e) if e.code() != "database_error" => 2,
            Some(_) => 1,
            None => 1,
        };
        Failure { code, error }
    }
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let data_dir = location::data_dir(cli.data_dir)?;
    match cli.command {
        Command::Status { json } => journal::status(&data_dir, json),
        Command::Audit { command: AuditCommand::Verify { db, checkpoint, chain_only, json } } => {
            let db = db.unwrap_or_else(|| location::database(&data_dir));
            audit::verify(&db, checkpoint.as_deref(), chain_only, json)
        }
        Command::Audit { command: AuditCommand::Checkpoint { out } } => audit::checkpoint(&data_dir, out.as_deref()),
        Command::Activity { execution, session, limit, json } => {
            journal::activity(&data_dir, execution, session, limit, json)
        }
        Command::Sessions { json } => journal::sessions(&data_dir, json),
        Command::Execution { command: ExecutionCommand::Show { id, json } } => journal::show(&data_dir, id, json),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(Failure { code, error }) => {
            eprintln!("postern: error: {error:#}");
            ExitCode::from(code)
        }
    }
}
