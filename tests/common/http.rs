//! The HTTP layer's tests, the same for every server of Ember (`ember serve`, `ember gym
//! serve`): each takes a way to start the server with extra flags and the routes to call.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server and its port; killed when dropped.
pub struct Running {
    pub child: Child,
    pub port: u16,
}

impl Running {
    /// Spawns `cmd` and reads its port from the first line of its standard output (`…
    /// listening on http://127.0.0.1:PORT …`).
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Running { child, port }
    }

    /// Sends `sig` (`-TERM`, `-INT`) to the server.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start a server with extra flags, and the routes the tests call.
pub struct Target<'a> {
    pub start: &'a dyn Fn(&[&str]) -> Running,
    /// A GET route that needs the key.
    pub get: &'static str,
    /// A POST route, and a body it answers 200 quickly.
    pub post: &'static str,
    pub quick_body: &'a str,
}

/// Sends `request` and reads the answer to the end; its status and body.
pub fn exchange(port: u16, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// One GET, with a bearer key when given; the status and body.
pub fn get(port: u16, path: &str, key: Option<&str>) -> (u16, String) {
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n"),
    )
}

/// One POST with a JSON body; the status and body.
pub fn post(port: u16, path: &str, body: &str) -> (u16, String) {
    exchange(port, &format!("{}{body}", head(path, body.len(), true)))
}

/// A POST's head announcing `len` bytes of body.
pub fn head(path: &str, len: usize, close: bool) -> String {
    let close = if close { "connection: close\r\n" } else { "" };
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n{close}\r\n"
    )
}

/// Reads what the server sends on `s` until it closes or `within` passes.
pub fn answer(s: &mut TcpStream, within: Duration) -> String {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

/// Every HTTP-layer promise, in turn.
pub fn every_promise(t: &Target) {
    slow_clients_are_cut(t);
    slow_bodies_are_cut(t);
    one_client_holds_at_most_its_share(t);
    the_key_guards_every_route_but_health(t);
}

/// Clients that never finish their request's head are cut after --header-read-timeout, and at
/// most --max-connections are served at once: a third client waits until a slow one is cut,
/// then is answered.
pub fn slow_clients_are_cut(t: &Target) {
    let e = (t.start)(&["--header-read-timeout", "2", "--max-connections", "2"]);
    let mut slow: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", e.port)).unwrap())
        .collect();
    for s in &mut slow {
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n").unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut third = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
    third
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(800)))
        .unwrap();
    let waited = third.read(&mut [0u8; 1]);
    assert!(
        waited.is_err(),
        "a third connection was served past --max-connections 2: {waited:?}"
    );
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let cut = s.read_to_end(&mut Vec::new());
        assert!(
            cut.is_ok()
                || cut
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "a client that never finished its head was not cut: {cut:?}"
        );
    }
    let text = answer(&mut third, Duration::from_secs(20));
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// A body longer than --max-body-bytes is answered 413 as soon as its `Content-Length` says so,
/// and a body sent too slowly is answered 408 after --body-read-timeout; `/health` is answered
/// meanwhile.
pub fn slow_bodies_are_cut(t: &Target) {
    let e = (t.start)(&["--body-read-timeout", "2", "--max-body-bytes", "1000"]);
    let mut big = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
    big.write_all(head(t.post, 1_000_000, false).as_bytes())
        .unwrap();
    let text = answer(&mut big, Duration::from_secs(10));
    assert!(text.starts_with("HTTP/1.1 413"), "{text:?}");
    assert!(text.contains("--max-body-bytes 1000"), "{text}");
    let mut slow: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
            s.write_all(head(t.post, 100, false).as_bytes()).unwrap();
            s.write_all(b"{").unwrap();
            s
        })
        .collect();
    let t0 = Instant::now();
    assert_eq!(get(e.port, "/health", None).0, 200);
    for s in &mut slow {
        let text = answer(s, Duration::from_secs(20));
        assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
        assert!(text.contains("--body-read-timeout 2 s"), "{text}");
    }
    assert!(t0.elapsed() >= Duration::from_millis(1500), "408 too early");
}

/// One client holds at most --max-requests-per-client requests in flight: past them it gets
/// 429 naming the flag, `/health` still answers, and once its requests end it is served again.
pub fn one_client_holds_at_most_its_share(t: &Target) {
    let e = (t.start)(&["--max-requests-per-client", "2", "--body-read-timeout", "2"]);
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
            s.write_all(format!("{}{{", head(t.post, 100, false)).as_bytes())
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = get(e.port, t.get, None);
    assert_eq!(code, 429, "{body}");
    assert!(body.contains("--max-requests-per-client"), "{body}");
    assert_eq!(get(e.port, "/health", None).0, 200);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(get(e.port, t.get, None).0, 200);
    drop(held);
}

/// `--api-key` and `--api-key-env` guard every route but `/health` (401 without the key or
/// with a wrong one); `--api-key-env` naming an unset variable stops the server at start.
pub fn the_key_guards_every_route_but_health(t: &Target) {
    for flags in [&["--api-key", "k"][..], &["--api-key-env", "PATH"][..]] {
        let key = if flags[0] == "--api-key" {
            "k".to_string()
        } else {
            std::env::var("PATH").unwrap()
        };
        let e = (t.start)(flags);
        assert_eq!(get(e.port, "/health", None).0, 200);
        assert_eq!(get(e.port, t.get, None).0, 401);
        assert_eq!(get(e.port, t.get, Some("wrong")).0, 401);
        assert_eq!(get(e.port, t.get, Some(&key)).0, 200);
        let (code, body) = post(e.port, t.post, t.quick_body);
        assert_eq!(code, 401, "{body}");
    }
}

/// A second SIGTERM exits at once (128 + 15) while the first waits for the work taken:
/// `busy` is sent on a connection the test keeps open, and must take longer than 3 s.
pub fn a_second_signal_exits_at_once(t: &Target, busy: &str) {
    let mut e = (t.start)(&[]);
    let mut waiting = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
    waiting
        .write_all(format!("{}{busy}", head(t.post, busy.len(), true)).as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    e.exits_at_once_on_a_second_signal();
}

impl Running {
    /// A first SIGTERM leaves the server working (1.5 s later it still runs), and a second one
    /// ends it within 5 s with status 143.
    pub fn exits_at_once_on_a_second_signal(&mut self) {
        self.signal("-TERM");
        std::thread::sleep(Duration::from_millis(1500));
        let alive = self.child.try_wait().unwrap();
        assert!(
            alive.is_none(),
            "the work ended before the second signal: {alive:?}"
        );
        let t0 = Instant::now();
        self.signal("-TERM");
        while t0.elapsed() < Duration::from_secs(5) {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert_eq!(status.code(), Some(143), "{status:?}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("still running 5 s after the second signal");
    }
}
