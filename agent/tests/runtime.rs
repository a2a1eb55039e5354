//! The agent's runtime end to end: config errors, reload on SIGHUP, the
//! collector flags, `vtax doctor`, and shutdown.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, VTAX};

fn vtax(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(VTAX).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn check_config_names_the_file_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vtax.toml");
    let p = path.to_str().unwrap();

    std::fs::write(&path, "[collectors.host]\ninterval_secs = 2\n").unwrap();
    let (ok, stdout, stderr) = vtax(&["check-config", "--config", p]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{p}: valid\n"));

    std::fs::write(
        &path,
        "[web]\nlisten_address = \":1\"\n\n[collectors.hots]\nenabled = false\n",
    )
    .unwrap();
    let (ok, _, stderr) = vtax(&["check-config", "--config", p]);
    assert!(!ok);
    assert!(
        stderr.contains(p) && stderr.contains("line 4") && stderr.contains("hots"),
        "{stderr}"
    );

    std::fs::write(&path, "[store]\nsync_interval_secs = -1\n").unwrap();
    let (ok, _, stderr) = vtax(&["check-config", "--config", p]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("{p}:2: store.sync_interval_secs")),
        "{stderr}"
    );

    // Every problem of the file, each with its line, not only the first.
    std::fs::write(
        &path,
        "[store]\nsync_interval_secs = -1\ncompact_interval_secs = 0\n\n[detect]\nwindow_secs = 0\n",
    )
    .unwrap();
    let (ok, _, stderr) = vtax(&["check-config", "--config", p]);
    assert!(!ok);
    for (line, key) in [
        (2, "store.sync_interval_secs"),
        (3, "store.compact_interval_secs"),
        (6, "window_secs"),
    ] {
        assert!(
            stderr.contains(&format!("{p}:{line}: ")) && stderr.contains(key),
            "{stderr}"
        );
    }

    // A data directory that cannot be one fails the check, as it would fail `run`.
    let file = dir.path().join("afile");
    std::fs::write(&file, "").unwrap();
    std::fs::write(
        &path,
        format!("[store]\ndata_dir = {:?}\n", file.join("data")),
    )
    .unwrap();
    let (ok, _, stderr) = vtax(&["check-config", "--config", p]);
    assert!(!ok);
    assert!(stderr.contains("is a file, not a directory"), "{stderr}");
    std::fs::write(&path, format!("[store]\ndata_dir = {file:?}\n")).unwrap();
    let (ok, _, stderr) = vtax(&["check-config", "--config", p]);
    assert!(!ok);
    assert!(
        stderr.contains("afile is a file, not a directory"),
        "{stderr}"
    );

    let (ok, _, stderr) = vtax(&["check-config", "--config", "/nonexistent/vtax.toml"]);
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/vtax.toml"), "{stderr}");

    // A flag's bad value is an error too, naming the value.
    let (ok, _, stderr) = vtax(&["check-config", "--web.listen-address", "nowhere"]);
    assert!(!ok);
    assert!(stderr.contains("\"nowhere\""), "{stderr}");

    // A web config file that does not load fails the check.
    let web = dir.path().join("web.yml");
    std::fs::write(&web, "basic_auth_users:\n  prom: not-a-hash\n").unwrap();
    let (ok, _, stderr) = vtax(&["check-config", "--web.config.file", web.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("not a bcrypt hash"), "{stderr}");
}

#[test]
fn print_defaults_is_the_shipped_example() {
    let (ok, stdout, _) = vtax(&["check-config", "--print-defaults"]);
    assert!(ok);
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/vtax.example.toml"
    ))
    .unwrap();
    assert_eq!(stdout, shipped);
}

#[test]
fn doctor_lists_every_collector_with_a_reason() {
    let (ok, stdout, stderr) = vtax(&["doctor", "--no-collector.cgroups"]);
    assert!(ok, "{stderr}");
    for name in ["host", "cgroups", "infiniband", "platform"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(name)),
            "{name} missing:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("cgroups     off  disabled by configuration"),
        "{stdout}"
    );
    assert!(stdout.contains("host        on"), "{stdout}");
}

