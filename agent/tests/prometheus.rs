//! `/metrics` against the real Prometheus tools: `promtool check metrics` lints
//! what the agent serves, and a real Prometheus server scrapes a running agent
//! over TLS with basic auth, then answers PromQL over its series.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, http_get, require_program, Agent};

/// Runs `promtool check metrics` on an exposition; returns its complaints.
fn promtool_check(body: &[u8]) -> String {
    let promtool = require_program("promtool");
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body).unwrap();
    let out = child.wait_with_output().unwrap();
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() || !complaints.is_empty(),
        "promtool failed silently"
    );
    complaints
}

#[test]
fn metrics_endpoint_serves_both_formats_gzip_and_passes_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&["--data-dir", dir.path().to_str().unwrap()]);
    let body = agent.wait_for_metric(
        "vtax_collector_success{collector=\"host\"} 1",
        Duration::from_secs(20),
    );

    let text = agent.get("/metrics", &[]);
    assert_eq!(text.status, 200);
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(body.contains("# TYPE vtax_cpu_steal_seconds_total counter"));
    // The build, as Prometheus exporters give theirs.
    let build = format!(
        "vtax_build_info{{version=\"{}\",revision=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(body.contains(&build), "no {build} in {body}");
    assert_eq!(promtool_check(&text.body), "", "promtool lints /metrics");

    let om = agent.get(
        "/metrics",
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )],
    );
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let om_text = om.text();
    assert!(om_text.ends_with("# EOF\n"), "{om_text}");
    assert!(om_text.contains(
        "# TYPE vtax_cpu_steal_seconds counter\n# UNIT vtax_cpu_steal_seconds seconds\n"
    ));

    // A scraper that takes OpenMetrics 0.0.1 alone is answered in it.
    let first = agent.get(
        "/metrics",
        &[("Accept", "application/openmetrics-text;version=0.0.1")],
    );
    assert_eq!(
        first.header("content-type"),
        Some("application/openmetrics-text; version=0.0.1; charset=utf-8")
    );
    assert!(first.text().ends_with("# EOF\n"));

    let zipped = agent.get("/metrics", &[("Accept-Encoding", "gzip")]);
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    let mut unzipped = String::new();
    flate2::read::GzDecoder::new(&zipped.body[..])
        .read_to_string(&mut unzipped)
        .unwrap();
    assert!(unzipped.starts_with("# HELP "), "{unzipped}");
    assert!(zipped.body.len() < unzipped.len());

    assert_eq!(agent.get("/nope", &[]).status, 404);
    assert!(agent.get("/", &[]).text().contains("/metrics"));
    assert!(agent.stop(), "clean exit on SIGTERM");
}

