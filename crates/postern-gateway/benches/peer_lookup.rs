//! Who is on the other end of a loopback TCP connection, and has it acknowledged what was sent,
//! on a machine with a busy socket table (`POSTERN_BENCH_SOCKETS` idle loopback connections,
//! default 4,000, like a laptop with a browser open): Postern's lookups (`sock_diag`, one
//! connection at a time) beside what the `/proc` approach costs on the same table (the kernel
//! formatting every socket's line, and every process's descriptors read).
//!
//! `cargo bench -p postern-gateway --bench peer_lookup`

use postern_gateway::caller::connection;
use std::time::{Duration, Instant};

mod common;

fn time(n: usize, mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    started.elapsed() / n as u32
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("peer_lookup bench: run with `cargo bench -p postern-gateway --bench peer_lookup`");
        return;
    }
    if let Some(n) = std::env::var("POSTERN_BENCH_HOLD").ok().and_then(|v| v.parse().ok()) {
        return common::hold(n);
    }
    let busy: usize = std::env::var("POSTERN_BENCH_SOCKETS").ok().and_then(|v| v.parse().ok()).unwrap_or(4_000);
    // Another process (a browser, say) holds the busy table's sockets: the agent holds few.
    let mut holder = common::idle_sockets(busy);
    let table = std::fs::read_to_string("/proc/net/tcp").map(|t| t.lines().count() - 1).unwrap_or(0);
    println!("socket table: {table} IPv4 TCP sockets ({busy} connections held by another process)");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let local = listener.local_addr().expect("addr");
    let _client = std::net::TcpStream::connect(local).expect("connect");
    let (_server, peer) = listener.accept().expect("accept");
    assert_eq!(connection::tcp_peer_pid(peer, local), Some(std::process::id()));

    let n = 200;
    let pid = time(n, || assert!(connection::tcp_peer_pid(peer, local).is_some()));
    let queue = time(n * 10, || assert!(connection::tcp_send_queue(local, peer).is_some()));
    let entry = time(n * 10, || {
        assert!(postern_gateway::caller::sock_diag::tcp_entry(local, peer).expect("netlink").is_some())
    });
    let proc_table = time(20, || {
        let _ = std::fs::read_to_string("/proc/net/tcp").expect("read");
    });
    let proc_fds = time(5, || {
        let mut fds = 0usize;
        for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
            if let Ok(dir) = std::fs::read_dir(entry.path().join("fd")) {
                fds += dir.flatten().filter(|fd| std::fs::read_link(fd.path()).is_ok()).count();
            }
        }
        assert!(fds > 0);
    });
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("peer identity (sock_diag, then known processes) {:>9.1} µs per connection", us(pid));
    println!("delivery check (sock_diag, one socket)           {:>9.1} µs per check", us(queue));
    println!("  of which the netlink lookup                    {:>9.1} µs", us(entry));
    println!("the /proc approach on this table:");
    println!("  read /proc/net/tcp once                        {:>9.1} µs (per delivery check)", us(proc_table));
    println!(
        "  read every process's descriptors once          {:>9.1} µs (per connection, plus the table)",
        us(proc_fds)
    );
    println!(
        "ratio: delivery {:.0}x cheaper, peer identity {:.0}x cheaper",
        us(proc_table) / us(queue),
        (us(proc_table) + us(proc_fds)) / us(pid)
    );
    drop(holder.stdin.take());
    let _ = holder.wait();
}
