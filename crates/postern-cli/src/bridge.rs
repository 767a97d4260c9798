//! `postern mcp`: the stdio bridge an agent launches (`claude mcp add postern -- postern mcp`),
//! relaying its MCP messages to the running gateway's socket.

use crate::Failure;
use anyhow::{Context, anyhow};
use postern_gateway::door::socket;
use std::{path::Path, process::ExitCode, sync::Arc};

/// The stdio bridge: relays newline-delimited MCP messages between this process's stdin/stdout
/// and the gateway socket, line by line, flushing every line. Nothing else is ever written to
/// stdout.
///
/// Delivery is the agent's side receiving a result, not the gateway's write into this relay: the
/// bridge announces itself first (`notifications/postern/bridge`), and after each response has
/// been written *and flushed* to stdout it acknowledges it (`notifications/postern/delivered`
/// with the response's id). Until that acknowledgement the gateway records the result as not
/// delivered, so a bridge killed between the two leaves a retry answered from the record.
///
/// Plain threads and blocking I/O: there is nothing to schedule, and a relay must never hold a
/// message back.
pub fn bridge(data_dir: &Path) -> Result<ExitCode, Failure> {
    use std::io::{BufRead, BufReader, Write};
    let path = socket::socket_path(data_dir);
    let socket = std::os::unix::net::UnixStream::connect(&path).map_err(|e| Failure {
        code: 1,
        error: anyhow!(
            "no Postern gateway is running for {} ({}: {e}).\nStart one with `postern serve` (or open the Postern \
             app), then start this agent again.",
            data_dir.display(),
            path.display()
        ),
    })?;
    // One writer at a time into the socket, a whole line each: the agent's messages and the
    // acknowledgements interleave only at line boundaries.
    let to_gateway = Arc::new(std::sync::Mutex::new(socket.try_clone().context("clone the socket")?));
    let send_line = {
        let to_gateway = Arc::clone(&to_gateway);
        move |line: &[u8]| -> std::io::Result<()> {
            let mut socket = to_gateway.lock().map_err(|_| std::io::Error::other("poisoned"))?;
            socket.write_all(line)
        }
    };
    send_line(&socket::bridge_hello_line()).context("greet the gateway")?;
    let agent_to_gateway = send_line.clone();
    let shutdown = Arc::clone(&to_gateway);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut line = Vec::with_capacity(64 * 1024);
        loop {
            line.clear();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                // Only the bridge speaks for delivery: an agent's line using its methods is dropped.
                Ok(_) if socket::is_bridge_notification(&line) => {
                    eprintln!("postern mcp: dropped a message using the bridge's own delivery methods");
                }
                Ok(_) => {
                    if agent_to_gateway(&line).is_err() {
                        break;
                    }
                }
            }
        }
        // The agent closed its side: let the gateway finish answering, then it closes.
        if let Ok(socket) = shutdown.lock() {
            let _ = socket.shutdown(std::net::Shutdown::Write);
        }
    });
    let mut from_gateway = BufReader::with_capacity(64 * 1024, socket);
    let mut stdout = std::io::stdout().lock();
    let mut line = Vec::with_capacity(64 * 1024);
    loop {
        line.clear();
        match from_gateway.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                // An agent that stopped reading ends the session.
                if stdout.write_all(&line).and_then(|()| stdout.flush()).is_err() {
                    break;
                }
                // The line reached the agent's stdin pipe: now, and only now, it was delivered.
                if let Some(ack) = socket::delivered_ack_line(&line) {
                    let _ = send_line(&ack);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}