/// What a start would refuse beyond the config's values is among the
/// doctor's problems, with its key.
#[test]
fn doctor_names_a_web_config_file_that_is_not_there() {
    let (ok, stdout, stderr) = vtax(&[
        "doctor",
        "--no-collector.cgroups",
        "--no-collector.jitter",
        "--web.config.file",
        "/nonexistent/web.yml",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("  - web.config_file: /nonexistent/web.yml: "),
        "{stdout}"
    );
}

fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `vtax run` with `config_text` in `dir/vtax.toml` and its store in
/// `dir/data`, and `more` flags: the agent, the config file, the data
/// directory.
fn start_with_config(
    dir: &std::path::Path,
    config_text: &str,
    more: &[&str],
) -> (Agent, std::path::PathBuf, std::path::PathBuf) {
    let config = dir.join("vtax.toml");
    std::fs::write(&config, config_text).unwrap();
    let data = dir.join("data");
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    (Agent::start(&args), config, data)
}

#[test]
fn sighup_reloads_the_config_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, config, _data) =
        start_with_config(dir.path(), "[collectors.host]\ninterval_secs = 0.2\n", &[]);
    agent.wait_for_metric("vtax_cpu_idle_seconds_total", Duration::from_secs(20));

    std::fs::write(&config, "[collectors.host]\nenabled = false\n").unwrap();
    agent.signal(libc::SIGHUP);
    wait_until("host to leave /metrics", Duration::from_secs(20), || {
        !agent
            .get("/metrics", &[])
            .text()
            .contains("vtax_cpu_idle_seconds_total")
    });
    assert!(
        agent.log().contains("Configuration reloaded."),
        "{}",
        agent.log()
    );
    let config_gauges = || {
        let body = agent.get("/metrics", &[]).text();
        ["last_reload_successful", "restart_pending"].map(|field| {
            let prefix = format!("vtax_config_{field} ");
            body.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(str::to_string)
        })
    };
    let both =
        |successful: &str, pending: &str| [Some(successful.to_string()), Some(pending.to_string())];
    assert_eq!(config_gauges(), both("1", "0"));

    std::fs::write(&config, "[collectors.host]\nenabled = maybe\n").unwrap();
    agent.signal(libc::SIGHUP);
    wait_until("the refusal in the log", Duration::from_secs(20), || {
        agent.log().contains("Reload refused")
    });
    assert!(agent.log().contains("line 2"), "{}", agent.log());
    // Still serving, with the last good configuration, and saying so.
    assert_eq!(agent.get("/metrics", &[]).status, 200);
    wait_until(
        "a refused reload on /metrics",
        Duration::from_secs(20),
        || config_gauges() == both("0", "0"),
    );

    // A section read only at the start: due at the next restart, and still
    // due after another reload of the same file.
    let restart = "take effect at the next restart";
    std::fs::write(
        &config,
        "[collectors.host]\nenabled = false\n[store]\nsync_interval_secs = 2.0\n",
    )
    .unwrap();
    for reloads in 1..=2 {
        agent.signal(libc::SIGHUP);
        wait_until(
            "the restart due in the log",
            Duration::from_secs(20),
            || agent.log().matches(restart).count() == reloads,
        );
        wait_until("a restart due on /metrics", Duration::from_secs(20), || {
            config_gauges() == both("1", "1")
        });
    }
    assert!(agent.stop());
}

/// Every counter series of a text exposition (counter families, and the
/// buckets, counts and sums of histograms), by name and labels.
fn counter_series(body: &str) -> BTreeMap<String, f64> {
    let mut counters = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for line in body.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            match kind {
                "counter" => counters.insert(name.to_string()),
                "histogram" => histograms.insert(name.to_string()),
                _ => false,
            };
        }
    }
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let name = series.split('{').next().unwrap_or(series);
            counters.contains(name)
                || ["_bucket", "_count", "_sum"].iter().any(|suffix| {
                    name.strip_suffix(suffix)
                        .is_some_and(|family| histograms.contains(family))
                })
        })
        .map(|(series, value)| (series.to_string(), value.parse().expect("a number")))
        .collect()
}

