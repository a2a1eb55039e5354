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

/// The `vtax` user: one sysusers.d line declares it for both packages, and
/// the fallbacks for systems without systemd-sysusers (the .deb's adduser, the
/// RPM's useradd) ask for the same GECOS, home and shell. scripts/deb-check.sh
/// and scripts/rpm-check.sh run the real thing; this runs everywhere.
#[test]
fn the_user_is_declared_once_and_the_fallbacks_agree() {
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging");
    let read = |p: &str| std::fs::read_to_string(packaging.join(p)).unwrap();
    let (gecos, home) = ("vtax GPU node telemetry agent", "/var/lib/vtax");
    let conf = read("sysusers.d/vtax.conf");
    let declared: Vec<_> = conf.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(declared, [format!(r#"u vtax - "{gecos}" {home}"#)]);

    // An empty root: systemd-sysusers parses the line and says what it would do.
    let root = tempfile::tempdir().unwrap();
    let out = Command::new("systemd-sysusers")
        .args(["--dry-run", "--root"])
        .arg(root.path())
        .arg("--inline")
        .args(&declared)
        .output()
        .expect("systemd-sysusers is installed (scripts/test.sh installs systemd)");
    let said = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "systemd-sysusers refused it:\n{said}");
    assert!(
        said.contains(&format!("Creating user 'vtax' ({gecos})")),
        "systemd-sysusers would not create the user:\n{said}"
    );

    let rpm_post = read("rpm/post.sh");
    for arg in [
        format!("--home-dir {home}"),
        format!(r#"--comment "{gecos}""#),
        "--shell /usr/sbin/nologin".into(),
        "--user-group".into(),
    ] {
        assert!(rpm_post.contains(&arg), "the RPM's useradd lacks {arg}");
    }
    let deb_postinst = read("debian/postinst");
    for arg in [
        format!("--home {home}"),
        format!(r#"--gecos "{gecos}""#),
        "--group".into(),
    ] {
        assert!(
            deb_postinst.contains(&arg),
            "the .deb's adduser lacks {arg}"
        );
    }
}
