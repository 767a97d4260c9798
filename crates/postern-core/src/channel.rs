//! The channels an action goes out on: the contract rules and the canonical record both name
//! one, so it lives apart from both (no import circle between `contract` and `record`).

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    Http,
    Ssh,
    /// A `tools/call` forwarded to an upstream MCP server.
    Mcp,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Http => "http",
            Channel::Ssh => "ssh",
            Channel::Mcp => "mcp",
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
