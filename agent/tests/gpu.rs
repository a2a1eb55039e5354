//! The GPU collector end to end on the simulated backend: `vtax run
//! --simulate-gpus` serves every GPU's series, a lost GPU stops nothing else,
//! and the rows reach the Parquet store. (The NVML backend runs against a
//! fake NVML in gpu_nvml.rs, and on a lent GPU through scripts/gpu-smoke.sh.)

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Agent;

#[test]
fn simulated_gpus_are_served_stored_and_a_lost_one_stops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--simulate-gpus",
        "8",
        "--simulate-gpu-scenarios",
        "training,memory-bound,thermal-throttle,power-throttle,pcie-degraded,nvlink-hidden,xid,gpu-lost",
        "--no-collector.cgroups",
    ]);
    agent.wait_for_metric(
        "vtax_collector_success{collector=\"gpu\"} 1",
        Duration::from_secs(20),
    );
    // A second tick, so the store has more than one row per GPU.
    std::thread::sleep(Duration::from_millis(1500));
    let body = agent.get("/metrics", &[]).text();
    let up = |gpu: u32| {
        body.lines()
            .find(|l| l.starts_with("vtax_gpu_health_up{") && l.contains(&format!("gpu=\"{gpu}\"")))
            .unwrap_or_else(|| panic!("no health row for GPU {gpu}:\n{body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
    };
    for gpu in 0..7 {
        assert_eq!(up(gpu), "1", "GPU {gpu}");
    }
    assert_eq!(up(7), "0", "the lost GPU");
    let utilization_rows = body
        .lines()
        .filter(|l| l.starts_with("vtax_gpu_utilization_ratio{"))
        .count();
    assert_eq!(
        utilization_rows, 7,
        "every GPU but the lost one has samples"
    );
    assert!(
        body.contains("vtax_gpu_xid_errors_total{gpu=\"7\""),
        "XID 79 counted"
    );
    assert!(body.contains("vtax_gpu_hbm_peak_bytes_per_second{gpu=\"0\""));
    assert!(agent
        .log()
        .lines()
        .any(|l| l.contains("GPU lost") && l.contains("gpu=7")));
    assert!(agent.stop());

    // Every tick's rows reached the store, the event of the lost GPU too.
    let query = |table: &str, filter: &str| {
        let data_dir = data.to_str().unwrap();
        common::vtax_stdout([
            "query",
            "--data-dir",
            data_dir,
            table,
            "--where",
            filter,
            "--format",
            "csv",
        ])
    };
    let events = query("gpu_event", "gpu=7");
    assert!(events.contains("lost"), "{events}");
    let samples = query("gpu", "gpu=2");
    assert!(
        samples.lines().count() >= 3,
        "a header and two ticks:\n{samples}"
    );
    assert!(
        query("gpu", "gpu=7").lines().count() <= 1,
        "no sample of a lost GPU"
    );
}

/// `vtax doctor --gpu` as an operator meets it on simulated H100s (from
/// "What an operator meets"): one verdict line, a lost GPU listed as lost,
/// values in their units, and no log line in the report; the log goes to
/// stderr when asked for, and says nothing the report says otherwise.
#[test]
fn doctor_answers_plainly_on_simulated_gpus_with_a_lost_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doctor = |log: Option<&str>| {
        let mut command = std::process::Command::new(common::VTAX);
        command.args([
            "doctor",
            "--gpu",
            "--data-dir",
            data.to_str().unwrap(),
            "--simulate-gpus",
            "8",
            "--simulate-gpu-scenarios",
            "training,memory-bound,thermal-throttle,power-throttle,pcie-degraded,nvlink-hidden,mig,gpu-lost",
            "--no-collector.cgroups",
        ]);
        command.env_remove("VTAX_LOG");
        if let Some(level) = log {
            command.env("VTAX_LOG", level);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (stdout, stderr) = doctor(Some("info"));

    let verdicts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("verdict"))
        .collect();
    assert_eq!(verdicts.len(), 1, "one verdict line:\n{stdout}");
    let verdict = verdicts[0];
    assert!(
        ["bare metal", "virtual machine", "virtualization unknown"]
            .iter()
            .any(|host| verdict.contains(host)),
        "bare metal or a VM: {verdict}"
    );
    assert!(
        verdict.contains("8 GPUs") && verdict.contains("MIG on 1 of 8"),
        "the GPUs' virtualization in the same line: {verdict}"
    );

    let lost = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("GPU 7 "))
        .unwrap_or_else(|| panic!("GPU 7 not listed:\n{stdout}"));
    assert!(
        lost.contains(": lost: GPU has fallen off the bus"),
        "{lost}"
    );
    let values = |field: &str| -> Vec<&str> {
        stdout
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix(field))
            .filter(|rest| rest.starts_with(' '))
            .map(str::trim)
            .collect()
    };
    assert_eq!(
        values("memory_total_bytes"),
        vec!["79.6 GiB"; 7],
        "{stdout}"
    );
    assert_eq!(values("sm_clock_max_hertz"), vec!["1980 MHz"; 7]);
    assert_eq!(values("power_limit_watts"), vec!["700.0 W"; 7]);
    assert_eq!(values("hbm_peak_bytes_per_second"), vec!["3352.3 GB/s"; 7]);
    for v in values("temperature_celsius") {
        assert!(v.ends_with(" °C"), "{v}");
    }
    for v in values("utilization_ratio") {
        let percent: f64 = v.strip_suffix('%').unwrap().parse().unwrap();
        assert!((0.0..=100.0).contains(&percent), "{v}");
    }

    for level in [" INFO ", " WARN ", " ERROR ", " DEBUG "] {
        assert!(
            !stdout.contains(level),
            "a log line in the report:\n{stdout}"
        );
    }
    assert!(
        stderr.contains("GPU lost") && stderr.contains("gpu=7"),
        "asked for, the log goes to stderr:\n{stderr}"
    );

    // Not asked for, the log keeps quiet: the report already says it.
    let (quiet_stdout, quiet_stderr) = doctor(None);
    assert_eq!(quiet_stderr, "");
    assert!(quiet_stdout.contains(lost), "{quiet_stdout}");
}

