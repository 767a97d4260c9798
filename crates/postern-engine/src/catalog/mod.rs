//! What tools exist and what each one sends: the manifest (`tools.toml`) with every tool's
//! replay contract, the templates that render a call's URL, headers, body or command (and
//! their shell quoting), the built-in tools, and the redaction that keeps a call's secrets out
//! of everything Postern writes. The lowest role: it reads files and values, and sends nothing.

pub mod manifest;
pub mod redaction;
pub mod template;
pub mod upstream_contract;
