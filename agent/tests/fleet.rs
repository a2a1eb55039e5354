//! The fleet evaluation (`bench/fleet/evaluate.py`) run small: six agents of
//! this build, with simulated GPUs and InfiniBand ports on fixture counters,
//! remote-write to a real Prometheus that evaluates the vtax-peers rules; one
//! node's GPU is throttled, then another node's port congested, and each must
//! be named by `VtaxNodeSlowerThanPeers` for the right signal while it lasts.
//! The full evaluation (20 trials, every cause, quiet hours) is a benchmark:
//! docs/benchmarks.md.

mod common;

use std::process::Command;

use common::{require_program, stdout_of};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

#[test]
fn the_evaluations_scoring_counts_what_it_should() {
    let python = require_program("python3");
    stdout_of(
        Command::new(python)
            .args(["-m", "unittest", "bench/fleet/test_evaluate.py"])
            .current_dir(ROOT),
    );
}

#[test]
fn a_local_fleet_names_each_degraded_node_and_why() {
    require_program("prometheus");
    let python = require_program("python3");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("evaluation.json");
    let stdout = stdout_of(
        Command::new(python)
            .args([
                "bench/fleet/evaluate.py",
                "--vtax",
                env!("CARGO_BIN_EXE_vtax"),
                "--nodes",
                "6",
                "--trials",
                "2",
                "--causes",
                "thermal,infiniband",
                "--quiet-secs",
                "0",
                "--warmup-secs",
                "75",
                "--hold-secs",
                "45",
                "--gap-secs",
                "5",
                "10",
                "--linger-secs",
                "60",
                "--seed",
                "7",
                "--out",
            ])
            .arg(&out)
            .current_dir(ROOT),
    );
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let trials = result["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{stdout}");
    for trial in trials {
        assert_eq!(trial["detected"], true, "missed: {trial}\n{stdout}");
        assert_eq!(
            trial["named_rightly"], true,
            "the alert named another signal: {trial}\n{stdout}"
        );
        let latency = trial["latency_secs"].as_f64().unwrap();
        assert!(latency < 45.0, "found only after the restore: {trial}");
    }
}