/// A reload must never move a counter back or take a live series away: an
/// XID counter once fell from 6 to 1 on SIGHUP, and the GPU's series left
/// `/metrics` until its next tick. The agent runs on a fixture tree (whose
/// counters stand still) with simulated GPUs (whose counters grow, one with
/// XIDs, one lost) and is scraped every 50 ms through two reloads: one that
/// changes nothing, one that changes the GPU and host collectors' settings.
/// No counter series of the whole exposition may go down or vanish from one
/// scrape to the next.
#[test]
fn a_reload_moves_no_counter_back_and_drops_no_series() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vtax.toml");
    let settings = |gpu_processes: bool, host_interval_secs: f64| {
        format!(
            "[collectors.host]\ninterval_secs = {host_interval_secs}\n\n\
             [collectors.gpu]\nsimulate_gpus = 3\n\
             simulate_scenarios = [\"training\", \"xid\", \"gpu-lost\"]\n\
             processes = {gpu_processes}\n"
        )
    };
    std::fs::write(&config, settings(true, 0.5)).unwrap();
    let fixture = common::fixtures().join("baremetal-node");
    let data = dir.path().join("data");
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--path.procfs",
        fixture.join("proc").to_str().unwrap(),
        "--path.sysfs",
        fixture.join("sys").to_str().unwrap(),
    ]);
    agent.wait_for_metric("vtax_gpu_xid_errors_total{", Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));

    let reloads = || agent.log().matches("Configuration reloaded.").count();
    let mut scrapes = vec![agent.get("/metrics", &[]).text()];
    let mut scrape_until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            scrapes.push(agent.get("/metrics", &[]).text());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    agent.signal(libc::SIGHUP);
    scrape_until("the first reload", &|| reloads() == 1);
    std::fs::write(&config, settings(false, 0.25)).unwrap();
    agent.signal(libc::SIGHUP);
    scrape_until("the second reload", &|| reloads() == 2);
    let after = Instant::now() + Duration::from_millis(2500);
    scrape_until("the ticks after the reload", &|| Instant::now() >= after);
    assert!(agent.stop());

    let series = counter_series(&scrapes[0]);
    assert!(
        series
            .keys()
            .any(|s| s.starts_with("vtax_gpu_xid_errors_total{"))
            && series.keys().any(|s| s.starts_with("vtax_cpu_")),
        "GPU and host counters before the reloads:\n{}",
        scrapes[0]
    );
    for (at, pair) in scrapes.windows(2).enumerate() {
        let (before, after) = (counter_series(&pair[0]), counter_series(&pair[1]));
        for (series, value) in &before {
            match after.get(series) {
                Some(now) => assert!(
                    now >= value,
                    "{series} went from {value} to {now} between scrapes {at} and {}",
                    at + 1
                ),
                None => panic!("{series} vanished between scrapes {at} and {}", at + 1),
            }
        }
    }
    // The GPU collector, built anew by the second reload, went on ticking.
    let first = counter_series(&scrapes[0]);
    let last = counter_series(scrapes.last().unwrap());
    assert!(
        first.iter().any(|(series, value)| {
            series.starts_with("vtax_gpu_energy_joules_total{")
                && last.get(series).is_some_and(|now| now > value)
        }),
        "no GPU energy counter grew across the reloads"
    );
}

