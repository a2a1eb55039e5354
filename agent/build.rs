//! Packs the code the agent runs into one stretch of its binary (see
//! `src/hot_text.rs`), and gives `src/build_info.rs` the build's git revision
//! and rustc's version.

#[path = "src/hot_text.rs"]
mod hot_text;

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    build_facts(&manifest_dir);
    let list_path = manifest_dir.join("hot-text.txt");
    println!("cargo:rerun-if-changed={}", list_path.display());
    println!("cargo:rerun-if-changed=src/hot_text.rs");
    // Only release builds are what the agent ships and what its bars measure;
    // Linux's linkers (GNU ld, lld) take the script.
    let is_release = std::env::var("PROFILE").as_deref() == Ok("release");
    let is_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if !is_release || !is_linux {
        return;
    }
    let list = std::fs::read_to_string(&list_path)
        .unwrap_or_else(|error| panic!("read {}: {error}", list_path.display()));
    let script_path = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("hot-text.ld");
    std::fs::write(&script_path, hot_text::linker_script(&list))
        .unwrap_or_else(|error| panic!("write {}: {error}", script_path.display()));
    println!(
        "cargo:rustc-link-arg-bin=vtax=-Wl,-T,{}",
        script_path.display()
    );
}

/// Sets `VTAX_BUILD_REVISION` and `VTAX_BUILD_RUSTC_VERSION` for `env!`.
/// The revision is VTAX_BUILD_REVISION from the environment when set (a build
/// from a source tarball), else git's, in release builds only: finding it
/// means rebuilding the agent whenever HEAD moves, which every commit would
/// cost the debug builds that tests run. Without either it is `unknown`.
fn build_facts(manifest_dir: &Path) {
    println!("cargo:rerun-if-env-changed=VTAX_BUILD_REVISION");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let revision = std::env::var("VTAX_BUILD_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| release.then(|| git_revision(manifest_dir)).flatten())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=VTAX_BUILD_REVISION={revision}");
    // `rustc 1.85.0 (4d91de4e4 2025-02-17)`: the second word.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = output(Command::new(rustc).arg("--version"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=VTAX_BUILD_RUSTC_VERSION={rustc_version}");
}

/// HEAD's commit, 12 hex digits; the script runs again when HEAD or the
/// branch it names moves. `None` without git or outside a repository.
fn git_revision(manifest_dir: &Path) -> Option<String> {
    let git = |args: &[&str]| output(Command::new("git").args(args).current_dir(manifest_dir));
    let revision = git(&["rev-parse", "--short=12", "HEAD"])?;
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            let path = manifest_dir.join(path);
            // A path that does not exist would run the script on every build.
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(revision)
}

/// A command's standard output, trimmed, when it succeeds.
fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}