/// `vtax run --help` lists every simulated scenario with a line of help.
#[test]
fn run_help_lists_the_simulated_scenarios() {
    let help = common::vtax_stdout(["run", "--help"]);
    for scenario in [
        "idle",
        "training",
        "memory-bound",
        "thermal-throttle",
        "power-throttle",
        "pcie-degraded",
        "nvlink-hidden",
        "xid",
        "gpu-lost",
        "mig",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("- {scenario}:"))
                    && l.len() > scenario.len() + 20),
            "{scenario} not listed with its help:\n{help}"
        );
    }
}

/// The value of each series of the metric `name` in a text exposition, by
/// its labels as written (`{gpu="1",...}`).
fn series_of(body: &str, name: &str) -> BTreeMap<String, String> {
    body.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter(|rest| rest.starts_with('{'))
        .filter_map(|rest| rest.rsplit_once(' '))
        .map(|(labels, value)| (labels.to_string(), value.to_string()))
        .collect()
}

/// The XID alert rule (`dashboards/alerts/vtax-rules.yml`) run by promtool
/// over XID series recorded from the agent: none before it starts, a code's
/// series born at 1 with its first XID, gone while the agent is stopped, and
/// after its restart going on from the count the store kept. Each recorded
/// scrape is one minute of the rule's test. A rule of `increase()` alone
/// never fired on these.
#[test]
fn the_xid_alert_fires_on_the_series_the_agent_exports() {
    const METRIC: &str = "vtax_gpu_xid_errors_total";
    /// Minutes without the agent: before its first start, and between runs.
    const ABSENT_MINUTES: usize = 12;
    /// Scrapes recorded of each run.
    const SCRAPES_PER_RUN: usize = 15;
    let promtool = common::require_program("promtool");
    let dir = tempfile::tempdir().unwrap();
    // One scrape's series each minute; `None` while no agent runs.
    let mut minutes: Vec<Option<BTreeMap<String, String>>> = vec![None; ABSENT_MINUTES];
    let mut first_scrapes = Vec::new();
    for run in 0..2 {
        if run > 0 {
            minutes.extend(std::iter::repeat_n(None, ABSENT_MINUTES));
        }
        let data = dir.path().join("data");
        let agent = Agent::start(&[
            "--data-dir",
            data.to_str().unwrap(),
            "--simulate-gpus",
            "2",
            "--simulate-gpu-scenarios",
            "training,xid",
            "--no-collector.cgroups",
        ]);
        agent.wait_for_metric(
            "vtax_collector_success{collector=\"gpu\"} 1",
            Duration::from_secs(20),
        );
        first_scrapes.push(minutes.len());
        for _ in 0..SCRAPES_PER_RUN {
            minutes.push(Some(series_of(&agent.get("/metrics", &[]).text(), METRIC)));
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(agent.stop());
    }
    let labels: Vec<String> = minutes
        .iter()
        .flatten()
        .flat_map(|m| m.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let xid31 = labels
        .iter()
        .find(|l| l.contains("gpu=\"1\"") && l.contains("xid=\"31\""))
        .unwrap_or_else(|| panic!("no XID 31 series on GPU 1 in {labels:?}"));
    // Born at 1 with the XID; after the restart the count goes on from the
    // store's (1) with the simulator's XID 31 at its first tick again.
    for (&first, born) in first_scrapes.iter().zip(["1", "2"]) {
        assert_eq!(
            minutes[first]
                .as_ref()
                .and_then(|m| m.get(xid31))
                .map(String::as_str),
            Some(born),
            "the series as the rule must expect it"
        );
    }

    let mut test = format!(
        "rule_files:\n  - {}/../dashboards/alerts/vtax-rules.yml\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
        env!("CARGO_MANIFEST_DIR")
    );
    for l in &labels {
        // As Prometheus stores them: a series gone from a scrape, or whose
        // scrape failed, gets a stale marker, then nothing.
        let mut values = Vec::new();
        let mut present = false;
        for minute in &minutes {
            match minute.as_ref().and_then(|m| m.get(l)) {
                Some(value) => values.push(value.as_str()),
                None if present => values.push("stale"),
                None => values.push("_"),
            }
            present = minute.as_ref().is_some_and(|m| m.contains_key(l));
        }
        let l = l.replacen('{', "{instance=\"n1\",", 1);
        test += &format!(
            "      - series: '{METRIC}{l}'\n        values: '{}'\n",
            values.join(" ")
        );
    }
    let uuid = xid31
        .split("gpu_uuid=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap();
    let firing = format!(
        "        exp_alerts:\n          - exp_labels: {{severity: warning, instance: n1, gpu: \"1\", gpu_uuid: {uuid}, xid: \"31\"}}\n            exp_annotations:\n              summary: \"XID 31 on GPU 1 of n1\"\n              description: \"The driver reported XID 31 on GPU 1 ({uuid}) in the last 10 minutes.\"\n              runbook_url: \"docs/runbook.md#vtaxgpuxiderrors\"\n"
    );
    test += "    alert_rule_test:\n";
    let mut eval = |minute: usize, fires: bool| {
        test += &format!("      - eval_time: {minute}m\n        alertname: VtaxGpuXidErrors\n");
        test += if fires {
            &firing
        } else {
            "        exp_alerts: []\n"
        };
    };
    eval(first_scrapes[0] - 1, false);
    for &first in &first_scrapes {
        eval(first, true);
        eval(first + 9, true);
    }
    // Ten minutes after the first run's XID, with the series unchanged.
    eval(first_scrapes[0] + 11, false);
    let path = dir.path().join("xid.test.yml");
    std::fs::write(&path, &test).unwrap();
    let out = std::process::Command::new(promtool)
        .args(["test", "rules", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The transfer probe in the running agent, on simulated idle GPUs: turned
/// on with its flag, it measures each GPU and pair once idle for idle_secs,
/// serves the figures with their units and counts the probes.
#[test]
fn the_agent_probes_idle_simulated_gpus_and_serves_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vtax.toml");
    std::fs::write(
        &config,
        "[collectors.gpu_probe]\ninterval_secs = 0.2\nidle_secs = 1\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--simulate-gpus",
        "2",
        "--collector.gpu_probe",
        "--no-collector.cgroups",
    ]);
    let body = agent.wait_for_metric(
        "vtax_gpu_probe_outcome_probes_total{gpu=\"1\",outcome=\"measured\"} 1",
        Duration::from_secs(30),
    );
    for needle in [
        "vtax_gpu_probe_host_to_device_bytes_per_second{gpu=\"0\"} 53600000000",
        "vtax_gpu_probe_host_to_device_ratio{gpu=\"0\"} 0.85",
        "vtax_gpu_probe_peer_to_peer_bytes_per_second{gpu=\"1\",peer=\"0\"} 372000000000",
        "vtax_gpu_probe_outcome_probes_total{gpu=\"0\",outcome=\"no_driver\"} 0",
    ] {
        assert!(body.contains(needle), "{needle} missing:\n{body}");
    }
    assert!(agent.stop());
    let rows = common::query_rows(&data, "gpu_probe");
    assert_eq!(
        rows.len(),
        2,
        "one row per GPU, once within the period: {rows:?}"
    );
}

/// A reload that turns the GPU collector off and on again takes its XID
/// counts up from the store, as a restart does: the XID counted before is
/// not counted from zero again (the simulator's new XID 31 at its first
/// tick makes the count 2, not 1).
#[test]
fn a_gpu_collector_turned_on_by_a_reload_keeps_its_xid_counts() {
    const XID_31: &str = "vtax_gpu_xid_errors_total{gpu=\"1\"";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vtax.toml");
    let settings = |enabled: bool| {
        format!(
            "[collectors.gpu]\nenabled = {enabled}\nsimulate_gpus = 2\n\
             simulate_scenarios = [\"training\", \"xid\"]\n"
        )
    };
    std::fs::write(&config, settings(true)).unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--no-collector.cgroups",
    ]);
    agent.wait_for_metric(XID_31, Duration::from_secs(20));
    let xid_31 = |body: &str| {
        series_of(body, "vtax_gpu_xid_errors_total")
            .into_iter()
            .find(|(labels, _)| labels.contains("gpu=\"1\"") && labels.contains("xid=\"31\""))
            .map(|(_, value)| value)
    };
    assert_eq!(
        xid_31(&agent.get("/metrics", &[]).text()).as_deref(),
        Some("1")
    );
    let reloads = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while agent.log().matches("Configuration reloaded.").count() < n {
            assert!(std::time::Instant::now() < deadline, "no reload {n}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    std::fs::write(&config, settings(false)).unwrap();
    agent.signal(libc::SIGHUP);
    reloads(1);
    // /metrics is rendered on its own thread, a moment after the reload.
    agent.poll_metrics(
        Duration::from_secs(10),
        "the series to leave with the collector",
        |body| xid_31(body).is_none().then_some(()),
    );
    std::fs::write(&config, settings(true)).unwrap();
    agent.signal(libc::SIGHUP);
    reloads(2);
    agent.wait_for_metric(XID_31, Duration::from_secs(20));
    let body = agent.get("/metrics", &[]).text();
    assert!(agent.stop());
    assert_eq!(
        xid_31(&body).as_deref(),
        Some("2"),
        "the count before the reload goes on"
    );
}
