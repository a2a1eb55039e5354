//! `[[scrape]]` end to end: `vtax run` scrapes a tiny local HTTP server whose
//! histogram grows between scrapes, next to targets that are down, hang,
//! answer garbage and fail then recover. The good target's quantiles come out
//! as worked by hand; every bad one is a counter and one log line; the other
//! collectors and targets keep their pace.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Agent;

/// Each scrape of `/metrics` adds 80 observations at or under 0.1 s and 20
/// in (0.1, 0.5] to `req_seconds{path="/x"}`. Quantiles do not depend on how
/// many scrapes a window spans: p50 = 0.1 * 50/80 = 0.0625, p99 = 0.1 + 0.4
/// * 19/20 = 0.48, p99.9 = 0.1 + 0.4 * 19.9/20 = 0.498.
fn histogram(scrapes: u64) -> String {
    let (fast, all) = (80 * scrapes, 100 * scrapes);
    format!(
        "# HELP req_seconds Request latency.\n# TYPE req_seconds histogram\n\
         req_seconds_bucket{{path=\"/x\",le=\"0.1\"}} {fast}\n\
         req_seconds_bucket{{path=\"/x\",le=\"0.5\"}} {all}\n\
         req_seconds_bucket{{path=\"/x\",le=\"+Inf\"}} {all}\n\
         req_seconds_sum{{path=\"/x\"}} {}\nreq_seconds_count{{path=\"/x\"}} {all}\n\
         # TYPE up_seconds gauge\nup_seconds 42\n",
        scrapes as f64 * 9.5
    )
}

/// Serves `/metrics` (a growing histogram), `/garbage` (HTML) and `/flaky`
/// (503 three times, then the histogram). Returns its address.
fn serve() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let scrapes = Arc::new(AtomicU64::new(0));
    let flaky = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let (scrapes, flaky) = (scrapes.clone(), flaky.clone());
            std::thread::spawn(move || answer(stream, &scrapes, &flaky));
        }
    });
    addr
}

