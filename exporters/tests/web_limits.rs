//! The `/metrics` server under hostile clients: wrong passwords in bulk,
//! unknown user names, idle, slow and half-open connections, and more
//! connections than it takes. Everything runs on 127.0.0.1 and every client
//! loop ends by itself.
//!
//! `cargo test -p vtax-exporters --test web_limits -- --nocapture` prints the
//! figures of the flood (docs/benchmarks.md).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use vtax_exporters::web::{serve_with, WebLimits, WebServer, WebStats};
use vtax_exporters::Exposition;

/// bcrypt cost of the test users: `htpasswd -nBC 10`, what operators use.
const COST: u32 = 10;

fn start(dir: &Path, web_config: Option<&str>, limits: WebLimits) -> WebServer {
    let path = web_config.map(|text| {
        let path = dir.join("web.yml");
        std::fs::write(&path, text).unwrap();
        path
    });
    serve_with(
        "127.0.0.1:0".parse().unwrap(),
        path,
        Exposition::new(&[]),
        limits,
    )
    .unwrap()
}

/// The server's stats once `settled` holds of them, or after 3 s: a
/// connection is counted once its socket is closed.
fn stats_once(server: &WebServer, settled: impl Fn(&WebStats) -> bool) -> WebStats {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let stats = server.stats();
        if settled(&stats) || Instant::now() > deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

/// A keep-alive HTTP/1.1 connection.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(address: SocketAddr) -> Conn {
        let stream = TcpStream::connect(address).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Conn {
            reader: BufReader::new(stream),
        }
    }

    /// One `GET /metrics`; the status, or `None` when the connection failed.
    fn get(&mut self, authorization: Option<&str>) -> Option<u16> {
        let mut request = String::from("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        if let Some(value) = authorization {
            request.push_str(&format!("Authorization: {value}\r\n"));
        }
        request.push_str("\r\n");
        self.reader.get_mut().write_all(request.as_bytes()).ok()?;
        let mut line = String::new();
        if self.reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status = line.split(' ').nth(1)?.parse().ok()?;
        let mut length = 0;
        loop {
            line.clear();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().ok()?;
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).ok()?;
        Some(status)
    }

    /// Whether the server closed the connection (or answered and closed it)
    /// within `wait`.
    fn closed_within(&mut self, wait: Duration) -> bool {
        let stream = self.reader.get_mut();
        stream.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0; 256];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return true,
                // An answer such as 408 before the close.
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }

    /// Sends `bytes` one at a time, `every` apart, until the server closes
    /// the connection or they run out; how long the server took to close it.
    fn trickle(&mut self, bytes: &[u8], every: Duration) -> Option<Duration> {
        let started = Instant::now();
        for byte in bytes {
            if self.reader.get_mut().write_all(&[*byte]).is_err() || self.closed_within(every) {
                return Some(started.elapsed());
            }
        }
        None
    }
}

fn users_config(users: &[(&str, &str)]) -> String {
    let mut text = String::from("basic_auth_users:\n");
    for (user, password) in users {
        text.push_str(&format!(
            "  {user}: {}\n",
            bcrypt::hash(password, COST).unwrap()
        ));
    }
    text
}

/// A wrong user name must cost what a wrong password costs, or user names
/// can be found by timing (it answered in 0.23 ms against 74 ms).
#[test]
fn unknown_user_costs_what_a_wrong_password_costs() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        Some(&users_config(&[("prometheus", "s3cret")])),
        WebLimits::default(),
    );
    let mut conn = Conn::open(server.local_addr());
    let mut n = 0;
    let mut timed = |user: &str| {
        let started = Instant::now();
        // A new wrong password each time: one sent again is answered from
        // the cache of refused credentials, without bcrypt.
        n += 1;
        assert_eq!(
            conn.get(Some(&basic(user, &format!("wrong-{n}")))),
            Some(401)
        );
        started.elapsed()
    };
    let (mut known, mut unknown) = (Duration::MAX, Duration::MAX);
    // The fastest of each, taken in turn: other load only ever adds time, so
    // the two minimums close in on the true costs as rounds are added. Load
    // beside the test (the workspace's other tests on two vCPUs) once left the
    // fastest wrong password of ten at 2.4 times the fastest unknown user, so
    // rounds go on until the two agree or 40 rounds have run. An unknown user
    // refused before bcrypt never comes within range however many rounds run.
    let mut rounds: u64 = 0;
    let in_range = |known: Duration, unknown: Duration| {
        (0.5..2.0).contains(&(unknown.as_secs_f64() / known.as_secs_f64()))
    };
    while rounds < 40 && (rounds < 10 || !in_range(known, unknown)) {
        known = known.min(timed("prometheus"));
        unknown = unknown.min(timed("nobody"));
        rounds += 1;
    }
    println!("wrong password: {known:?}; unknown user: {unknown:?}; rounds: {rounds}");
    assert!(
        known > Duration::from_millis(5),
        "bcrypt did not run: {known:?}"
    );
    assert!(
        in_range(known, unknown),
        "an unknown user takes {unknown:?}, a wrong password {known:?}"
    );
    assert_eq!(server.stats().auth_failures, 2 * rounds);
    server.stop();
}

