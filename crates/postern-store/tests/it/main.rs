//! Integration tests of postern-store against real SQLite files on disk.

#![allow(clippy::unwrap_used)] // tests assert by unwrapping the error they expect

mod admission;
mod audit_tamper;
mod authority;
mod canary;
mod disk_full;
mod incident;
mod journal_rules;
mod merkle;
mod recovery;
mod support;