fn answer(mut stream: TcpStream, scrapes: &AtomicU64, flaky: &AtomicU64) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&request);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = match path {
        "/metrics" => (
            "200 OK",
            histogram(scrapes.fetch_add(1, Ordering::SeqCst) + 1),
        ),
        "/garbage" => (
            "200 OK",
            "<html><body>not metrics</body></html>\n".to_string(),
        ),
        "/flaky" if flaky.fetch_add(1, Ordering::SeqCst) < 3 => {
            ("503 Service Unavailable", "warming up\n".to_string())
        }
        "/flaky" => ("200 OK", histogram(1)),
        _ => ("404 Not Found", String::new()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn metric(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

fn query_csv(data: &std::path::Path, args: &[&str]) -> Vec<String> {
    let data = data.to_str().unwrap();
    let args = [
        &["query", "--data-dir", data],
        args,
        &["--since", "0", "--format", "csv"],
    ]
    .concat();
    common::vtax_stdout(args)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bad_targets_are_counters_and_one_log_line_and_stall_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve();
    // Down: a port that was just free. Hang: accepts (the kernel's backlog)
    // and never answers.
    let down = common::free_port();
    let hang = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = |name: &str, url: String, histograms: &str| {
        format!(
            "[[scrape]]\nname = \"{name}\"\nurl = \"{url}\"\ninterval_secs = 1\n\
             timeout_secs = 0.5\nwindow_secs = 2\nhistograms = [{histograms}]\n\n"
        )
    };
    let config = [
        target(
            "good",
            format!("http://{server}/metrics"),
            "\"req_seconds\"",
        ),
        target("down", format!("http://127.0.0.1:{down}/metrics"), ""),
        target(
            "hang",
            format!("http://{}/metrics", hang.local_addr().unwrap()),
            "",
        ),
        target("garbage", format!("http://{server}/garbage"), ""),
        target("flaky", format!("http://{server}/flaky"), "\"req_seconds\""),
    ]
    .concat();
    let config_path = dir.path().join("vtax.toml");
    std::fs::write(&config_path, config).unwrap();
    let data = dir.path().join("data");
    let agent_started = Instant::now();
    let agent = Agent::start(&[
        "--config",
        config_path.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--no-collector.jitter",
    ]);

    let body = agent.wait_for_metric(
        "vtax_scrape_target_up{target=\"flaky\"} 1",
        Duration::from_secs(30),
    );
    let started = Instant::now();
    // Two whole windows of the good target after the flaky one is up.
    let body = {
        let mut body = body;
        while started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(500));
            body = agent.get("/metrics", &[]).text();
        }
        body
    };
    let get = |m: &str| metric(&body, m).unwrap_or_else(|| panic!("no {m} in\n{body}"));
    assert_eq!(get("vtax_scrape_target_up{target=\"good\"}"), 1.0);
    for bad in ["down", "hang", "garbage"] {
        assert_eq!(
            get(&format!("vtax_scrape_target_up{{target=\"{bad}\"}}")),
            0.0
        );
    }
    assert!(get("vtax_scrape_target_failures_connect_total{target=\"down\"}") >= 3.0);
    assert!(get("vtax_scrape_target_failures_timeout_total{target=\"hang\"}") >= 3.0);
    assert!(get("vtax_scrape_target_failures_invalid_total{target=\"garbage\"}") >= 3.0);
    assert_eq!(
        get("vtax_scrape_target_failures_http_total{target=\"flaky\"}"),
        3.0
    );
    assert_eq!(
        get("vtax_scrape_target_failures_timeout_total{target=\"good\"}"),
        0.0
    );
    // A hung target takes its timeout, plus what a loaded machine adds;
    // never the whole hang.
    let hang_duration = get("vtax_scrape_target_duration_seconds{target=\"hang\"}");
    assert!((0.45..2.0).contains(&hang_duration), "{hang_duration}");
    assert_eq!(get("vtax_scrape_target_samples{target=\"good\"}"), 6.0);

    let series = "{target=\"good\",metric=\"req_seconds\",labels=\"path=\\\"/x\\\"\"}";
    let q = |field: &str| get(&format!("vtax_service_latency_{field}{series}"));
    assert!((q("p50_seconds") - 0.0625).abs() < 1e-12, "{body}");
    assert!((q("p99_seconds") - 0.48).abs() < 1e-12);
    assert!((q("p999_seconds") - 0.498).abs() < 1e-12);
    // Windows of 2 s scraped every second: 100 observations per scrape.
    let window = q("window_seconds");
    assert!((1.5..2.5).contains(&window), "{window}");
    // The window's count is stored, not exported: rate times window.
    assert!(metric(&body, &format!("vtax_service_latency_observations{series}")).is_none());
    let observations = q("observations_per_second") * window;
    assert!(
        (observations / 100.0 - (observations / 100.0).round()).abs() < 1e-9,
        "{observations}"
    );
    // The flaky target serves the same histogram every time: empty windows,
    // a zero count and no quantiles rather than made-up ones.
    let flaky = "{target=\"flaky\",metric=\"req_seconds\",labels=\"path=\\\"/x\\\"\"}";
    if let Some(n) = metric(
        &body,
        &format!("vtax_service_latency_observations_per_second{flaky}"),
    ) {
        assert_eq!(n, 0.0);
        assert!(!body.contains(&format!("vtax_service_latency_p99_seconds{flaky}")));
    }
    // The other collectors ran all along.
    assert_eq!(get("vtax_collector_success{collector=\"host\"}"), 1.0);
    assert_eq!(get("vtax_collector_success{collector=\"scrape\"}"), 1.0);
    let scrape_tick = get("vtax_collector_duration_seconds{collector=\"scrape\"}");
    // Below the 0.5 s timeout: the tick never waited for the hanging target.
    assert!(
        scrape_tick < 0.4,
        "the harvest never waits on a target: {scrape_tick}"
    );

    let log = agent.log();
    let run_secs = agent_started.elapsed().as_secs_f64();
    assert!(agent.stop(), "clean exit on SIGTERM while a target hangs");
    let lines = |needle: &str, name: &str| {
        log.lines()
            .filter(|l| l.contains(needle) && l.contains(&format!("target_name=\"{name}\"")))
            .count()
    };
    for bad in ["down", "hang", "garbage", "flaky"] {
        assert_eq!(lines("Scrape target failing", bad), 1, "{bad}:\n{log}");
    }
    assert_eq!(lines("Scrape target recovered", "flaky"), 1, "{log}");
    assert_eq!(lines("Scrape target", "good"), 0, "{log}");
    assert!(
        log.contains("reason=\"timeout\"") || log.contains("reason=timeout"),
        "{log}"
    );

    // The store has every sample, the windows and the status rows; the host
    // collector's ticks kept their one-second pace throughout.
    let scraped = query_csv(&data, &["scraped", "--where", "target=good"]);
    assert_eq!(scraped[0], "time,target,metric,labels,value");
    assert!(
        scraped.iter().any(|l| l.contains(",good,up_seconds,,42")),
        "{scraped:?}"
    );
    assert!(query_csv(&data, &["scraped", "--where", "target=garbage"]).len() == 1);
    let windows = query_csv(&data, &["service_latency", "--where", "target=good"]);
    assert!(windows.len() >= 3, "{windows:?}");
    let host_ticks = query_csv(&data, &["collector", "--where", "collector=host"]).len() - 1;
    assert!(
        host_ticks as f64 >= run_secs - 3.0,
        "{host_ticks} host ticks in about {run_secs:.0} s"
    );
    drop(hang);
}

/// Serves each path's body, whole, to every request; a client that hangs up
/// early (a scrape past its limit) ends that answer.
fn serve_bodies(bodies: Vec<(&'static str, String)>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = Arc::new(bodies);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let bodies = bodies.clone();
            std::thread::spawn(move || {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let Some((_, body)) = bodies.iter().find(|(p, _)| *p == path) else {
                    return;
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Connection: close\r\n\r\n"
                );
                let _ = stream.write_all(body.as_bytes());
            });
        }
    });
    addr
}

fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix(" kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in\n{status}"))
}