#[test]
fn no_collector_flag_overrides_the_file_and_shutdown_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, config, data) = start_with_config(
        dir.path(),
        "[collectors.host]\nenabled = true\ninterval_secs = 0.1\n",
        &["--no-collector.host"],
    );
    std::thread::sleep(Duration::from_millis(500));
    let body = agent.get("/metrics", &[]).text();
    assert!(!body.contains("vtax_cpu_"), "{body}");
    // The flag, not an absent source, turned it off (the line names both).
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("Collector disabled by configuration.")
                && l.contains("collector=\"host\"")),
        "{}",
        agent.log()
    );
    assert!(agent.stop());

    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    agent.wait_for_metric(
        "vtax_collector_success{collector=\"host\"} 1",
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(agent.stop());
    // The collector's own rows were published on SIGTERM, beside the host's.
    for table in ["cpu", "collector"] {
        let dir = data.join("tables").join(table);
        assert!(
            std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0) > 0,
            "{} has no partitions",
            dir.display()
        );
    }
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            let link = std::fs::read_link(entry.path()).unwrap();
            std::os::unix::fs::symlink(link, target).unwrap();
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The value of the runtime's `vtax_collector_<field>` gauge for `collector`.
fn collector_gauge(body: &str, field: &str, collector: &str) -> Option<String> {
    let prefix = format!("vtax_collector_{field}{{collector=\"{collector}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
}

fn success(body: &str, collector: &str) -> Option<String> {
    collector_gauge(body, "success", collector)
}

fn failed_sources(body: &str, collector: &str) -> Option<String> {
    collector_gauge(body, "failed_sources", collector)
}

/// Cgroups over `max_cgroups` are a series, `vtax_collector_left_out`, that
/// a rule reads, and not only a log line at the moment the cap was reached.
#[test]
fn cgroups_over_max_cgroups_are_counted_on_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let root = common::fixtures().join("baremetal-node");
    let (agent, _, _) = start_with_config(
        dir.path(),
        "[collectors.cgroups]\ninterval_secs = 0.2\nmax_cgroups = 2\n",
        &[
            "--path.procfs",
            root.join("proc").to_str().unwrap(),
            "--path.sysfs",
            root.join("sys").to_str().unwrap(),
        ],
    );
    let left_out = || {
        let body = agent.get("/metrics", &[]).text();
        collector_gauge(&body, "left_out", "cgroups").map(|v| (v, body))
    };
    wait_until(
        "the cgroups collector's row",
        Duration::from_secs(20),
        || left_out().is_some(),
    );
    let (value, body) = left_out().unwrap();
    let paths: BTreeSet<&str> = body
        .lines()
        .filter(|l| l.starts_with("vtax_cgroup_"))
        .filter_map(|l| l.split("path=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    let value: u64 = value.parse().unwrap();
    assert!(value > 0, "{body}");
    let host = collector_gauge(&body, "left_out", "host");
    assert_eq!(host.as_deref(), Some("0"), "a collector with no cap");
    assert!(agent.stop());
}

/// Sources that read badly when the agent starts do not switch their
/// collector off until a restart: block and filesystem are failing on
/// `/metrics` (and in `vtax doctor`), are probed again, and read once the
/// files are mended; an empty `pressure/cpu` costs the host only that row,
/// and one interface's bad counter costs netdev only that field.
#[test]
fn sources_bad_at_start_are_read_once_mended_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("node");
    copy_tree(&common::fixtures().join("baremetal-node"), &root);
    let config = dir.path().join("vtax.toml");
    let collectors = ["host", "block", "netdev", "filesystem"];
    let fast = collectors
        .iter()
        .map(|c| format!("[collectors.{c}]\ninterval_secs = 0.2\n"))
        .collect::<String>();
    std::fs::write(&config, fast).unwrap();
    let damage = [
        ("proc/diskstats", "259 0 nvme0n1 1 2 three\n"),
        ("proc/self/mountinfo", "junk\n"),
        (
            "sys/devices/pci0000:00/0000:00:1c.0/0000:03:00.0/net/eno1/statistics/rx_bytes",
            "lots\n",
        ),
        ("proc/pressure/cpu", ""),
    ];
    let good: Vec<Vec<u8>> = damage
        .iter()
        .map(|(file, junk)| {
            let path = root.join(file);
            let good = std::fs::read(&path).unwrap();
            std::fs::write(&path, junk).unwrap();
            good
        })
        .collect();
    let procfs = root.join("proc");
    let sysfs = root.join("sys");
    let paths = [
        "--config",
        config.to_str().unwrap(),
        "--path.procfs",
        procfs.to_str().unwrap(),
        "--path.sysfs",
        sysfs.to_str().unwrap(),
    ];
    let (_, doctor, _) = vtax(&[&["doctor"][..], &paths[..]].concat());
    for name in ["block", "filesystem"] {
        assert!(
            doctor.contains(&format!("{name:<11} off  its source reads badly")),
            "{doctor}"
        );
    }
    // One interface's counter costs that field, not the collector.
    assert!(
        doctor.contains("proc/diskstats:1")
            && doctor.contains("proc/pressure/cpu: no some or full line")
            && doctor.contains("eno1/statistics/rx_bytes: \"lots\" is not a number"),
        "{doctor}"
    );

    let data = dir.path().join("data");
    let agent = Agent::start(&[&paths[..], &["--data-dir", data.to_str().unwrap()]].concat());
    wait_until(
        "the damaged sources to show",
        Duration::from_secs(20),
        || {
            let body = agent.get("/metrics", &[]).text();
            ["block", "filesystem"]
                .iter()
                .all(|c| success(&body, c).as_deref() == Some("0"))
                && ["host", "netdev"].iter().all(|c| {
                    success(&body, c).as_deref() == Some("1")
                        && failed_sources(&body, c).as_deref() == Some("1")
                })
        },
    );
    let body = agent.get("/metrics", &[]).text();
    assert!(
        body.contains("vtax_cpu_steal_seconds_total{cpu=\"0\"}"),
        "{body}"
    );
    assert!(body.contains("vtax_pressure_some_stalled_seconds_total{resource=\"memory\"}"));
    assert!(!body.contains("vtax_pressure_some_stalled_seconds_total{resource=\"cpu\"}"));
    assert!(body.contains("vtax_netdev_tx_bytes_total{interface=\"eno1\"}"));
    assert!(!body.contains("vtax_netdev_rx_bytes_total{interface=\"eno1\"}"));

    for ((file, _), good) in damage.iter().zip(good) {
        std::fs::write(root.join(file), good).unwrap();
    }
    wait_until("every collector to read", Duration::from_secs(30), || {
        let body = agent.get("/metrics", &[]).text();
        collectors
            .iter()
            .all(|c| success(&body, c).as_deref() == Some("1"))
            && failed_sources(&body, "host").as_deref() == Some("0")
            && failed_sources(&body, "netdev").as_deref() == Some("0")
            && body.contains("vtax_block_read_bytes_total{device=\"nvme0n1\"}")
            && body.contains("vtax_netdev_rx_bytes_total{interface=\"eno1\"}")
            && body.contains("vtax_pressure_some_stalled_seconds_total{resource=\"cpu\"}")
    });
    let log = agent.log();
    assert!(log.contains("Collector's source reads badly"), "{log}");
    assert_eq!(
        log.matches("Collector enabled: its source is there")
            .count(),
        2,
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(agent.stop());
}

/// Garbage in one source fails that collector's ticks only; a port that
/// disappears just loses its series; the agent never panics, and recovers
/// when the source is sane again.
#[test]
fn garbage_and_vanishing_sources_fail_only_their_collector() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("node");
    copy_tree(&common::fixtures().join("baremetal-node"), &root);
    let config = dir.path().join("vtax.toml");
    let collectors = [
        "host",
        "cgroups",
        "infiniband",
        "platform",
        "block",
        "netdev",
        "filesystem",
    ];
    let fast = collectors
        .iter()
        .map(|c| format!("[collectors.{c}]\ninterval_secs = 0.2\n"))
        .collect::<String>();
    std::fs::write(&config, fast).unwrap();
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--path.procfs",
        root.join("proc").to_str().unwrap(),
        "--path.sysfs",
        root.join("sys").to_str().unwrap(),
    ]);
    let all_up = |body: &str| {
        collectors
            .iter()
            .all(|c| success(body, c).as_deref() == Some("1"))
    };
    wait_until(
        "every collector to succeed",
        Duration::from_secs(20),
        || all_up(&agent.get("/metrics", &[]).text()),
    );
    let port_series = "vtax_infiniband_port_xmit_wait_total{device=\"mlx5_2\"";
    assert!(agent.get("/metrics", &[]).text().contains(port_series));
    let nic_series = "vtax_netdev_rx_bytes_total{interface=\"ens22f0np0\"}";
    assert!(agent.get("/metrics", &[]).text().contains(nic_series));

    let stat = root.join("proc/stat");
    let good_stat = std::fs::read(&stat).unwrap();
    std::fs::write(&stat, "cpu0 12 zz 4\n").unwrap();
    std::fs::remove_dir_all(root.join("sys/class/infiniband/mlx5_2")).unwrap();
    let diskstats = root.join("proc/diskstats");
    let good_diskstats = std::fs::read(&diskstats).unwrap();
    std::fs::write(&diskstats, "259 0 nvme0n1 1 2 three\n").unwrap();
    std::fs::remove_file(root.join("sys/class/net/ens22f0np0")).unwrap();
    wait_until(
        "stat to fail, block to fail, mlx5_2 and ens22f0np0 to go",
        Duration::from_secs(20),
        || {
            let body = agent.get("/metrics", &[]).text();
            failed_sources(&body, "host").as_deref() == Some("1")
                && success(&body, "host").as_deref() == Some("1")
                && success(&body, "block").as_deref() == Some("0")
                && success(&body, "infiniband").as_deref() == Some("1")
                && success(&body, "cgroups").as_deref() == Some("1")
                && success(&body, "netdev").as_deref() == Some("1")
                && !body.contains(port_series)
                && !body.contains(nic_series)
        },
    );
    let body = agent.get("/metrics", &[]).text();
    assert!(
        !body.contains("vtax_cpu_user_seconds_total"),
        "a bad file's series leave"
    );
    assert!(
        body.contains("vtax_load1 ") && body.contains("vtax_memory_total_bytes "),
        "the host's other files are still read"
    );
    assert!(body.contains("vtax_infiniband_port_xmit_wait_total{device=\"mlx5_0\""));
    assert!(!body.contains("vtax_block_read_bytes_total"));
    assert!(body.contains("vtax_netdev_rx_bytes_total{interface=\"eno1\"}"));

    std::fs::write(&stat, good_stat).unwrap();
    std::fs::write(&diskstats, good_diskstats).unwrap();
    wait_until("host to recover", Duration::from_secs(20), || {
        let body = agent.get("/metrics", &[]).text();
        all_up(&body) && failed_sources(&body, "host").as_deref() == Some("0")
    });
    let log = agent.log();
    assert!(
        log.contains("Source reads badly")
            && log.contains("proc/stat:1")
            && log.contains("Collector failed")
            && log.contains("proc/diskstats:1"),
        "{log}"
    );
    assert_eq!(
        log.matches("Source reads badly").count(),
        1,
        "logged once, not every tick: {log}"
    );
    assert!(log.contains("Source reads well again"), "{log}");
    assert!(log.contains("Collector recovered"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(agent.stop());
}

/// A source whose read never returns (a FIFO here; a sysfs file of a wedged
/// driver, NVML's init on a GPU that fell off the bus in the field) holds up
/// only its own collector: the others start and read, the stuck one reports
/// failing instead of showing what it read before, a reload turns it off,
/// and the agent still stops; `vtax doctor` names it and examines the others.
#[test]
fn a_read_that_never_returns_holds_up_only_its_collector() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("node");
    copy_tree(&common::fixtures().join("vm-node"), &root);
    let loadavg = root.join("proc/loadavg");
    std::fs::remove_file(&loadavg).unwrap();
    let made = Command::new("mkfifo").arg(&loadavg).status().unwrap();
    assert!(made.success());
    let (procfs, sysfs) = (root.join("proc"), root.join("sys"));
    let paths = [
        "--path.procfs",
        procfs.to_str().unwrap(),
        "--path.sysfs",
        sysfs.to_str().unwrap(),
    ];
    // The doctor names it and goes on to the others.
    let (ok, stdout, stderr) = vtax(&[&["doctor"][..], &paths[..]].concat());
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("host        ??   its probe or read did not return in 15 s"),
        "{stdout}"
    );
    assert!(stdout.contains("block       on "), "{stdout}");

    let mut more = paths.to_vec();
    more.push("--no-collector.jitter");
    let (agent, config, _data) = start_with_config(dir.path(), "", &more);
    wait_until(
        "block and netdev to read, host to report failing",
        Duration::from_secs(40),
        || {
            let body = agent.get("/metrics", &[]).text();
            success(&body, "block").as_deref() == Some("1")
                && success(&body, "netdev").as_deref() == Some("1")
                && success(&body, "host").as_deref() == Some("0")
        },
    );
    let body = agent.get("/metrics", &[]).text();
    assert!(!body.contains("vtax_memory_total_bytes"), "{body}");
    // Turned off by a reload while stuck: it leaves /metrics, failing
    // status and all, though its thread could not be stopped.
    std::fs::write(&config, "[collectors.host]\nenabled = false\n").unwrap();
    agent.signal(libc::SIGHUP);
    wait_until(
        "the stuck host to leave /metrics",
        Duration::from_secs(30),
        || success(&agent.get("/metrics", &[]).text(), "host").is_none(),
    );
    let stopping = Instant::now();
    let mut agent = agent;
    agent.signal(libc::SIGTERM);
    let status = agent.child.wait().unwrap();
    assert!(status.success());
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "stopped in {:?}",
        stopping.elapsed()
    );
    let log = agent.log();
    assert!(log.contains("Collector stuck"), "{log}");
    assert!(log.contains("left behind"), "{log}");
}

