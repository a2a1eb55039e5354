//! The alert rules in `dashboards/alerts/`: valid for Prometheus, their unit
//! tests (one file per concern under `dashboards/alerts/tests/`) pass (each alert firing for what should trip it and not for a healthy
//! neighbour), every alert has a runbook section, and every vtax metric they
//! use exists in the catalogue, so a renamed field cannot silently blind a rule.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("promtool is installed (scripts/test.sh installs Debian's prometheus)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The unit-test files, each run by promtool and searched for every alert's test.
const TEST_FILES: [&str; 3] = [
    "dashboards/alerts/tests/vtax-rules.test.yml",
    "dashboards/alerts/tests/vtax-peers.test.yml",
    RESTART_TESTS,
];

/// The tests of each alert's `for` clock through an agent restart.
const RESTART_TESTS: &str = "dashboards/alerts/tests/vtax-restart.test.yml";

/// Alerts with a `for` that need no restart test, and why.
const NOT_RESTART_TESTED: [(&str, &str); 7] = [
    (
        "VtaxConfigReloadRefused",
        "a restart reads the file anew: the agent runs it, or does not start",
    ),
    (
        "VtaxAgentDown",
        "`up` is Prometheus's own series, there through a restart",
    ),
    (
        "VtaxStoreNearByteBudget",
        "reads the highest point of the last 10 minutes",
    ),
    (
        "VtaxStoreWriteFailing",
        "increase() over a range that spans the restart",
    ),
    (
        "VtaxGpuValuesLeftOut",
        "increase() over a range; its restart is in vtax-rules.test.yml",
    ),
    (
        "VtaxInfinibandCongestion",
        "rate() over a range that spans the restart",
    ),
    (
        "VtaxNodeSlowerThanPeers",
        "a `for` of 15 s, which a restart delays by as much",
    ),
];

fn rules() -> String {
    std::fs::read_to_string(repo().join("dashboards/alerts/vtax-rules.yml")).unwrap()
}

#[test]
fn promtool_checks_the_rules() {
    let (ok, out) = promtool(&["check", "rules", "dashboards/alerts/vtax-rules.yml"]);
    assert!(ok, "{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    for file in TEST_FILES {
        let (ok, out) = promtool(&["test", "rules", file]);
        assert!(ok, "{file}: {out}");
    }
}

fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn every_alert_has_a_runbook_section_and_a_unit_test() {
    let rules = rules();
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).unwrap();
    let tests: String = TEST_FILES
        .iter()
        .map(|f| std::fs::read_to_string(repo().join(f)).unwrap())
        .collect();
    let names = alert_names(&rules);
    assert!(names.len() >= 13, "{names:?}");
    for name in names {
        assert!(
            runbook.contains(&format!("\n## {name}\n")),
            "docs/runbook.md has no `## {name}` section"
        );
        assert!(
            rules.contains(&format!("docs/runbook.md#{}", name.to_lowercase())),
            "{name} does not link its runbook section"
        );
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "{name} has no promtool unit test"
        );
    }
}

/// Each alert's name and its `for`, if it has one.
fn alert_fors(rules: &str) -> Vec<(String, Option<String>)> {
    let mut alerts: Vec<(String, Option<String>)> = Vec::new();
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ") {
            alerts.push((name.trim().to_string(), None));
        } else if line.starts_with("- record: ") {
            alerts.push((String::new(), None));
        } else if let (Some(duration), Some(last)) = (line.strip_prefix("for: "), alerts.last_mut())
        {
            last.1 = Some(duration.trim().to_string());
        }
    }
    alerts.retain(|(name, _)| !name.is_empty());
    alerts
}

/// A restart stale-marks every series of the node for the seconds it takes,
/// and the windowed ones for their first window: an alert reading a gauge as
/// an instant vector restarted its `for` there, so a node whose agent
/// restarted more often than that never paged.
#[test]
fn every_alert_with_a_for_keeps_it_through_a_restart() {
    let rules = rules();
    let tests = std::fs::read_to_string(repo().join(RESTART_TESTS)).unwrap();
    let fors = alert_fors(&rules);
    assert!(
        fors.iter().filter(|(_, f)| f.is_some()).count() >= 20,
        "{fors:?}"
    );
    for (name, duration) in &fors {
        let exempt = NOT_RESTART_TESTED.iter().any(|(n, _)| n == name);
        match duration {
            Some(_) if !exempt => assert!(
                tests.contains(&format!("alertname: {name}\n")),
                "{name} has a `for` and no test in {RESTART_TESTS}"
            ),
            None => assert!(!exempt, "{name} has no `for` to exempt"),
            _ => {}
        }
    }
    for (name, _) in NOT_RESTART_TESTED {
        assert!(fors.iter().any(|(n, _)| n == name), "{name} is no alert");
    }
}

#[test]
fn every_metric_the_rules_use_is_in_the_catalogue() {
    let catalogue = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let rules = rules();
    let mut checked = 0;
    for (at, _) in rules.match_indices("vtax_") {
        let name: String = rules[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            catalogue.contains(&format!("`{name}`")),
            "{name} is used by a rule but is not in docs/metrics.md"
        );
        checked += 1;
    }
    assert!(checked > 20, "only {checked} metric uses found");
}
