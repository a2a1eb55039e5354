//! Golden `/metrics`: every collector read once over each fixture tree under
//! `tests/fixtures/`, rendered as the agent serves it, compared with
//! `tests/golden/<fixture>.prom` (rewritten with `VTAX_UPDATE_GOLDEN=1`), and
//! linted by `promtool check metrics`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vtax_exporters::Exposition;

use crate::collectors::filesystem::{Filesystem, FilesystemConfig, FixedStatFs};
use crate::collectors::platform::{CpuidRegs, CpuidSource, Platform};
use crate::collectors::{Availability, Collector, CollectorsConfig, Roots, NAMES};

/// CPUID cannot come from a fixture: the golden files are made as on a CPU
/// without it, so they hold only what the fixture's files say.
struct NoCpuid;

impl CpuidSource for NoCpuid {
    fn cpuid(&self, _leaf: u32) -> Option<CpuidRegs> {
        None
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Reads every collector once over a fixture and renders the text format.
fn render_fixture(fixture: &str) -> String {
    let root = repo().join("tests/fixtures").join(fixture);
    let roots = Roots {
        procfs: root.join("proc"),
        sysfs: root.join("sys"),
        ..Roots::default()
    };
    let config = CollectorsConfig::default();
    let exposition = Exposition::new(crate::catalog().tables());
    for &name in NAMES {
        // The GPU collector would read the machine's real NVML, not the
        // fixture: it has a golden file of its own, on simulated GPUs. The
        // transfer probe too, and its figures include its own timings.
        if name == "gpu" || name == "gpu_probe" {
            continue;
        }

        let statvfs = root.join("statvfs");
        let mut collector: Box<dyn Collector> = if name == "platform" {
            Box::new(Platform::with_cpuid(
                &config.platform,
                &roots,
                Box::new(NoCpuid),
            ))
        } else if name == "filesystem" && statvfs.exists() {
            // statvfs answers for the fixture's mounts come from its table
            // (a hung one included), not from this machine's filesystems.
            // The timeout is what a stat answered from the table meets on a
            // loaded machine: at 50 ms, beside a fleet evaluation, an
            // answering mount was once reported hung.
            let fast = FilesystemConfig {
                stat_timeout_ms: 1000,
                ..config.filesystem.clone()
            };
            let fixed = FixedStatFs::from_file(&statvfs).expect("a statvfs table");
            let collector = Filesystem::with_statfs(&fast, &roots, Arc::new(fixed));
            Box::new(collector)
        } else {
            config.build(name, &roots).expect("every name builds")
        };
        if let Availability::Absent(_) = collector.probe() {
            continue;
        }
        let batches = collector
            .collect(1_763_766_000_000_000)
            .unwrap_or_else(|e| panic!("{fixture}: {name}: {e:#}"));
        exposition.update(name, batches.into_iter().map(Arc::new).collect());
    }
    let text = exposition.body(vtax_exporters::Format::Text, false);
    String::from_utf8(text.to_vec()).expect("UTF-8")
}

/// Every scenario of the simulated backend, GPU i playing the i-th: the
/// simulated-GPU golden file's, and the report tests'.
pub(crate) const GOLDEN_SCENARIOS: &[&str] = &[
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

/// Ten simulated GPUs, one per scenario, read twice 30 s apart (the default
/// `slow_reads_interval_secs`, so the counters read on that cadence move too)
/// over the baremetal-node fixture, whose procfs places two of their
/// processes in a Slurm job and a Docker container.
fn render_simulated_gpus() -> String {
    let root = repo().join("tests/fixtures/baremetal-node");
    let roots = Roots {
        procfs: root.join("proc"),
        sysfs: root.join("sys"),
        ..Roots::default()
    };
    let mut config = CollectorsConfig::default();
    config.gpu.simulate_gpus = GOLDEN_SCENARIOS.len() as u32;
    config.gpu.simulate_scenarios = GOLDEN_SCENARIOS.iter().map(|s| s.to_string()).collect();
    let exposition = Exposition::new(crate::catalog().tables());
    let mut collector = config.build("gpu", &roots).expect("gpu builds");
    assert!(matches!(collector.probe(), Availability::Available(_)));
    collector
        .collect(1_763_765_990_000_000)
        .expect("first read");
    let batches = collector
        .collect(1_763_766_020_000_000)
        .expect("second read");
    exposition.update("gpu", batches.into_iter().map(Arc::new).collect());
    let text = exposition.body(vtax_exporters::Format::Text, false);
    String::from_utf8(text.to_vec()).expect("UTF-8")
}

pub(crate) use vtax_tests::promtool_complaints;

fn check_golden(fixture: &str) {
    let rendered = if fixture == "simulated-gpus" {
        render_simulated_gpus()
    } else {
        render_fixture(fixture)
    };
    let path = repo().join("tests/golden").join(format!("{fixture}.prom"));
    if std::env::var_os("VTAX_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &rendered).unwrap();
    }
    assert_eq!(
        promtool_complaints(&rendered),
        "",
        "promtool lints {fixture}"
    );
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let first = on_disk
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(on_disk.lines().count().min(rendered.lines().count()));
        panic!(
            "{} differs from what the collectors render (first at line {}: {:?} vs {:?}); \
             if intended, run `VTAX_UPDATE_GOLDEN=1 cargo test -p vtax golden`",
            path.display(),
            first + 1,
            on_disk.lines().nth(first),
            rendered.lines().nth(first)
        );
    }
}

#[test]
fn golden_vm_node() {
    check_golden("vm-node");
}

#[test]
fn golden_baremetal_node() {
    check_golden("baremetal-node");
}

#[test]
fn golden_k8s_node() {
    check_golden("k8s-node");
}

#[test]
fn golden_nvme_vm_node() {
    check_golden("nvme-vm-node");
}

#[test]
fn golden_simulated_gpus() {
    check_golden("simulated-gpus");
}