/// The agent stopped for 6 s (SIGSTOP; a paused VM stops the probe the same
/// way): the wake-up that ends the stall reads as late as it was, not
/// clamped, and no window holds more probed time than its length (the
/// stall's wall time was charged to the window open when it began).
#[test]
fn a_stopped_probe_reports_its_stall_as_long_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _config, data) =
        start_with_config(dir.path(), "[collectors.jitter]\nwindow_secs = 2\n", &[]);
    agent.wait_for_metric(
        "vtax_jitter_wakeup_latency_seconds_count",
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_secs(1));
    agent.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(6));
    agent.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(6));
    assert!(agent.stop());
    let rows = common::query_rows(&data, "jitter");
    let field = |row: &serde_json::Value, name: &str| row[name].as_f64();
    let longest = rows
        .iter()
        .filter_map(|r| field(r, "wakeup_max_seconds"))
        .fold(0.0, f64::max);
    assert!(
        (5.0..30.0).contains(&longest),
        "longest wake-up {longest} s"
    );
    for row in &rows {
        let probed = field(row, "probed_seconds").unwrap_or(0.0);
        assert!(probed <= 2.5, "a 2 s window probed {probed} s: {row}");
    }
}

/// Under systemd (`Type=notify`, `WatchdogSec=`), the agent says READY=1 once
/// it serves, feeds the watchdog at half its timeout, and says STOPPING=1.
#[test]
fn systemd_hears_ready_watchdog_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut child = std::process::Command::new(common::VTAX)
        .args([
            "run",
            "--web.listen-address",
            "127.0.0.1:0",
            "--duration-secs",
            "3",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut heard = Vec::new();
    let mut buf = [0u8; 256];
    while !heard.iter().any(|m: &String| m.contains("STOPPING=1")) {
        let n = socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification ({e}); heard {heard:?}"));
        heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(
        heard.first().map(String::as_str),
        Some("READY=1\n"),
        "{heard:?}"
    );
    let pings = heard
        .iter()
        .filter(|m| m.as_str() == "WATCHDOG=1\n")
        .count();
    // 3 s at one ping per 0.5 s: at least 4 even on a slow machine.
    assert!(pings >= 4, "{pings} watchdog pings: {heard:?}");
}

fn jitter_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|comm| comm.trim() == "vtax-jitter")
        .count()
}

