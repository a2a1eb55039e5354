//! Fleet analysis end to end: three real agents write a fleet
//! (`tests/analysis/make_fleet.py`), every recipe of docs/analysis.md runs on it
//! with DuckDB, Polars, pandas and Spark (`tests/analysis/run_recipes.py`), and
//! `vtax report` renders it in headless Chromium, every plot drawn.
//!
//! Needs python3 with duckdb, polars, pyarrow, pandas and pyspark, a Java
//! runtime, and Debian's `chromium`: `scripts/test.sh` installs them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{body_attribute, chromium, stdout_of, VTAX};

/// Seconds each generated node runs: enough for several jitter windows
/// (make_fleet sets them to 2 s) and a minute boundary or not, either works.
const FLEET_SECONDS: &str = "20";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where the artifacts stay after the run: the fleet, the reports and their
/// screenshots (target/tmp/analysis/).
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("analysis");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The generated fleet, made once per test binary.
fn fleet() -> &'static Path {
    static FLEET: OnceLock<PathBuf> = OnceLock::new();
    FLEET.get_or_init(|| {
        let out = artifacts().join("fleet-data");
        stdout_of(
            Command::new("python3")
                .arg(repo().join("tests/analysis/make_fleet.py"))
                .arg(VTAX)
                .arg(&out)
                .arg(FLEET_SECONDS),
        );
        out
    })
}

/// What the recipes printed, once they all succeeded.
fn run_recipes(arg: &Path) -> String {
    stdout_of(
        Command::new("python3")
            .arg(repo().join("tests/analysis/run_recipes.py"))
            .arg(arg),
    )
}

#[test]
fn the_analysis_page_shows_every_recipe_file_verbatim() {
    let stdout = run_recipes(Path::new("--docs-only"));
    assert!(stdout.contains("recipes shown verbatim"), "{stdout}");
}

#[test]
fn every_recipe_answers_on_a_generated_fleet() {
    let stdout = run_recipes(fleet());
    // `vtax compact` named the merged files after the store's node, not the host.
    let leftover = fleet().join("leftover/tables/gpu");
    for day in std::fs::read_dir(&leftover).unwrap() {
        for file in std::fs::read_dir(day.unwrap().path()).unwrap() {
            let name = file.unwrap().file_name().into_string().unwrap();
            assert!(name.starts_with("node_a-"), "{name}");
        }
    }
    for line in [
        "duckdb_node: 4 GPUs",
        "duckdb_fleet: 3 nodes, stragglers ['node_c']",
        "polars_fleet: 12 GPUs",
        "pandas_node: 4 GPUs",
        "spark_fleet: 4 GPUs; PartitionFilters:",
        "all node=node_c",
        "stragglers: ",
        "node_c first by sm_clock_ratio",
        "in DuckDB and Spark",
        "duckdb_replaced: ",
        "interrupted_merges: ",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

#[test]
fn the_report_renders_every_plot_in_headless_chromium() {
    let fleet = fleet();
    let dir = artifacts();
    for (name, data, plots) in [
        // utilisation, HBM, NVLink; jitter p99, unexplained, a distribution per
        // node; steal, pressure
        ("fleet", fleet.join("fleet"), 3 + 2 + 3 + 2 + 1),
        // SM clock, temperature; utilisation, HBM, NVLink; jitter quantiles,
        // lost time, distribution; steal, pressure; the events' timeline
        ("node", fleet.join("nodes/node_c"), 2 + 3 + 2 + 1 + 2 + 1),
    ] {
        let html = dir.join(format!("report-{name}.html"));
        let failure = vtax(&[
            "report".as_ref(),
            "--data-dir".as_ref(),
            data.as_os_str(),
            "--output".as_ref(),
            html.as_os_str(),
        ]);
        assert!(failure.is_empty(), "vtax report: {failure}");
        let text = std::fs::read_to_string(&html).unwrap();
        // node_c's throttled GPUs open events (the detector runs in every
        // agent of the fleet): the report lists them as faults of the node,
        // not as neighbours, and puts them on a timeline.
        assert!(!text.contains("No faults recorded"));
        assert!(
            text.contains(r#"id="events-timeline""#),
            "the events' timeline"
        );
        assert!(
            text.contains("clock_throttle_ratio"),
            "the throttled GPUs' events"
        );
        // The detector's verdict: whole (simulated) GPUs seen inside a KVM guest.
        assert!(
            text.contains("VM with GPU passthrough (kvm)"),
            "the verdict"
        );
        if name == "node" {
            // The node's name comes from its files, named by --store.node.
            assert!(text.contains("<title>vtax report: node_c</title>"));
        }

        let out = chromium(&["--dump-dom"], &html);
        let dom = String::from_utf8_lossy(&out.stdout);
        let drawn = body_attribute(&dom, "data-plots-rendered");
        let total = body_attribute(&dom, "data-plots");
        assert_eq!(
            (total, drawn),
            (
                Some(plots.to_string().as_str()),
                Some(plots.to_string().as_str())
            ),
            "{name}: every plot drawn by the browser"
        );
        assert_eq!(dom.matches(r#"data-rendered="yes""#).count(), plots);
        assert!(!dom.contains(r#"data-rendered="no""#), "{name}");
        // Every line chart has a line per series, with points.
        assert!(
            dom.matches(r#"class="series""#).count() >= plots - 3,
            "{name}"
        );

        let png = dir.join(format!("report-{name}.png"));
        let _ = std::fs::remove_file(&png);
        chromium(
            &[
                &format!("--screenshot={}", png.display()),
                "--window-size=1280,4200",
            ],
            &html,
        );
        let image = std::fs::read(&png).expect("a screenshot");
        assert!(
            image.starts_with(b"\x89PNG") && image.len() > 50_000,
            "{name}: {} bytes",
            image.len()
        );
    }
}

/// Runs the agent's binary: "" when it succeeds, else what it said on stderr.
fn vtax(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(VTAX).args(args).output().unwrap();
    if out.status.success() {
        String::new()
    } else {
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

#[test]
fn a_node_name_that_cannot_name_files_is_refused() {
    let check = |name: &str| {
        vtax(&[
            "check-config".as_ref(),
            "--store.node".as_ref(),
            name.as_ref(),
        ])
    };
    for (name, says) in [
        (
            "rack 3/gpu-7",
            "' ' is not allowed: use letters, digits, '-', '.' and '_'",
        ),
        ("rack3/gpu-7", "'/' is not allowed"),
        ("..", "it must start and end with a letter or digit"),
        ("", "a node name cannot be empty"),
    ] {
        let said = check(name);
        assert!(
            said.contains(&format!("store.node = {name:?}: {says}")),
            "{name:?}: {said}"
        );
    }
    // Host names and Kubernetes node names as they are, and names of the
    // earlier rule that already name files on disk.
    for name in ["gpu-node-17", "ip-10-0-1-17.ec2.internal", "rack3.gpu_7"] {
        assert_eq!(check(name), "", "{name}");
    }
    // The DaemonSet passes the Kubernetes node name in VTAX_NODE.
    let out = Command::new(VTAX)
        .args(["check-config"])
        .env("VTAX_NODE", "rack 3")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store.node = \"rack 3\""),
        "{out:?}"
    );
}
