//! The systemd unit in `packaging/systemd/`: hardened to an exposure score of
//! at most 3.0 by `systemd-analyze security --offline=true` (Debian's
//! node_exporter unit scores 9.2 on the same tool), and wired for what the
//! agent does: readiness and the watchdog over sd_notify, a config check
//! before start, state under /var/lib/vtax.
//!
//! And what docs/install.md tells an operator to run, checked where it can be
//! without a release build: the paths it names, its package build commands
//! against the CI checks that run them, what both packages install, the
//! image's build context and tag, and scripts/split-debuginfo.sh itself.

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
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks `{line}`");
    }
    // The store is the config file's store.data_dir, else /var/lib/vtax (the
    // StateDirectory, which exists): an environment variable here overrode the
    // file unsaid, and a command run from a shell read another store.
    assert!(
        !unit.lines().any(|l| l.starts_with("Environment=VTAX_")),
        "the unit sets a VTAX_ variable"
    );
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

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_repo(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The strings between double quotes on one line (the manifests below have no
/// escapes in them).
fn quoted(line: &str) -> Vec<&str> {
    line.split('"').skip(1).step_by(2).collect()
}

/// What one package's metadata in `agent/Cargo.toml` installs: each installed
/// path (relative to `/`) with its source (relative to the repository root,
/// or the `target/release/` path the packaging commands expect).
fn package_assets(table: &str) -> Vec<(String, String)> {
    let manifest = read_repo("agent/Cargo.toml");
    let header = format!("[package.metadata.{table}]");
    let start = manifest
        .find(&header)
        .unwrap_or_else(|| panic!("agent/Cargo.toml has no {header}"));
    let section = &manifest[start + header.len()..];
    let section = &section[..section.find("\n[").unwrap_or(section.len())];
    let mut assets = Vec::new();
    for line in section.lines().map(str::trim) {
        let (source, dest) = if table == "deb" && line.starts_with("[\"") {
            let q = quoted(line);
            let source = q[0].strip_prefix("../").unwrap_or(q[0]);
            (source.to_string(), q[1].to_string())
        } else if table == "generate-rpm" && line.starts_with("{ source = ") {
            let q = quoted(line);
            (q[0].to_string(), q[1].trim_start_matches('/').to_string())
        } else {
            continue;
        };
        let dest = match dest.strip_suffix('/') {
            Some(dir) if !source.contains('*') => {
                format!("{dir}/{}", source.rsplit('/').next().unwrap())
            }
            _ => dest,
        };
        assets.push((dest, source));
    }
    assert!(!assets.is_empty(), "no assets in {header}");
    assets
}

/// The documentation both packages put in /usr/share/doc/vtax, from the same
/// files, named in docs/install.md; and the same binary in /usr/bin: the one
/// scripts/split-debuginfo.sh writes, without its debug info.
#[test]
fn both_packages_ship_the_stripped_binary_and_the_same_docs() {
    let deb = package_assets("deb");
    let rpm = package_assets("generate-rpm");
    for assets in [&deb, &rpm] {
        let binary: Vec<_> = assets.iter().filter(|(d, _)| d == "usr/bin/vtax").collect();
        assert_eq!(
            binary,
            [&(
                "usr/bin/vtax".to_string(),
                "target/release/vtax.stripped".to_string()
            )]
        );
    }
    let docs = |assets: &[(String, String)]| {
        let mut docs: Vec<_> = assets
            .iter()
            .filter(|(d, _)| d.starts_with("usr/share/doc/vtax/"))
            .cloned()
            .collect();
        docs.sort();
        docs
    };
    let (deb_docs, rpm_docs) = (docs(&deb), docs(&rpm));
    assert_eq!(
        deb_docs, rpm_docs,
        "the .deb's docs (left) and the RPM's differ"
    );
    let names: Vec<_> = deb_docs
        .iter()
        .map(|(d, _)| d.trim_start_matches("usr/share/doc/vtax/"))
        .collect();
    for wanted in [
        "README.md",
        "install.md",
        "runbook.md",
        "metrics.md",
        "vtax.example.toml",
    ] {
        assert!(names.contains(&wanted), "no /usr/share/doc/vtax/{wanted}");
    }
    let install = read_repo("docs/install.md");
    for (name, (_, source)) in names.iter().zip(&deb_docs) {
        assert!(repo().join(source).is_file(), "no {source} to install");
        assert!(
            install.contains(&format!("`{name}`")),
            "docs/install.md does not name /usr/share/doc/vtax/{name}"
        );
    }
}

/// Every path docs/install.md names in the repository exists, and so does
/// every file packaging/README.md's table lists.
#[test]
fn the_paths_the_docs_name_exist() {
    let install = read_repo("docs/install.md");
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_.-/".contains(c);
    let mut named = Vec::new();
    for prefix in [
        "packaging/",
        "scripts/",
        "dashboards/",
        "docs/",
        "agent/",
        "tests/",
    ] {
        for (at, _) in install.match_indices(prefix) {
            if install[..at].chars().next_back().is_some_and(path_char) {
                continue; // inside a longer path, such as /usr/share/vtax/dashboards/
            }
            let rest = &install[at..];
            let end = rest.find(|c: char| !path_char(c)).unwrap_or(rest.len());
            named.push(rest[..end].trim_end_matches('.').to_string());
        }
    }
    assert!(named.iter().any(|p| p == "packaging/docker/Dockerfile"));
    for path in &named {
        assert!(
            repo().join(path).exists(),
            "docs/install.md names {path}, which does not exist"
        );
    }

    let readme = read_repo("packaging/README.md");
    let mut listed = 0;
    for line in readme.lines().filter(|l| l.starts_with("| `")) {
        let first_cell = line.split('|').nth(1).unwrap();
        for path in first_cell.split('`').skip(1).step_by(2) {
            assert!(
                repo().join("packaging").join(path).exists(),
                "packaging/README.md lists {path}, which is not in packaging/"
            );
            listed += 1;
        }
    }
    assert!(
        listed >= 7,
        "packaging/README.md's table lists {listed} paths"
    );
}

/// The first ```sh block under a `## heading` of docs/install.md: its commands,
/// without comments.
fn install_block(heading: &str) -> Vec<String> {
    let install = read_repo("docs/install.md");
    let section = install
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("docs/install.md has no section {heading:?}"));
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no sh block under {heading:?}"));
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Where `script` runs `command` as a whole command (alone, or inside `$(…)`,
/// after `||` or before a pipe), not as the start of a longer one.
fn runs_at(script: &str, command: &str) -> Option<usize> {
    script.match_indices(command).map(|(at, _)| at).find(|&at| {
        let before = script[..at].chars().next_back();
        let after = &script[at + command.len()..];
        matches!(before, None | Some('\n' | ' ' | '('))
            && (after.is_empty() || after.starts_with(['\n', ')']) || after.starts_with(" |"))
    })
}

/// The build commands docs/install.md gives for each package are the ones its
/// CI check runs, in the same order: CI runs them, with these flags, on every
/// change. (The install, start and doctor lines are run by the checks too, but
/// in their own form: `dpkg -i "$deb"`, an RPM database of their own.)
#[test]
fn the_install_commands_are_the_ones_ci_runs() {
    for (heading, script) in [
        ("Debian and Ubuntu", "scripts/deb-check.sh"),
        ("RHEL, Rocky, Alma", "scripts/rpm-check.sh"),
    ] {
        let text = read_repo(script);
        let mut last = 0;
        let mut checked = 0;
        for command in install_block(heading) {
            if !(command.starts_with("cargo ") || command.starts_with("scripts/")) {
                continue;
            }
            let at = runs_at(&text, &command).unwrap_or_else(|| {
                panic!("{script} does not run `{command}` (docs/install.md, {heading})")
            });
            assert!(
                at >= last,
                "{script} runs `{command}` out of docs/install.md's order"
            );
            last = at;
            checked += 1;
        }
        assert_eq!(checked, 4, "{heading}: install, build, split, package");
    }
}

/// The image: the Dockerfile copies what .dockerignore lets through and
/// nothing else; its binary is the stripped one both packages ship; and the
/// tag docs/install.md builds and pushes is the one the DaemonSet runs, at
/// the workspace's version.
#[test]
fn the_image_build_agrees_with_the_manifest_and_the_context() {
    let dockerfile = read_repo("packaging/docker/Dockerfile");
    let mut copied: Vec<&str> = Vec::new();
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ")) {
        let args: Vec<_> = line
            .split_whitespace()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        copied.extend(&args[..args.len() - 1]);
    }
    for source in &copied {
        if source.starts_with("target/") {
            assert_eq!(
                *source, "target/release/vtax.stripped",
                "the image's binary is not the packages'"
            );
        } else {
            assert!(
                repo().join(source).is_file(),
                "the Dockerfile copies {source}, which does not exist"
            );
        }
    }
    let ignore = read_repo(".dockerignore");
    let patterns: Vec<_> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        patterns.first(),
        Some(&"*"),
        ".dockerignore must exclude everything first"
    );
    let mut sent: Vec<_> = patterns[1..]
        .iter()
        .map(|p| {
            p.strip_prefix('!')
                .unwrap_or_else(|| panic!(".dockerignore: {p} is not an exception"))
        })
        .collect();
    sent.sort();
    copied.sort();
    assert_eq!(
        sent, copied,
        ".dockerignore sends (left) what the Dockerfile copies (right)"
    );

    let version = env!("CARGO_PKG_VERSION");
    let image = format!("REGISTRY/vtax:{version}");
    let manifest = read_repo("packaging/kubernetes/vtax.yaml");
    let images: Vec<_> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert_eq!(images, [image.as_str()], "the DaemonSet's image");
    let block = install_block("Kubernetes");
    let tag = format!("\"$REGISTRY/vtax:{version}\"");
    let docker_build = format!("docker build -f packaging/docker/Dockerfile -t {tag} .");
    for line in [
        "cargo build --release -p vtax --features object-storage",
        "scripts/split-debuginfo.sh",
        &docker_build,
        &format!("docker push {tag}"),
    ] {
        assert!(
            block.iter().any(|l| l == line),
            "docs/install.md's Kubernetes block lacks `{line}`"
        );
    }
    let apply = block
        .iter()
        .find(|l| l.contains("kubectl apply"))
        .expect("a kubectl apply line");
    assert!(
        apply.contains("s|REGISTRY/vtax:|$REGISTRY/vtax:|")
            && apply.contains("packaging/kubernetes/vtax.yaml")
    );
    assert!(
        dockerfile.contains(&format!("-t \"$REGISTRY/vtax:{version}\"")),
        "the Dockerfile's build comment"
    );
    let readme = read_repo("packaging/README.md");
    let readme_block: Vec<_> = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("packaging/README.md's build-and-push block")
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .collect();
    assert_eq!(
        readme_block, block,
        "packaging/README.md's commands (left) and docs/install.md's"
    );
}

/// scripts/split-debuginfo.sh on a small Rust binary built as the release
/// profile builds the agent (`debug = 1`): the stripped copy runs, has no
/// debug info, keeps its symbols and names the debug file, which holds it.
#[test]
fn split_debuginfo_moves_the_debug_info_out_and_keeps_the_symbols() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("hello.rs");
    std::fs::write(
        &source,
        "fn main() { println!(\"hello {}\", std::process::id() > 0); }\n",
    )
    .unwrap();
    let bin = dir.path().join("hello");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args(["-C", "debuginfo=1", "-C", "opt-level=2", "-o"])
        .arg(&bin)
        .arg(&source)
        .output()
        .expect("rustc runs");
    assert!(
        out.status.success(),
        "rustc: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new("bash")
        .arg(repo().join("scripts/split-debuginfo.sh"))
        .arg(&bin)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "split-debuginfo.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let sections = |path: &Path| {
        let out = Command::new("readelf")
            .args(["-S", "-W"])
            .arg(path)
            .output()
            .expect("readelf is installed (binutils; scripts/test.sh installs it)");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                l.split(']')
                    .nth(1)?
                    .split_whitespace()
                    .next()
                    .map(String::from)
            })
            .collect::<Vec<_>>()
    };
    let has = |names: &[String], name: &str| names.iter().any(|n| n == name);
    let original = sections(&bin);
    assert!(has(&original, ".debug_info") && has(&original, ".debug_line"));
    let stripped_path = dir.path().join("hello.stripped");
    let stripped = sections(&stripped_path);
    assert!(
        !has(&stripped, ".debug_info") && !has(&stripped, ".debug_line"),
        "{stripped:?}"
    );
    assert!(
        has(&stripped, ".symtab") && has(&stripped, ".gnu_debuglink"),
        "{stripped:?}"
    );
    let debug = sections(&dir.path().join("hello.debug"));
    assert!(
        has(&debug, ".debug_info") && has(&debug, ".debug_line"),
        "{debug:?}"
    );

    let link = std::fs::read(&stripped_path).unwrap();
    assert!(link
        .windows(b"hello.debug\0".len())
        .any(|w| w == b"hello.debug\0"));
    assert!(link.len() < std::fs::metadata(&bin).unwrap().len() as usize);
    let out = Command::new(&stripped_path).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello true\n");
}