#[test]
fn the_jitter_probe_thread_starts_and_stops_with_its_collector() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vtax.toml");
    std::fs::write(
        &config,
        "[collectors.jitter]\nwindow_secs = 1\nsched_fifo = true\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = vtax(&["doctor", "--config", config.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("jitter"))
        .unwrap_or_else(|| panic!("no jitter line:\n{stdout}"));
    assert!(
        line.contains("SCHED_FIFO priority 1") || line.contains("SCHED_OTHER (SCHED_FIFO refused"),
        "the doctor says which policy: {line}"
    );

    let data = dir.path().join("data");
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let body = agent.wait_for_metric(
        "vtax_jitter_wakeup_latency_seconds_count",
        Duration::from_secs(30),
    );
    assert!(
        body.contains("vtax_jitter_wakeup_p99_seconds{cpu="),
        "{body}"
    );
    assert_eq!(jitter_threads(agent.child.id()), 1);
    // Between windows the last window's series stay on /metrics.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(300));
        assert!(agent
            .get("/metrics", &[])
            .text()
            .contains("vtax_jitter_wakeup_p99_seconds"));
    }

    std::fs::write(&config, "[collectors.jitter]\nenabled = false\n").unwrap();
    agent.signal(libc::SIGHUP);
    wait_until("the probe thread to end", Duration::from_secs(20), || {
        jitter_threads(agent.child.id()) == 0
    });
    // The thread ends as its collector is dropped; the series leave
    // /metrics right after, at the next render.
    wait_until("jitter to leave /metrics", Duration::from_secs(20), || {
        !agent
            .get("/metrics", &[])
            .text()
            .contains("vtax_jitter_wakeup")
    });
    assert!(agent.stop());
}

