//! Where agents and the owner reach Postern: the MCP handler (tools, resources, prompts,
//! tasks), the stdio bridge's Unix socket, Streamable HTTP with stream resumption, the control
//! socket the CLI and the app use, the refusals that journal what was asked for and not
//! offered, and `serve`, which starts them all. The highest role: nothing below imports it.

pub mod control;
pub mod mcp;
pub mod refusal;
pub mod resumption;
pub mod serve;
pub mod socket;
pub mod streamable;
