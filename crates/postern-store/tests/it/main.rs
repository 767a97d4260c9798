//! Integration tests of postern-store against real SQLite files on disk.

mod admission;
mod audit_tamper;
mod canary;
mod journal_rules;
mod recovery;
mod support;
