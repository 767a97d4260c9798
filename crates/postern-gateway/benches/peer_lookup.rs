//! Who is on the other end of a loopback TCP connection, and has it acknowledged what was sent,
//! on a machine with a busy socket table (`POSTERN_BENCH_SOCKETS` idle loopback connections,
//! default 4,000, like a laptop with a browser open): Postern's lookups (`sock_diag`, one
//! connection at a time) beside what the `/proc` approach costs on the same table (the kernel
//! formatting every socket's line, and every process's descriptors read).
//!
//! Then the case of a client that opens many connections at once, each lookup on its own thread as
//! the gateway's blocking pool runs them: a new process (never seen before) opens 32.
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
    if let Ok(spec) = std::env::var("POSTERN_BENCH_CONNECT") {
        return connect_and_hold(&spec);
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
    let at_once = 32;
    let (burst_cpu, burst_wall) = new_process_at_once(&listener, at_once, 10);
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
    println!(
        "a new process opening {at_once} connections at once, looked up in parallel: {:>7.1} µs CPU per connection, {:.2} ms for all",
        us(burst_cpu),
        burst_wall.as_secs_f64() * 1e3
    );
    drop(holder.stdin.take());
    let _ = holder.wait();
}

/// The child's part of [`new_process_at_once`]: connect `N` times to `ADDR` (`POSTERN_BENCH_CONNECT`
/// = "ADDR N"), say so, and hold the connections until stdin closes.
fn connect_and_hold(spec: &str) {
    let (addr, n) = spec.split_once(' ').expect("ADDR N");
    let n: usize = n.parse().expect("N");
    let held: Vec<_> = (0..n).map(|_| std::net::TcpStream::connect(addr).expect("connect")).collect();
    println!("{}", held.len());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
}

/// `rounds` times, a new child process opens `n` connections to `listener` at once, and `n`
/// threads look up their owner together: the CPU this process spent per connection and the wall
/// time until every owner was known (medians over the rounds).
fn new_process_at_once(listener: &std::net::TcpListener, n: usize, rounds: usize) -> (Duration, Duration) {
    let local = listener.local_addr().expect("addr");
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut child = common::bench_child("POSTERN_BENCH_CONNECT", &format!("{local} {n}"));
        let accepted: Vec<_> = (0..n).map(|_| listener.accept().expect("accept")).collect();
        let barrier = std::sync::Barrier::new(n + 1);
        let (cpu_before, started) = (common::cpu_time(), Instant::now());
        let owners: Vec<Option<u32>> = std::thread::scope(|scope| {
            let looking: Vec<_> = accepted
                .iter()
                .map(|(_, peer)| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        connection::tcp_peer_quick(*peer, local).finish(*peer, local).map(|h| h.pid)
                    })
                })
                .collect();
            barrier.wait();
            looking.into_iter().map(|t| t.join().expect("lookup")).collect()
        });
        wall.push(started.elapsed());
        cpu.push((common::cpu_time() - cpu_before) / n as u32);
        assert!(owners.iter().all(|&o| o == Some(child.id())), "every owner is the child: {owners:?}");
        drop(accepted);
        drop(child.stdin.take());
        let _ = child.wait();
    }
    cpu.sort();
    wall.sort();
    (cpu[rounds / 2], wall[rounds / 2])
}
