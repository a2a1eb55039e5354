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
    fn start(dir: &Path, scrape_configs: &str) -> Prometheus {
        let binary = require_program("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
            ),
        )
        .unwrap();
        let port = free_port();
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
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
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
