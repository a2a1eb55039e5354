//! Helpers shared by the end-to-end tests: a running agent and a plain HTTP client.
#![allow(dead_code)] // each test file uses its own subset

pub mod fake_nvml;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const VTAX: &str = env!("CARGO_BIN_EXE_vtax");

/// Root of the repository's fixture trees.
pub fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"))
}

/// A `vtax run` child, killed on drop unless stopped.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
}

impl Agent {
    /// Starts `vtax run` with `args` (plus a listen address on a free port) and
    /// waits for it to say where it listens.
    pub fn start(args: &[&str]) -> Agent {
        Agent::start_with_env(args, &[])
    }

    /// [`Agent::start`] with more environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Agent {
        let mut child = Command::new(VTAX)
            .arg("run")
            .args(["--web.listen-address", "127.0.0.1:0"])
            .args(args)
            .env("VTAX_LOG", "info")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vtax");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listen_address=").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                        let _ = tx.send(addr);
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("a socket address in the log"),
            Err(_) => {
                let _ = child.kill();
                panic!("the agent did not start:\n{}", log.lock().unwrap());
            }
        };
        Agent { child, addr, log }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends a signal to the agent.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// SIGTERM, then waits; returns whether it exited cleanly.
    pub fn stop(mut self) -> bool {
        self.signal(libc::SIGTERM);
        let status = self.child.wait().unwrap();
        status.success()
    }

    /// `GET path`.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        http_get(self.addr, path, headers)
    }

    /// Waits until `/metrics` holds `needle`.
    pub fn wait_for_metric(&self, needle: &str, timeout: Duration) -> String {
        self.poll_metrics(timeout, &format!("{needle:?} never appeared"), |body| {
            body.contains(needle).then(|| body.to_string())
        })
    }

    /// Waits until the sample of a series that starts with `series` (the
    /// name and any labels up to there) has a value `done` accepts, and
    /// returns that value. A counter that is exported from the start at 0
    /// is there before the work it counts is done: waiting for its name
    /// alone and then asserting its value races with that work.
    pub fn wait_for_value(
        &self,
        series: &str,
        done: impl Fn(f64) -> bool,
        timeout: Duration,
    ) -> f64 {
        let what = format!("{series:?} never came to the value waited for");
        self.poll_metrics(timeout, &what, |body| {
            body.lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .filter(|v| done(*v))
        })
    }

    /// Reads `/metrics` every 100 ms until `found` gives something, and
    /// panics with `what`, the last body and the log at `timeout`.
    pub fn poll_metrics<T>(
        &self,
        timeout: Duration,
        what: &str,
        found: impl Fn(&str) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let body = self.get("/metrics", &[]).text();
            if let Some(t) = found(&body) {
                return t;
            }
            if Instant::now() > deadline {
                panic!("{what} in /metrics:\n{body}\nlog:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("a UTF-8 body")
    }
}

/// A minimal HTTP/1.1 GET with `Connection: close`.
pub fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(
            std::str::from_utf8(&data[..line_end])
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Runs `vtax` with `args`, asserts that it succeeded (showing its stderr if
/// not) and returns its stdout.
pub fn vtax_stdout<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let args: Vec<S> = args.into_iter().collect();
    let out = Command::new(VTAX).args(&args).output().unwrap();
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert!(
        out.status.success(),
        "vtax {}: {}",
        shown.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs `command` to its end, asserts that it succeeded (showing what it
/// printed if not) and returns its stdout.
pub fn stdout_of(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every row of a table, from `vtax query --format json`.
pub fn query_rows(data_dir: &Path, table: &str) -> Vec<serde_json::Value> {
    let data_dir = format!("--data-dir={}", data_dir.display());
    vtax_stdout(["query", &data_dir, "--format=json", table])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Path of a program the tests need; panics with how to get it when absent,
/// so a missing peer is a failure, never a silent skip.
pub fn require_program(name: &str) -> String {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => p.display().to_string(),
        None => panic!(
            "{name} is not installed: scripts/test.sh installs it (apt-get install prometheus)"
        ),
    }
}

/// Runs chromium headless on `page` with `args`, killed after a minute. The
/// flags keep it off the network: without them it reaches for Google.
pub fn chromium(args: &[&str], page: &Path) -> Output {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1400,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium runs (scripts/test.sh installs Debian's chromium)");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "chromium did not finish within a minute on {}",
                page.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

/// The value of `attribute="..."` on the page's `<body>`.
pub fn body_attribute<'a>(dom: &'a str, attribute: &str) -> Option<&'a str> {
    let body = &dom[dom.find("<body")?..];
    let body = &body[..body.find('>')?];
    let start = body.find(&format!("{attribute}=\""))? + attribute.len() + 2;
    Some(&body[start..start + body[start..].find('"')?])
}