/// A config with every numeric key of the shipped example at one end of
/// the range the example states (`Range: between A and B.`).
fn example_at_range_ends(upper: bool) -> String {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/vtax.example.toml"
    ))
    .unwrap();
    let mut out = String::new();
    let mut range: Option<(String, String)> = None;
    for line in example.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            range = comment.split("Range: ").nth(1).and_then(|r| {
                let r = r.trim_end_matches('.');
                if let Some(rest) = r.strip_prefix("between ") {
                    let (lo, hi) = rest.split_once(" and ")?;
                    Some((lo.to_string(), hi.to_string()))
                } else {
                    let rest = r.strip_prefix("above ")?;
                    let (_, hi) = rest.split_once(" and at most ")?;
                    // Above the lower end, by a little.
                    Some(("0.001".to_string(), hi.to_string()))
                }
            });
            out.push_str(line);
            out.push('\n');
            continue;
        }
        match (line.split_once(" = "), range.take()) {
            // A number, not a list of them (`cpus = []`).
            (Some((key, default)), Some((lo, hi))) if default.parse::<f64>().is_ok() => {
                let end = if upper { hi } else { lo };
                let value = if default.contains('.') {
                    let v: f64 = end.parse().unwrap();
                    format!("{v:?}")
                } else {
                    // An integer key: "above 0" means 1.
                    let v: f64 = end.parse().unwrap();
                    format!("{}", (v.ceil() as u64).max(u64::from(end == "0.001")))
                };
                out.push_str(&format!("{key} = {value}\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Every numeric key at the low end of its range, then at the high end.
/// Where keys bound each other (the memory bounds together, `z_close`
/// below `z_open`), check-config refuses the file naming each line, and
/// those lines go back to their defaults until it accepts it; then the
/// agent runs and stops cleanly, with no panic (a `compact_interval_secs`
/// near u64::MAX once crashed `run` at start while check-config passed it).
#[test]
fn the_ends_of_every_range_run_never_panic() {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/vtax.example.toml"
    ))
    .unwrap();
    let defaults: Vec<&str> = example.lines().collect();
    for upper in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("vtax.toml");
        let c = config.to_str().unwrap();
        let mut lines: Vec<String> = example_at_range_ends(upper)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), defaults.len());
        let mut at_ends = lines.len();
        loop {
            std::fs::write(&config, lines.join("\n") + "\n").unwrap();
            let (ok, _, stderr) = vtax(&["check-config", "--config", c]);
            if ok {
                break;
            }
            assert!(!stderr.contains("panicked"), "{stderr}");
            let refused: Vec<usize> = stderr
                .lines()
                .filter_map(|l| l.split(&format!("{c}:")).nth(1))
                .filter_map(|rest| rest.split(':').next()?.parse().ok())
                .collect();
            assert!(!refused.is_empty(), "refused without a line: {stderr}");
            let before = at_ends;
            for line in refused {
                if lines[line - 1] != defaults[line - 1] {
                    lines[line - 1] = defaults[line - 1].to_string();
                    at_ends -= 1;
                }
            }
            if at_ends == before {
                // A rule over several keys names one line (the memory
                // bounds): take back every key its message names.
                for word in stderr.split_whitespace() {
                    let Some(key) = word.rsplit('.').next().filter(|k| k.contains('_')) else {
                        continue;
                    };
                    let at: Vec<usize> = (0..lines.len())
                        .filter(|&i| lines[i].starts_with(&format!("{key} = ")))
                        .collect();
                    if let [i] = at[..] {
                        if lines[i] != defaults[i] {
                            lines[i] = defaults[i].to_string();
                            at_ends -= 1;
                        }
                    }
                }
            }
            if at_ends == before {
                // A rule whose message names one key of several (the
                // detector's look-back against its windows): the section
                // of each line named goes back to its defaults.
                for line in stderr
                    .lines()
                    .filter_map(|l| l.split(&format!("{c}:")).nth(1))
                    .filter_map(|rest| rest.split(':').next()?.parse::<usize>().ok())
                {
                    let start = (0..line).rev().find(|&i| lines[i].starts_with('['));
                    let end = (line..lines.len())
                        .find(|&i| lines[i].starts_with('['))
                        .unwrap_or(lines.len());
                    for i in start.unwrap_or(0)..end {
                        if lines[i] != defaults[i] {
                            lines[i] = defaults[i].to_string();
                            at_ends -= 1;
                        }
                    }
                }
            }
            assert!(at_ends < before, "nothing to take back: {stderr}");
        }
        assert!(at_ends > lines.len() - 12, "most keys stay at their ends");
        let data = dir.path().join("data");
        let agent = Agent::start(&["--config", c, "--data-dir", data.to_str().unwrap()]);
        std::thread::sleep(Duration::from_secs(2));
        let log = agent.log();
        assert!(agent.stop(), "upper={upper}: not a clean stop:\n{log}");
        assert!(!log.contains("panicked"), "{log}");
    }
}
