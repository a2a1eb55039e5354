//! The Grafana dashboards against the real agent: `dashboards/check_dashboards.py`
//! validates their JSON (templated datasource, node/gpu variables, a description and a
//! unit on every panel), then runs every panel's query against a real Prometheus
//! scraping this build of the agent on a copy of the bare-metal fixture with
//! simulated GPUs, where it plays a noisy neighbour on the cgroup files so that
//! the detector's suspect panels have a real event to show.

mod common;

use std::process::Command;

use common::{require_program, stdout_of};

#[test]
fn every_dashboard_panel_queries_data_from_a_real_prometheus() {
    // The checker starts `prometheus` itself; fail here with the install hint if it is missing.
    require_program("prometheus");
    let python = require_program("python3");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let stdout = stdout_of(
        Command::new(python)
            .args([
                "dashboards/check_dashboards.py",
                "--vtax",
                env!("CARGO_BIN_EXE_vtax"),
            ])
            .current_dir(root),
    );
    assert!(
        stdout.contains("check_dashboards: OK"),
        "no OK from the checker:\n{stdout}"
    );
}
