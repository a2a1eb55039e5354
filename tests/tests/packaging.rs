//! The systemd unit in `packaging/systemd/`: hardened to an exposure score of
//! at most 3.0 by `systemd-analyze security --offline=true` (Debian's
//! node_exporter unit scores 9.2 on the same tool), and wired for what the
//! agent does: readiness and the watchdog over sd_notify, a config check
//! before start, state under /var/lib/vtax.

use std::path::{Path, PathBuf};
use std::process::Command;

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/vtax.service")
}

fn exposure(unit: &Path) -> f64 {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit)
        .output()
        .expect("systemd-analyze is installed (scripts/test.sh installs systemd)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| {
            panic!(
                "no score in:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    line.split(':')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|score| score.parse().ok())
        .unwrap_or_else(|| panic!("unparsable score line {line:?}"))
}

#[test]
fn the_unit_scores_at_most_3_0() {
    let score = exposure(&unit_path());
    assert!(score <= 3.0, "exposure {score} > 3.0");
}

#[test]
fn the_unit_runs_the_agent_as_systemd_expects() {
    let unit = std::fs::read_to_string(unit_path()).unwrap();
    for line in [
        "Type=notify",
        "WatchdogSec=30",
        "ExecStartPre=/usr/bin/vtax check-config",
        "ExecStart=/usr/bin/vtax run",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "User=vtax",
        "StateDirectory=vtax",
        "Environment=VTAX_DATA_DIR=/var/lib/vtax",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks `{line}`");
    }
    // Reading other processes' cgroups (GPU process owners) needs /proc as it is.
    assert!(!unit.contains("ProtectProc=invisible"));
}
