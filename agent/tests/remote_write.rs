//! Remote write against a real Prometheus (`--web.enable-remote-write-receiver`):
//! the receiver is stopped mid-run and started again on the same storage, the
//! agent is restarted once, and every sample the agent stored arrives exactly
//! once, with its timestamp, under the name and labels `/metrics` gives it.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixtures, free_port, http_get, query_rows, require_program, Agent, VTAX};

/// A Prometheus that only receives remote writes.
struct Receiver {
    child: Option<Child>,
    port: u16,
}

impl Receiver {
    fn start(dir: &Path, port: u16) -> Receiver {
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, "global:\n  scrape_interval: 15s\n").unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("prometheus.log"))
            .unwrap();
        let child = Command::new(require_program("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let receiver = Receiver {
            child: Some(child),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            || http_get(receiver.addr(), "/-/ready", &[]).status != 200
        {
            assert!(Instant::now() < deadline, "Prometheus did not become ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        receiver
    }

    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// SIGTERM and wait: Prometheus flushes its WAL, so what it answered 2xx
    /// for survives the restart (a SIGKILL could lose its last WAL page).
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            child.wait().unwrap();
        }
    }

    /// `GET /api/v1/query`, evaluated at `at_ms`.
    fn query(&self, promql: &str, at_ms: i64) -> serde_json::Value {
        let encoded: String = promql
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let path = format!(
            "/api/v1/query?query={encoded}&time={}.{:03}",
            at_ms / 1000,
            at_ms % 1000
        );
        let response = http_get(self.addr(), &path, &[]);
        let json: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(json["status"], "success", "{json}");
        json["data"]["result"].clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// How one field of the catalogue becomes remote series.
#[derive(Debug)]
enum Sent {
    /// A gauge or counter: this metric name, every tag.
    Plain(String),
    /// Histogram buckets: `<base>_bucket` with `le`, `<base>_count` on `+Inf`.
    Buckets(String),
    /// A histogram's sum: this name, on the `+Inf` row, without `le`.
    Sum(String),
}

/// An exported table from the catalogue: name, tags, and per field how it is sent.
type Table = (String, Vec<String>, Vec<(String, Sent)>);

/// Exported tables from `vtax catalogue`.
fn exported_tables() -> Vec<Table> {
    let out = Command::new(VTAX).arg("catalogue").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut tables = Vec::new();
    for section in text.split("\n## `").skip(1) {
        let name = section.split('`').next().unwrap().to_string();
        let (mut tags, mut fields) = (Vec::new(), Vec::new());
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line
                .split(" | ")
                .map(|c| c.trim_matches('|').trim())
                .collect();
            let column = cells[0].trim_matches('`').to_string();
            match cells.len() {
                2 => tags.push(column),
                5 => {
                    // A stored-only field has no metric: it is not sent.
                    let Some(metric) = cells[3].split('`').nth(1) else {
                        continue;
                    };
                    let metric = metric.to_string();
                    let sent = match metric.strip_suffix("_bucket") {
                        Some(base) => Sent::Buckets(base.to_string()),
                        None if cells[2] == "histogram" => Sent::Sum(metric),
                        None => Sent::Plain(metric),
                    };
                    fields.push((column, sent));
                }
                _ => {} // a stored-only table's field: not sent
            }
        }
        if !fields.is_empty() {
            tables.push((name, tags, fields));
        }
    }
    tables
}

/// `2026-11-21T18:17:32.008756Z` in ms since the epoch.
fn parse_time_ms(text: &str) -> i64 {
    let n = |range: std::ops::Range<usize>| text[range].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days since the epoch of a proleptic Gregorian date.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    let fraction = text[19..].trim_start_matches('.').trim_end_matches('Z');
    let micros: i64 = format!("{fraction:0<6}")[..6].parse().unwrap();
    secs * 1000 + micros / 1000
}

type Samples = BTreeMap<String, Vec<i64>>;

fn series_key(name: &str, labels: &BTreeMap<String, String>) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// Every sample in the store up to `until_ms`, as the remote series it becomes.
fn stored(data_dir: &Path, until_ms: i64) -> Samples {
    let mut samples = Samples::new();
    for (table, tags, fields) in exported_tables() {
        for row in query_rows(data_dir, &table) {
            let time_ms = parse_time_ms(row["time"].as_str().unwrap());
            if time_ms > until_ms {
                continue;
            }
            let labels: BTreeMap<String, String> = tags
                .iter()
                .filter_map(|t| {
                    let v = row[t].as_str().unwrap_or("");
                    (!v.is_empty()).then(|| (t.clone(), v.to_string()))
                })
                .collect();
            let mut without_le = labels.clone();
            let is_inf = without_le.remove("le").is_some_and(|le| le == "+Inf");
            for (field, sent) in &fields {
                if row[field].is_null() {
                    continue;
                }
                let mut add = |name: String, labels: &BTreeMap<String, String>| {
                    samples
                        .entry(series_key(&name, labels))
                        .or_default()
                        .push(time_ms)
                };
                match sent {
                    Sent::Plain(name) => add(name.clone(), &labels),
                    Sent::Buckets(base) => {
                        add(format!("{base}_bucket"), &labels);
                        if is_inf {
                            add(format!("{base}_count"), &without_le);
                        }
                    }
                    Sent::Sum(name) if is_inf => add(name.clone(), &without_le),
                    Sent::Sum(_) => {}
                }
            }
        }
    }
    for times in samples.values_mut() {
        times.sort_unstable();
    }
    samples
}

/// Every vtax sample Prometheus holds up to `until_ms`.
fn received(receiver: &Receiver, since_ms: i64, until_ms: i64) -> Samples {
    let range_secs = (until_ms - since_ms) / 1000 + 60;
    let result = receiver.query(
        &format!("{{__name__=~\"vtax_.+\"}}[{range_secs}s]"),
        until_ms,
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let mut samples = Samples::new();
    for series in result.as_array().unwrap() {
        let mut labels: BTreeMap<String, String> =
            serde_json::from_value(series["metric"].clone()).unwrap();
        let name = labels.remove("__name__").unwrap();
        // Every series says which agent sent it.
        assert_eq!(labels.remove("job").as_deref(), Some("vtax"), "{labels:?}");
        assert_eq!(labels.remove("instance"), Some(host.clone()), "{labels:?}");
        let times: Vec<i64> = series["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v[0].as_f64().unwrap() * 1000.0).round() as i64)
            .collect();
        samples.insert(series_key(&name, &labels), times);
    }
    samples
}

#[test]
fn every_stored_sample_arrives_once_across_receiver_and_agent_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let data = dir.path().join("data");
    let config = dir.path().join("vtax.toml");
    let root = fixtures().join("baremetal-node");
    std::fs::write(
        &config,
        format!(
            "[store]\ndata_dir = {data:?}\n\n[paths]\nprocfs = {:?}\nsysfs = {:?}\n\n\
             [[remote_write]]\nname = \"prom\"\nurl = \"http://127.0.0.1:{port}/api/v1/write\"\n\
             max_samples_per_send = 500\nbatch_send_deadline_secs = 1.0\n\
             min_backoff_secs = 0.05\nmax_backoff_secs = 0.5\n",
            root.join("proc"),
            root.join("sys"),
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let started_ms = now_ms();
    let mut receiver = Receiver::start(dir.path(), port);

    let agent = Agent::start(&["--config", config]);
    std::thread::sleep(Duration::from_secs(4));
    receiver.stop();
    // The agent keeps collecting and queueing while nobody receives.
    std::thread::sleep(Duration::from_secs(4));
    let receiver = Receiver::start(dir.path(), port);
    std::thread::sleep(Duration::from_secs(3));
    let first_log = agent.log();
    assert!(agent.stop(), "clean exit on SIGTERM");
    assert!(
        first_log.contains("Remote write failed; retrying"),
        "the outage was noticed:\n{first_log}"
    );

    let agent = Agent::start(&["--config", config]);
    std::thread::sleep(Duration::from_secs(4));
    assert!(agent.stop(), "clean exit on SIGTERM");
    let until_ms = now_ms();

    // A third run sends what the second left queued; its own samples come
    // after `until_ms`, and once one of them is in, everything before is.
    let agent = Agent::start(&["--config", config]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let latest = receiver.query("max(timestamp(vtax_collector_success))", now_ms());
        let latest_ms = latest
            .as_array()
            .and_then(|r| r.first())
            .map(|r| (r["value"][1].as_str().unwrap().parse::<f64>().unwrap() * 1000.0) as i64);
        if latest_ms.is_some_and(|t| t > until_ms) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the queue never drained: latest {latest_ms:?}, log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(agent.stop(), "clean exit on SIGTERM");

    let expected = stored(&data, until_ms);
    let got = received(&receiver, started_ms, until_ms);
    let expected_samples: usize = expected.values().map(Vec::len).sum();
    eprintln!(
        "{expected_samples} samples in {} series stored; {} series received",
        expected.len(),
        got.len()
    );
    assert!(
        expected_samples > 5_000,
        "only {expected_samples} samples stored"
    );
    assert!(
        expected.keys().any(|k| k.contains("_bucket{"))
            && expected
                .keys()
                .any(|k| k.starts_with("vtax_remote_write_samples_sent_total")),
        "histograms and remote write's own counters are among them"
    );
    let missing: Vec<_> = expected
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .take(5)
        .map(|(k, v)| {
            format!(
                "{k}: stored {} at {:?}.., received {:?}",
                v.len(),
                &v[..v.len().min(3)],
                got.get(k).map(|g| g.len())
            )
        })
        .collect();
    assert!(missing.is_empty(), "series differ:\n{}", missing.join("\n"));
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        extra.is_empty(),
        "received series the store lacks: {extra:?}"
    );

    // The outage shows in the counters the agent stored: requests failed and
    // samples were retried, and none was dropped.
    let rows = query_rows(&data, "remote_write");
    let max = |field: &str| {
        rows.iter()
            .map(|r| r[field].as_u64().unwrap())
            .max()
            .unwrap()
    };
    assert!(max("requests_failed") > 0 && max("samples_retried") > 0);
    assert_eq!(max("samples_dropped_queue_full"), 0);
    assert_eq!(max("samples_dropped_rejected"), 0);
    assert_eq!(max("samples_dropped_unwritten"), 0);
}

/// A forward proxy that reports the head of every request it gets. A plain
/// request (`POST http://...`) gets 204; a tunnel (`CONNECT`) is refused
/// with 502, so no TLS follows.
fn recording_proxy() -> (u16, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (heads, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let answer = if head.starts_with("CONNECT ") {
                "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"
            };
            let _ = stream.write_all(answer.as_bytes());
            if heads.send(head).is_err() {
                return;
            }
        }
    });
    (port, received)
}

/// Writes a config whose only remote is `url`, on the fixture node.
fn remote_config(dir: &Path, url: &str, tls: &str) -> String {
    let root = fixtures().join("baremetal-node");
    let config = dir.join("vtax.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\ndata_dir = {:?}\n\n[paths]\nprocfs = {:?}\nsysfs = {:?}\n\n\
             [[remote_write]]\nname = \"proxied\"\nurl = \"{url}\"\n\
             batch_send_deadline_secs = 1.0\nmin_backoff_secs = 0.05\nmax_backoff_secs = 0.5\n{tls}",
            dir.join("data"),
            root.join("proc"),
            root.join("sys"),
        ),
    )
    .unwrap();
    config.to_str().unwrap().to_string()
}

#[test]
fn remote_write_goes_through_the_proxy_the_environment_names() {
    // Receivers under `.invalid` cannot resolve: only a proxy reaches them.
    let (port, heads) = recording_proxy();
    let proxy = format!("http://127.0.0.1:{port}");

    let dir = tempfile::tempdir().unwrap();
    let config = remote_config(dir.path(), "http://receiver.invalid:9201/api/v1/write", "");
    let agent = Agent::start_with_env(&["--config", &config], &[("HTTP_PROXY", &proxy)]);
    let head = heads
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no request reached the proxy:\n{}", agent.log()));
    assert!(
        head.starts_with("POST http://receiver.invalid:9201/api/v1/write HTTP/1.1\r\n"),
        "{head}"
    );
    let head_lower = head.to_ascii_lowercase();
    assert!(
        head_lower.contains("\r\ncontent-encoding: snappy\r\n"),
        "{head}"
    );
    assert!(
        head_lower.contains("\r\nx-prometheus-remote-write-version: 0.1.0\r\n"),
        "{head}"
    );
    // The proxy's 204 counts as sent.
    agent.wait_for_value(
        "vtax_remote_write_samples_sent_total{remote=\"proxied\"",
        |sent| sent > 0.0,
        Duration::from_secs(30),
    );
    assert!(agent.stop(), "clean exit on SIGTERM");

    // `https` goes through a tunnel that HTTPS_PROXY names; a refused tunnel
    // is a failure to retry, and the samples stay queued.
    let dir = tempfile::tempdir().unwrap();
    let config = remote_config(
        dir.path(),
        "https://receiver.invalid/api/v1/write",
        "\n[remote_write.tls]\ninsecure_skip_verify = true\n",
    );
    let agent = Agent::start_with_env(
        &["--config", &config],
        &[("HTTPS_PROXY", &proxy), ("HTTP_PROXY", "")],
    );
    let head = heads
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no tunnel was asked of the proxy:\n{}", agent.log()));
    assert!(
        head.starts_with("CONNECT receiver.invalid:443 HTTP/1.1\r\n"),
        "{head}"
    );
    let log = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = agent.log();
            if log.contains("Remote write failed; retrying") || Instant::now() > deadline {
                break log;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert!(log.contains("Remote write failed; retrying"), "{log}");
    assert!(agent.stop(), "clean exit on SIGTERM");
}