/// Answers a flooder counted: 401, 503, anything else.
type FloodAnswers = (u64, u64, u64);

/// `count` connections sending a new wrong password each as soon as the
/// last answer came, until `stop` or `deadline`; each thread's answers.
fn flood(
    address: SocketAddr,
    count: usize,
    stop: &Arc<AtomicBool>,
    deadline: Instant,
) -> Vec<std::thread::JoinHandle<FloodAnswers>> {
    (0..count)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut refused, mut busy, mut other) = (0u64, 0u64, 0u64);
                let mut conn = Conn::open(address);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    n += 1;
                    match conn.get(Some(&basic("prometheus", &format!("guess-{i}-{n}")))) {
                        Some(401) => refused += 1,
                        Some(503) => busy += 1,
                        Some(_) => other += 1,
                        None => conn = Conn::open(address),
                    }
                }
                (refused, busy, other)
            })
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// 16 connections sending wrong passwords as fast as they are answered
/// must not hold up a scraper whose password was verified before: the flood
/// took a scrape from 6 ms to 2.2 s when bcrypt ran on the serving threads.
#[test]
fn a_flood_of_wrong_passwords_does_not_starve_a_verified_scraper() {
    const FLOODERS: usize = 16;
    const MEASURED: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        Some(&users_config(&[("prometheus", "s3cret")])),
        WebLimits::default(),
    );
    let address = server.local_addr();
    let good = basic("prometheus", "s3cret");
    let mut scraper = Conn::open(address);
    assert_eq!(scraper.get(Some(&good)), Some(200), "the first scrape");

    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + MEASURED + Duration::from_secs(5);
    let flooders = flood(address, FLOODERS, &stop, deadline);
    std::thread::sleep(Duration::from_millis(300));

    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < MEASURED {
        let t = Instant::now();
        assert_eq!(scraper.get(Some(&good)), Some(200));
        latencies.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut refused, mut busy, mut other) = (0, 0, 0);
    for flooder in flooders {
        let (r, b, o) = flooder.join().unwrap();
        refused += r;
        busy += b;
        other += o;
    }
    latencies.sort();
    let scrapes = latencies.len();
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    let max = *latencies.last().unwrap();
    println!(
        "verified scraper under {FLOODERS} wrong-password connections: {scrapes} scrapes in {MEASURED:?}, \
         p50 {p50:?}, p99 {p99:?}, max {max:?}; flood answers: {refused} x 401, {busy} x 503, {other} other"
    );
    assert!(
        // Bcrypt on the serving threads made it 2.2 s; the bound leaves
        // room for a loaded test machine and still tells the two apart.
        p99 < Duration::from_secs(1),
        "p99 {p99:?} (p50 {p50:?}, max {max:?})"
    );
    assert_eq!(other, 0);
    assert!(refused > 0, "bcrypt never ran for the flood");
    let stats = server.stats();
    assert_eq!(stats.auth_failures, refused);
    assert_eq!(stats.auth_busy, busy);
    server.stop();
}

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(30);
// A closure is judged against LONG / 2: after SHORT, it is the timeout under
// test and not one of the LONG ones, however slowly a loaded machine runs.

/// A connection that sends nothing, before or after a request, is closed
/// after the idle timeout.
#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        None,
        WebLimits {
            idle_timeout: SHORT,
            header_read_timeout: LONG,
            tls_handshake_timeout: LONG,
            ..WebLimits::default()
        },
    );
    let mut fresh = Conn::open(server.local_addr());
    let mut kept_alive = Conn::open(server.local_addr());
    assert_eq!(kept_alive.get(None), Some(200));
    let started = Instant::now();
    assert!(fresh.closed_within(LONG / 2));
    assert!(kept_alive.closed_within(LONG / 2));
    let took = started.elapsed();
    assert!(took >= SHORT / 2 && took < LONG / 2, "{took:?}");
    let stats = stats_once(&server, |s| s.connections_open == 0);
    assert_eq!(stats.connections_timed_out, 2);
    assert_eq!(stats.connections_open, 0);
    server.stop();
}

