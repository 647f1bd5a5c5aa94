//! A fault-injecting TCP proxy between `sluice` and a database: a MOCK of
//! the network, standing in only for a fault the real services cannot be
//! made to produce on demand: the server commits a transaction but its reply
//! to `COMMIT` (or to Redis's `EVALSHA`) never reaches the client.
//!
//! Bytes pass through unchanged. When a client packet holds the marker
//! (`COMMIT`, sent as text by sqlx on Postgres and MySQL; `EVALSHA` for
//! Redis's commit script) and a drop is due, the packet and whatever
//! follows it for 300 ms are forwarded, the server's replies are
//! swallowed, and then both connections are closed. It must not change any
//! byte it forwards. It sees markers in plain text only: URLs through it
//! turn TLS off (`sslmode=disable`, `ssl-mode=DISABLED`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// A running proxy; it lives as long as the test process.
pub struct FaultProxy {
    pub port: u16,
    state: Arc<State>,
}

struct State {
    upstream: String,
    /// What a commit request holds.
    marker: &'static [u8],
    /// Drop the reply to every `every`-th COMMIT ...
    every: usize,
    /// ... at most this many times.
    max_drops: usize,
    commits: AtomicUsize,
    drops: AtomicUsize,
}

impl FaultProxy {
    /// Proxies `upstream` (`host:port`), dropping the reply to every
    /// `every`-th COMMIT, `max_drops` times in all.
    pub fn start(upstream: &str, every: usize, max_drops: usize) -> FaultProxy {
        Self::start_on(upstream, b"COMMIT", every, max_drops)
    }

    /// Like [`FaultProxy::start`], for requests holding `marker`.
    pub fn start_on(
        upstream: &str,
        marker: &'static [u8],
        every: usize,
        max_drops: usize,
    ) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(State {
            upstream: upstream.to_string(),
            marker,
            every,
            max_drops,
            commits: AtomicUsize::new(0),
            drops: AtomicUsize::new(0),
        });
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || state.serve(client));
            }
        });
        FaultProxy { port, state }
    }

    /// Replies dropped so far.
    pub fn drops(&self) -> usize {
        self.state.drops.load(Ordering::SeqCst)
    }

    /// COMMITs seen so far.
    pub fn commits(&self) -> usize {
        self.state.commits.load(Ordering::SeqCst)
    }
}

impl State {
    fn serve(self: Arc<Self>, client: TcpStream) {
        let Ok(server) = TcpStream::connect(&self.upstream) else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let doomed = Arc::new(AtomicBool::new(false));
        let (c2, s2, d2) = (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
            doomed.clone(),
        );
        // Server -> client: swallowed once the connection is doomed.
        std::thread::spawn(move || pump(s2, c2, |_| !d2.load(Ordering::SeqCst)));
        // Client -> server: watches for COMMIT.
        let mut from = client.try_clone().expect("clone");
        let mut to = server.try_clone().expect("clone");
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let drop_reply =
                !doomed.load(Ordering::SeqCst) && contains(chunk, self.marker) && self.due();
            if drop_reply {
                doomed.store(true, Ordering::SeqCst);
                // Let the rest of the request through and the server
                // commit, then cut both sides.
                let (c3, s3) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(300));
                    let _ = c3.shutdown(Shutdown::Both);
                    let _ = s3.shutdown(Shutdown::Both);
                });
            }
            if to.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    }

    /// Counts a COMMIT; true if its reply is to be dropped.
    fn due(&self) -> bool {
        let n = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
        if !n.is_multiple_of(self.every) {
            return false;
        }
        self.drops
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| {
                (d < self.max_drops).then_some(d + 1)
            })
            .is_ok()
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, forward: impl Fn(&[u8]) -> bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if forward(&buf[..n]) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