/// A running Prometheus server, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    /// `$SELF` in `scrape_configs` stands for the server's own address.
    fn start(dir: &Path, scrape_configs: &str) -> Prometheus {
        let binary = require_program("prometheus");
        let config = dir.join("prometheus.yml");
        let port = free_port();
        let scrape_configs = scrape_configs.replace("$SELF", &format!("127.0.0.1:{port}"));
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
            ),
        )
        .unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap();
        let prometheus = Prometheus { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            || http_get(prometheus.addr(), "/-/ready", &[]).status != 200
        {
            assert!(Instant::now() < deadline, "Prometheus did not become ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// Evaluates an instant query; returns (labels, value) per series.
    fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        self.query_path(format!("/api/v1/query?query={}", percent_encode(promql)))
    }

    /// Evaluates an instant query at `time` (Unix seconds).
    fn query_at(&self, promql: &str, time: f64) -> Vec<(serde_json::Value, f64)> {
        self.query_path(format!(
            "/api/v1/query?query={}&time={time}",
            percent_encode(promql)
        ))
    }

    fn query_path(&self, path: String) -> Vec<(serde_json::Value, f64)> {
        let response = http_get(self.addr(), &path, &[]);
        let json: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(json["status"], "success", "{json}");
        json["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let value: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
                (r["metric"].clone(), value)
            })
            .collect()
    }

    /// Polls a query until it returns exactly `expected` for one series.
    fn wait_for(&self, promql: &str, expected: f64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let result = self.query(promql);
            if result.len() == 1 && result[0].1 == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{promql} never returned {expected}: {result:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A self-signed certificate for 127.0.0.1 and localhost: (cert PEM, key PEM).
fn self_signed() -> (String, String) {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    (cert.cert.pem(), cert.signing_key.serialize_pem())
}

#[test]
fn prometheus_scrapes_the_agent_over_tls_with_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed();
    std::fs::write(dir.path().join("agent.crt"), &cert).unwrap();
    std::fs::write(dir.path().join("agent.key"), &key).unwrap();
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web_config = dir.path().join("web.yml");
    std::fs::write(
        &web_config,
        format!(
            "tls_server_config:\n  cert_file: agent.crt\n  key_file: agent.key\n\
             basic_auth_users:\n  prom: {hash}\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    // Host from this machine's /proc (its counters move); cgroups and
    // InfiniBand from the bare-metal fixture's /sys (exact known values).
    let sysfs = common::fixtures().join("baremetal-node/sys");
    let agent = Agent::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--web.config.file",
        web_config.to_str().unwrap(),
        "--path.sysfs",
        sysfs.to_str().unwrap(),
    ]);
    let target = agent.addr;
    let ca = dir.path().join("agent.crt");
    let job = |name: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {}\n\
             \x20   basic_auth:\n      username: prom\n      password: {password}\n\
             \x20   static_configs:\n      - targets: ['{target}']\n",
            ca.display()
        )
    };
    let prometheus = Prometheus::start(
        dir.path(),
        &format!(
            "{}{}",
            job("vtax", "s3cret"),
            job("vtax_wrong_password", "nope")
        ),
    );

    prometheus.wait_for("up{job=\"vtax\"}", 1.0);
    prometheus.wait_for("up{job=\"vtax_wrong_password\"}", 0.0);
    prometheus.wait_for(
        "vtax_collector_success{job=\"vtax\",collector=\"host\"}",
        1.0,
    );
    let cpus = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count();
    prometheus.wait_for(
        "count(vtax_cpu_steal_seconds_total{job=\"vtax\"})",
        cpus as f64,
    );
    // Values from the fixture arrive exactly, with their labels.
    prometheus.wait_for(
        "vtax_infiniband_port_xmit_wait_total{job=\"vtax\",device=\"mlx5_2\",port=\"1\"}",
        3718293871.0,
    );
    prometheus.wait_for(
        "vtax_cgroup_cpu_usage_seconds_total{job=\"vtax\",path=\"/docker\"}",
        123.456789012,
    );
    prometheus.wait_for("count(vtax_infiniband_port_state{job=\"vtax\"} == 4)", 8.0);
    // Counters move: a rate over a few scrapes is positive for total CPU time.
    std::thread::sleep(Duration::from_secs(3));
    let rate = prometheus.query(
        "sum(rate(vtax_cpu_idle_seconds_total{job=\"vtax\"}[4s]) + rate(vtax_cpu_user_seconds_total{job=\"vtax\"}[4s]) + rate(vtax_cpu_system_seconds_total{job=\"vtax\"}[4s]))",
    );
    assert_eq!(rate.len(), 1, "{rate:?}");
    assert!(
        rate[0].1 > 0.1 && rate[0].1 < cpus as f64 * 1.5,
        "CPU seconds per second across {cpus} CPUs: {rate:?}"
    );

    assert!(agent.stop(), "clean exit on SIGTERM");
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn sleep_until_unix(t: f64) {
    let now = unix_now();
    if t > now {
        std::thread::sleep(Duration::from_secs_f64(t - now));
    }
}

/// vtax scrapes a real Prometheus's own /metrics, computes one window's p99 of
/// `prometheus_http_request_duration_seconds{handler="/api/v1/query"}` from
/// the bucket deltas, and gets what that Prometheus answers for the same
/// window with `histogram_quantile`.
///
/// Both see the same requests: they are driven well inside one 10 s window
/// (from 1.5 s after its start to 7.5 s), and both sides scrape every second,
/// so every scrape that bounds the window on either side falls in a quiet
/// stretch. Hence:
/// - against `histogram_quantile(0.99, X - X offset 10s)` at the window's end
///   (the plain bucket deltas between the last samples before each edge) the
///   answer must be the same to rounding;
/// - against `histogram_quantile(0.99, increase(X[10s]))`, what operators
///   write, Prometheus extrapolates each bucket's increase to the range's
///   edges. Extrapolation scales every bucket alike (one scrape's samples
///   share a timestamp) except that a series is not extrapolated below zero:
///   a bucket whose count before the window was small next to its increase
///   is extrapolated less at the start. That moves the quantile by at most a
///   few percent of its bucket's width; the test allows 5% of the value.
#[test]
fn service_latency_p99_matches_prometheus_histogram_quantile() {
    let dir = tempfile::tempdir().unwrap();
    let prometheus = Prometheus::start(
        dir.path(),
        "  - job_name: self\n    static_configs:\n      - targets: ['$SELF']\n",
    );
    let family = "prometheus_http_request_duration_seconds";
    let config = dir.path().join("vtax.toml");
    std::fs::write(
        &config,
        format!(
            "[[scrape]]\nname = \"prometheus\"\nurl = \"http://{}/metrics\"\ninterval_secs = 1\n\
             timeout_secs = 0.8\nwindow_secs = 10\nhistograms = [\"{family}\"]\n",
            prometheus.addr()
        ),
    )
    .unwrap();
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--no-collector.jitter",
    ]);
    agent.wait_for_metric(
        "vtax_scrape_target_up{target=\"prometheus\"} 1",
        Duration::from_secs(30),
    );
    // The handler's series exist before the window opens, on both sides;
    // and a subquery is sized to take about 0.3 s on this machine now.
    let started = Instant::now();
    prometheus.query("count_over_time(vector(1)[1h:100ms])");
    let hours = (0.3 / started.elapsed().as_secs_f64()).clamp(1.0, 24.0) as u32;
    let slow = format!("count_over_time(vector(1)[{hours}h:100ms])");
    // Prometheus must have scraped the handler's buckets itself before the
    // window opens, or the `offset` side has nothing to subtract; on a busy
    // machine its first self-scrape after the first query can come late.
    let selector = format!("{family}_bucket{{job=\"self\",handler=\"/api/v1/query\"}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.query(&selector).is_empty() {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped its own {selector}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut window_start = (unix_now() / 10.0).floor() * 10.0 + 10.0;
    if window_start - unix_now() < 3.0 {
        window_start += 10.0;
    }
    let window_end = window_start + 10.0;

    // A mix of quick queries and subqueries that take tenths of a second,
    // so the window's requests spread over several buckets.
    sleep_until_unix(window_start + 1.5);
    let mut requests = 0u32;
    let mut slowest = 0f64;
    for i in 0..60 {
        // Slow ones only early: none may spill past the window's end.
        let is_slow = i % 10 == 9 && unix_now() < window_start + 5.0;
        if unix_now() > window_start + 7.5 {
            break;
        }
        let started = Instant::now();
        prometheus.query(if is_slow { &slow } else { "up" });
        slowest = slowest.max(started.elapsed().as_secs_f64());
        requests += 1;
    }
    // vtax closes the window at its first scrape after the end and harvests
    // it within a second; Prometheus has scraped itself by then too.
    sleep_until_unix(window_end + 2.5);
    let body = agent.get("/metrics", &[]).text();
    let series = format!(
        "{{target=\"prometheus\",metric=\"{family}\",labels=\"handler=\\\"/api/v1/query\\\"\"}}"
    );
    let read = |field: &str| {
        let name = format!("vtax_service_latency_{field}{series} ");
        body.lines()
            .find_map(|l| l.strip_prefix(&name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
    };
    // A window's count is stored, not exported: its rate times its length.
    let window = read("window_seconds");
    let observations = read("observations_per_second") * window;
    assert!(
        (observations - f64::from(requests)).abs() < 1e-6 * f64::from(requests.max(1)),
        "vtax counted every request of the window, and only those: {observations} of {requests}"
    );
    assert!((window - 10.0).abs() < 0.5, "{window}");
    let vtax_p99 = read("p99_seconds");

    let exact = prometheus.query_at(
        &format!("histogram_quantile(0.99, {selector} - {selector} offset 10s)"),
        window_end,
    );
    let increase = prometheus.query_at(
        &format!("histogram_quantile(0.99, increase({selector}[10s]))"),
        window_end,
    );
    assert_eq!(exact.len(), 1, "{exact:?}");
    assert_eq!(increase.len(), 1, "{increase:?}");
    let (exact, increase) = (exact[0].1, increase[0].1);
    eprintln!(
        "window [{window_start}, {window_end}): {requests} requests (slowest {slowest:.3} s \
         client-side); p99 vtax {vtax_p99:.6} s, Prometheus delta {exact:.6} s, \
         increase() {increase:.6} s"
    );
    assert!(
        (vtax_p99 - exact).abs() <= 1e-9 * exact.max(1.0),
        "vtax {vtax_p99} vs Prometheus {exact} over the same bucket deltas"
    );
    assert!(
        (vtax_p99 - increase).abs() <= 0.05 * increase,
        "vtax {vtax_p99} vs histogram_quantile(increase) {increase}"
    );
    // The slow queries left the first bucket, and so did the p99.
    if slowest > 0.25 {
        assert!(
            vtax_p99 > 0.1,
            "p99 {vtax_p99} with a request of {slowest} s"
        );
    }
    assert!(agent.stop(), "clean exit on SIGTERM");
}