/// A request head sent a byte at a time, each in time for the idle timeout,
/// is cut off by the header read timeout.
#[test]
fn slow_request_heads_are_closed_after_the_header_read_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        None,
        WebLimits {
            idle_timeout: LONG,
            header_read_timeout: SHORT,
            tls_handshake_timeout: LONG,
            ..WebLimits::default()
        },
    );
    let head =
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: abcdefghijklmnopqrstuvwxyz\r\n\r\n";
    cut_off_while_trickling(server, head.as_bytes(), "the slow head was read to its end");
}

/// Sends `bytes` a byte every 50 ms: the server must close the connection
/// after about the SHORT timeout, and count it as timed out.
fn cut_off_while_trickling(server: WebServer, bytes: &[u8], not_cut: &str) {
    let mut conn = Conn::open(server.local_addr());
    let took = conn.trickle(bytes, Duration::from_millis(50));
    let took = took.expect(not_cut);
    assert!(took >= SHORT / 2 && took < LONG / 2, "{took:?}");
    let stats = stats_once(&server, |s| s.connections_open == 0);
    assert_eq!(stats.connections_timed_out, 1);
    server.stop();
}

/// A TLS handshake that never ends (a ClientHello sent a byte at a time) is
/// cut off by the handshake timeout.
#[test]
fn half_open_tls_handshakes_are_closed_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.path().join("server.crt"), cert.cert.pem()).unwrap();
    std::fs::write(
        dir.path().join("server.key"),
        cert.signing_key.serialize_pem(),
    )
    .unwrap();
    let server = start(
        dir.path(),
        Some("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"),
        WebLimits {
            idle_timeout: LONG,
            header_read_timeout: LONG,
            tls_handshake_timeout: SHORT,
            ..WebLimits::default()
        },
    );
    // A handshake record announcing 512 bytes, then its first bytes.
    let mut hello = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
    hello.extend(std::iter::repeat_n(0x03, 60));
    cut_off_while_trickling(server, &hello, "the handshake was left open");
}

/// A full server makes room for a new connection: the one that has waited
/// longest for a request goes, whether idle or sending its head a byte at a
/// time. Clients holding every connection that way had kept every new
/// scraper out (each refused at once) for as long as they kept at it.
#[test]
fn a_full_server_closes_the_longest_waiting_connection_for_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        None,
        WebLimits {
            max_connections: 3,
            ..WebLimits::default()
        },
    );
    let address = server.local_addr();
    let mut idle = Conn::open(address);
    assert_eq!(idle.get(None), Some(200));
    std::thread::sleep(Duration::from_millis(20));
    let mut slow = Conn::open(address);
    slow.reader.get_mut().write_all(b"GET /metr").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut kept = Conn::open(address);
    assert_eq!(kept.get(None), Some(200));
    // Full. Each new scraper gets in; the longest waiting goes first.
    let mut first = Conn::open(address);
    assert_eq!(first.get(None), Some(200));
    assert!(
        idle.closed_within(LONG / 2),
        "the idle one, the longest waiting"
    );
    assert!(!slow.closed_within(Duration::from_millis(100)));
    let mut second = Conn::open(address);
    assert_eq!(second.get(None), Some(200));
    assert!(slow.closed_within(LONG / 2), "the slow head, next");
    assert_eq!(kept.get(None), Some(200), "a connection in use stays");
    let stats = stats_once(&server, |s| s.connections_evicted == 2);
    assert_eq!(stats.connections_evicted, 2);
    assert_eq!(stats.connections_refused, 0);
    assert!(stats.connections_open <= 3, "{stats:?}");
    server.stop();
}

/// A connection whose credential waits for bcrypt is writing no answer: a
/// new connection closes it for room. Clients sending a new wrong password
/// on each of 128 connections had left nothing to close, and a scraper
/// whose password was verified was refused at once.
#[test]
fn a_connection_waiting_for_bcrypt_makes_room_for_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("basic_auth_users:\n");
    // Dear enough that the two verifications outlast the check below.
    text.push_str(&format!("  prom: {}\n", bcrypt::hash("pw", 14).unwrap()));
    let server = start(
        dir.path(),
        Some(&text),
        WebLimits {
            max_connections: 2,
            ..WebLimits::default()
        },
    );
    let address = server.local_addr();
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                Conn::open(address).get(Some(&basic("prom", &format!("wrong-{i}"))))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // No credentials: answered at once, no bcrypt.
    assert_eq!(Conn::open(address).get(None), Some(401));
    let stats = server.stats();
    assert_eq!(stats.connections_refused, 0);
    assert_eq!(stats.connections_evicted, 1);
    let answers: Vec<Option<u16>> = waiting.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(answers.contains(&None), "one was closed: {answers:?}");
    server.stop();
}