/// A target with a million series (a 20.8 MB body) drove the agent's RSS to
/// 403 MB, and the kernel killed it under the unit's `MemoryMax=256M`. A
/// scrape past any of a target's limits is now refused whole (no rows),
/// counted under `failures_limit` and logged once; a target at every limit is
/// stored in full, and the agent keeps running.
#[test]
fn scrapes_past_a_limit_are_refused_whole_and_counted() {
    let series = |n: usize, name: &str| -> String {
        (0..n)
            .map(|i| format!("{name}{{i=\"{i}\"}} {i}\n"))
            .collect()
    };
    let labels = |n: usize, value: &str| -> String {
        (0..n)
            .map(|i| format!("l{i:03}=\"{value}\""))
            .collect::<Vec<_>>()
            .join(",")
    };
    let server = serve_bodies(vec![
        ("/million", series(1_000_000, "huge")),
        ("/over", series(1001, "over")),
        ("/at", series(1000, "at")),
        (
            "/long",
            format!("long{{v=\"{}\"}} 1\n", "x".repeat(64 << 10)),
        ),
        ("/labels", format!("wide{{{}}} 1\n", labels(65, "x"))),
        (
            "/at_labels",
            format!("wide{{{},v=\"{}\"}} 1\n", labels(63, "x"), "x".repeat(2048)),
        ),
    ]);
    let config: String = [
        ("million", "/million", ""),
        ("over", "/over", "sample_limit = 1000\n"),
        ("at", "/at", "sample_limit = 1000\n"),
        ("long", "/long", ""),
        ("labels", "/labels", ""),
        ("at_labels", "/at_labels", ""),
    ]
    .iter()
    .map(|(name, path, extra)| {
        format!(
            "[[scrape]]\nname = \"{name}\"\nurl = \"http://{server}{path}\"\n\
             interval_secs = 1\ntimeout_secs = 0.9\n{extra}\n"
        )
    })
    .collect();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("vtax.toml");
    std::fs::write(&config_path, config).unwrap();
    let data = dir.path().join("data");
    let mut agent = Agent::start(&[
        "--config",
        config_path.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--no-collector.jitter",
    ]);
    agent.wait_for_metric(
        "vtax_scrape_target_failures_limit_total{target=\"million\"} 5",
        Duration::from_secs(60),
    );
    let body = agent.get("/metrics", &[]).text();
    let get = |m: &str| metric(&body, m).unwrap_or_else(|| panic!("no {m} in\n{body}"));
    for refused in ["million", "over", "long", "labels"] {
        assert_eq!(
            get(&format!("vtax_scrape_target_up{{target=\"{refused}\"}}")),
            0.0
        );
        assert!(
            get(&format!(
                "vtax_scrape_target_failures_limit_total{{target=\"{refused}\"}}"
            )) >= 3.0,
            "{refused}"
        );
        assert_eq!(
            get(&format!(
                "vtax_scrape_target_failures_invalid_total{{target=\"{refused}\"}}"
            )),
            0.0
        );
    }
    for accepted in ["at", "at_labels"] {
        assert_eq!(
            get(&format!("vtax_scrape_target_up{{target=\"{accepted}\"}}")),
            1.0
        );
        assert_eq!(
            get(&format!(
                "vtax_scrape_target_failures_limit_total{{target=\"{accepted}\"}}"
            )),
            0.0
        );
    }
    assert_eq!(get("vtax_scrape_target_samples{target=\"at\"}"), 1000.0);
    // Still running, and well inside the unit's MemoryMax=256M.
    assert!(agent.child.try_wait().unwrap().is_none());
    let peak_kib = vm_kib(agent.child.id(), "VmHWM:");
    assert!(peak_kib < 128 << 10, "peak resident {peak_kib} kB");

    let log = agent.log();
    assert!(agent.stop(), "clean exit");
    let failing = |name: &str| -> Vec<&str> {
        log.lines()
            .filter(|l| {
                l.contains("Scrape target failing")
                    && l.contains(&format!("target_name=\"{name}\""))
            })
            .collect()
    };
    for (name, says) in [
        (
            "million",
            "more than sample_limit 50000 samples (line 50001)",
        ),
        ("over", "more than sample_limit 1000 samples (line 1001)"),
        (
            "long",
            "has a value of 65536 bytes, longer than label_value_length_limit_bytes 2048",
        ),
        ("labels", "65 labels, more than label_limit 64"),
    ] {
        let lines = failing(name);
        assert_eq!(lines.len(), 1, "{name}:\n{log}");
        assert!(lines[0].contains(says), "{name}: {}", lines[0]);
        assert!(
            lines[0].contains("reason=\"limit\"") || lines[0].contains("reason=limit"),
            "{}",
            lines[0]
        );
        // Rejected whole: not one of its samples was stored.
        assert_eq!(
            query_csv(&data, &["scraped", "--where", &format!("target={name}")]).len(),
            1,
            "{name}"
        );
    }
    let stored = query_csv(&data, &["scraped", "--where", "target=at"]).len() - 1;
    assert!(
        stored >= 3000 && stored.is_multiple_of(1000),
        "{stored} rows of target at"
    );
    assert!(query_csv(&data, &["scraped", "--where", "target=at_labels"]).len() >= 4);
}
