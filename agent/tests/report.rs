//! `vtax report` read as a person reads it: an agent runs with one simulated
//! GPU per scenario (a throttle, a link trained down, NVLink hidden, XIDs, a
//! GPU lost, MIG, ...), and the report it writes is opened in headless
//! Chromium, which says what it laid out: every GPU listed, the lost one as
//! lost, the headline's figures, nothing sticking out of its card, and a
//! legend under the events' timeline.
//!
//! Needs Debian's `chromium` (`scripts/test.sh` installs it). The report and
//! its screenshot stay under `target/tmp/report/`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{body_attribute, chromium, fixtures, VTAX};

/// Every scenario of the simulated backend, GPU i playing the i-th.
const SCENARIOS: &[&str] = &[
    "training",
    "memory-bound",
    "thermal-throttle",
    "power-throttle",
    "pcie-degraded",
    "nvlink-hidden",
    "xid",
    "gpu-lost",
    "mig",
    "idle",
];

/// The GPU that plays `gpu-lost`.
const LOST_GPU: usize = 7;

/// Short windows, so a short run opens the faults' events (three 2 s
/// windows in a row) and has several jitter windows.
const CONFIG: &str = "
[collectors.jitter]
window_secs = 2
rotate_ms = 500

[detect]
window_secs = 2
";

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The element that starts at the first `needle`, up to its closing `tag`.
fn element<'a>(dom: &'a str, needle: &str, tag: &str) -> &'a str {
    let start = dom
        .find(needle)
        .unwrap_or_else(|| panic!("{needle} in the page"));
    let rest = &dom[start..];
    &rest[..rest.find(&format!("</{tag}>")).unwrap()]
}

#[test]
fn a_node_with_every_gpu_scenario_reads_right_in_a_browser() {
    let dir = artifacts();
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("vtax.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tree = fixtures().join("baremetal-node");
    let store = data.path().join("store");
    let run = Command::new(VTAX)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&store)
        .args(["--store.node", "gpu-node-07"])
        .args(["--web.listen-address", "127.0.0.1:0"])
        .arg("--path.procfs")
        .arg(tree.join("proc"))
        .arg("--path.sysfs")
        .arg(tree.join("sys"))
        .args(["--simulate-gpus", &SCENARIOS.len().to_string()])
        .args(["--simulate-gpu-scenarios", &SCENARIOS.join(",")])
        .args(["--duration-secs", "14"])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "vtax run: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let html = dir.join("report.html");
    let report = Command::new(VTAX)
        .arg("report")
        .arg("--data-dir")
        .arg(&store)
        .arg("--output")
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "vtax report: {}",
        String::from_utf8_lossy(&report.stderr)
    );

    let out = chromium(&["--dump-dom"], &html);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("<body"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every plot drew, and nothing sticks out of its card at 1400 px.
    let plots = body_attribute(&dom, "data-plots").unwrap();
    assert_eq!(Some(plots), body_attribute(&dom, "data-plots-rendered"));
    assert_eq!(
        body_attribute(&dom, "data-overflowing"),
        Some("0"),
        "overflowing: {:?}",
        body_attribute(&dom, "data-overflowing-elements")
    );

    // The first thing on the page: the verdict, the tax as figures, the causes.
    let headline = element(&dom, r#"<section id="headline""#, "section");
    assert!(
        dom.find(r#"id="headline""#) < dom.find(r#"id="gpu-health""#),
        "the headline comes first"
    );
    assert!(headline.contains("Verdict: "), "{headline}");
    for field in [
        "steal_ratio",
        "interrupted_ratio",
        "unexplained_ratio",
        "jitter_p99_seconds",
        "hbm_peak_ratio",
        "nvlink_peak_ratio",
        "nvlink_links_missing_ratio",
        "pcie_bandwidth_loss_ratio",
        "gpu_clock_throttle_ratio",
    ] {
        let tile = element(headline, &format!(r#"data-tax="{field}""#), "div");
        let figure = element(tile, r#"class="figure""#, "span");
        // A share or a latency (µs, ms), not "–".
        assert!(
            figure.ends_with('%') || figure.ends_with('s'),
            "{field}: {tile}"
        );
    }
    // One GPU's NVLink is hidden, another's PCIe link trained down: marked.
    for field in ["nvlink_links_missing_ratio", "pcie_bandwidth_loss_ratio"] {
        let tile = element(headline, &format!(r#"data-tax="{field}""#), "div");
        let before = &headline[..headline.find(tile).unwrap()];
        assert!(
            before.ends_with(r#"<div class="tile bad" "#),
            "{field}: {tile}"
        );
    }
    let lost = element(headline, r#"data-tax="gpus_lost""#, "div");
    assert!(lost.contains("1 of 10") && lost.contains("GPU 7"), "{lost}");
    let causes = element(headline, r#"<ol class="causes""#, "ol");
    assert!(
        causes.find("GPU 7: lost") < causes.find("NVLink links missing"),
        "the lost GPU leads the causes: {causes}"
    );

    // Every GPU is listed, the lost one as lost, not left out.
    let health = element(&dom, r#"<section id="gpu-health""#, "section");
    for gpu in 0..SCENARIOS.len() {
        let state = if gpu == LOST_GPU { "lost" } else { "up" };
        assert!(
            health.contains(&format!(r#"data-gpu="{gpu}" data-state="{state}""#)),
            "GPU {gpu} {state} in {health}"
        );
    }
    // The XIDs over time, and only GPUs that had errors.
    let errors = element(&dom, r#"id="gpu-xids""#, "div");
    assert!(errors.contains("GPU 6 XID ("), "{errors}");
    assert!(!errors.contains("GPU 0 "), "{errors}");
    // The GPU whose NVLink is hidden is on the NVLink chart, at zero.
    let nvlink = element(&dom, r#"id="gpu-nvlink""#, "div");
    assert!(nvlink.contains("GPU 5 (0 of 18 links up)"), "{nvlink}");

    // Faults are apart from neighbours; the timeline says what its colours mean.
    let events = element(&dom, r#"<section id="events""#, "section");
    let timeline = element(events, r#"id="events-timeline""#, "div");
    let legend = &timeline[timeline.find(r#"<div class="legend">"#).expect("a legend")..];
    assert!(legend.contains("fault, open"), "{legend}");
    let faults = element(events, "<h3>Faults of the node</h3>", "table");
    for signal in [
        "clock_throttle_ratio",
        "pcie_bandwidth_loss_ratio",
        "nvlink_links_missing_ratio",
    ] {
        assert!(faults.contains(signal), "{signal} in {faults}");
    }
    let neighbours = &events[events.find("<h3>Noisy-neighbour events</h3>").unwrap()..];
    assert!(
        !neighbours.contains("nvlink_links_missing_ratio"),
        "a fault is not a neighbour: {neighbours}"
    );

    let png = dir.join("report.png");
    let _ = std::fs::remove_file(&png);
    chromium(&[&format!("--screenshot={}", png.display())], &html);
    let image = std::fs::read(&png).expect("a screenshot");
    assert!(image.starts_with(b"\x89PNG"), "{} bytes", image.len());
}