/// A new scraper's credential, never verified (after a restart, or a
/// rotated web config), gets in while clients send wrong passwords as fast
/// as they are answered: it was answered 503 every time, the one
/// verification slot always taken.
#[test]
fn a_new_credential_gets_in_under_a_flood_of_wrong_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        Some(&users_config(&[("prometheus", "s3cret")])),
        WebLimits::default(),
    );
    let address = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let flooders = flood(address, 4, &stop, Instant::now() + Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let status = Conn::open(address).get(Some(&basic("prometheus", "s3cret")));
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    assert_eq!(status, Some(200), "after {took:?}");
    // A wrong password sent again is answered from the cache.
    let wrong = basic("prometheus", "guess-again");
    let mut conn = Conn::open(address);
    assert_eq!(conn.get(Some(&wrong)), Some(401));
    let again = Instant::now();
    assert_eq!(conn.get(Some(&wrong)), Some(401));
    assert!(
        again.elapsed() < Duration::from_millis(20),
        "{:?}",
        again.elapsed()
    );
    server.stop();
}

/// A user taken out of the web config is refused at the next request of a
/// connection kept alive since, as on a new connection; the headers the
/// config sets come with every answer.
#[test]
fn a_changed_web_config_applies_to_kept_alive_connections() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_config(&[("prom", "pw"), ("other", "pw2")]);
    let server = start(dir.path(), Some(&users), WebLimits::default());
    let address = server.local_addr();
    let mut kept = Conn::open(address);
    assert_eq!(kept.get(Some(&basic("prom", "pw"))), Some(200));
    // Past the file system's timestamp granularity, so the change is seen.
    std::thread::sleep(Duration::from_millis(1100));
    let other_only = users
        .lines()
        .filter(|l| !l.trim_start().starts_with("prom:"))
        .collect::<Vec<_>>()
        .join("\n");
    let config =
        format!("{other_only}\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n");
    std::fs::write(dir.path().join("web.yml"), config).unwrap();
    assert_eq!(kept.get(Some(&basic("prom", "pw"))), Some(401));
    let mut raw = TcpStream::connect(address).unwrap();
    raw.write_all(
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    let answer = answer.to_ascii_lowercase();
    assert!(answer.contains("\r\nallow: get, head\r\n"), "{answer}");
    assert!(answer.contains("\r\nx-frame-options: deny\r\n"), "{answer}");
    server.stop();
}

/// A request head past the buffer is refused with 431, not buffered: each
/// connection holding an unfinished head of about 400 KiB had taken the
/// agent to 83 MB.
#[test]
fn a_request_head_past_the_buffer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), None, WebLimits::default());
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let _ = raw.write_all(head.as_bytes());
    let mut answer = String::new();
    let _ = raw.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    server.stop();
}

/// The counters reach the store's channel and `/metrics` once a second.
#[test]
fn stats_are_published_as_rows_and_series() {
    let exposition = Exposition::new(&[&vtax_exporters::web::TABLE]);
    let server = serve_with(
        "127.0.0.1:0".parse().unwrap(),
        None,
        exposition.clone(),
        WebLimits {
            max_connections: 1,
            ..WebLimits::default()
        },
    )
    .unwrap();
    let mut idle = Conn::open(server.local_addr());
    assert_eq!(idle.get(None), Some(200));
    let mut newer = Conn::open(server.local_addr());
    assert!(idle.closed_within(LONG / 2), "the idle one makes room");
    assert_eq!(newer.get(None), Some(200));
    let (rows, received) = vtax_store::hub::channel(16);
    server.publish_stats(rows);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let batches = received
            .recv_timeout(Duration::from_secs(5))
            .expect("a row within a second or so");
        assert_eq!(batches.rows[0].table.name, "web");
        exposition.render_pending();
        let body = String::from_utf8(
            exposition
                .body(vtax_exporters::Format::Text, false)
                .to_vec(),
        )
        .unwrap();
        if body.contains("vtax_web_connections_evicted_total 1\n")
            && body.contains("vtax_web_connections_refused_total 0\n")
            && body.contains("vtax_web_connections_open 1\n")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{body}");
    }
    server.stop();
}
