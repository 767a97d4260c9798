//! Integration tests of the `postern` binary: real processes, real database files.

#![allow(clippy::unwrap_used)] // tests assert by unwrapping the error they expect

mod agents;
mod approvals;
mod audit;
mod beside;
mod call;
mod doctor;
mod faults;
mod gateway;
mod gateway_support;
mod hostile;
mod hostile_configs;
mod journal;
mod oauth;
mod otel;
mod paths;
mod reference;
mod service;
mod sessions;
mod ssh;
mod support;
mod tasks;
mod upstreams;
mod vault;
