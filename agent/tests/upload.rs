//! `vtax upload` end to end: a mounted-path target read back with DuckDB and
//! pyarrow as a fleet, a crash between a put and its manifest line, and a
//! local S3 (moto_server). Uploads are built with the "object-storage"
//! feature, which `scripts/test.sh` turns on.
#![cfg(feature = "object-storage")]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use vtax_store::files::{live_files, FileInfo};
use vtax_store::tables::{self, ScrapedRow};
use vtax_store::{date_string, BatchBuilder, Catalog, Store, StoreOptions};
use vtax_store::{DAY_US, HOUR_US};

use common::{stdout_of, Agent, VTAX};
/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;
/// Day D's last two hours, then day D+1's first two.
const HOURS: [i64; 4] = [22, 23, 24, 25];

/// A node's store: hours 22 and 23 of day D and 0 of day D+1 in two parts
/// each, hour 1 of D+1 in one; compacted at D+1 01:10, so day D is one
/// file, D+1's hour 0 is sealed and hour 1 still runs. Returns the rows.
fn node_store(dir: &Path, node: &str) -> u64 {
    let mut options = StoreOptions::new(dir);
    options.node = node.into();
    let mut store = Store::open(options, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    let mut rows = 0;
    for hour in HOURS {
        let parts = if hour == 25 { 1 } else { 2 };
        for part in 0..parts {
            let mut b = BatchBuilder::new(&tables::SCRAPED);
            for i in 0..120 {
                let t = T0 + hour * HOUR_US + part * 1_200_000_000 + i * 5_000_000;
                let labels = format!("node=\"{node}\",i=\"{}\"", i % 4);
                let row = ScrapedRow {
                    target: "",
                    metric: "m",
                    labels: &labels,
                    value: Some(i as f64),
                };
                b.push_row(t, &row).unwrap();
                rows += 1;
            }
            store.append(&b.finish()).unwrap();
            store.flush().unwrap();
        }
    }
    store.compact(T0 + 25 * HOUR_US + 600_000_000).unwrap();
    store.close().unwrap();
    rows
}

fn upload(data_dir: &Path, url: &str, now_us: i64) -> std::process::Output {
    let out = Command::new(VTAX)
        .args(["upload", "--data-dir"])
        .arg(data_dir)
        .args(["--url", url, "--now", &(now_us / 1_000_000).to_string()])
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// The key a local file has under the fleet layout.
fn key(f: &FileInfo) -> String {
    format!(
        "tables/{}/node={}/date={}/{}",
        f.table,
        f.node,
        date_string(f.day),
        f.name()
    )
}

/// Every file under `dir`, relative path → bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

/// Live local files with their keys, those sealed at `now_us` only.
fn sealed(data_dir: &Path, now_us: i64) -> BTreeMap<String, FileInfo> {
    let files = live_files(data_dir).unwrap();
    files
        .iter()
        .filter(|f| {
            let partition: Vec<FileInfo> =
                files.iter().filter(|g| g.day == f.day).cloned().collect();
            f.is_sealed(&partition, now_us, 300_000_000)
        })
        .map(|f| (key(f), f.clone()))
        .collect()
}

/// The target holds exactly these objects, each the bytes of its local file.
fn assert_target_holds(target: &Path, expected: &BTreeMap<String, FileInfo>) {
    let remote = tree(target);
    assert_eq!(
        remote.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (key, file) in expected {
        assert_eq!(remote[key], std::fs::read(&file.path).unwrap(), "{key}");
    }
}

fn python(script: &str, args: &[&str]) -> String {
    // scripts/test.sh installs duckdb, pyarrow and moto.
    stdout_of(Command::new("python3").arg("-c").arg(script).args(args))
        .trim()
        .to_string()
}

/// Rows per (node, date) as DuckDB and pyarrow see the fleet layout with
/// Hive partitioning; both must agree.
fn fleet_counts(target: &Path) -> String {
    let script = r#"
import sys, duckdb, pyarrow.dataset as ds
root = sys.argv[1]
con = duckdb.connect()
rows = con.execute(
    f"SELECT node, CAST(date AS VARCHAR), count(*) FROM read_parquet('{root}/tables/scraped/*/*/*.parquet', hive_partitioning = true) GROUP BY ALL ORDER BY ALL"
).fetchall()
t = ds.dataset(f"{root}/tables/scraped", format="parquet", partitioning="hive").to_table(columns=["node", "date"])
arrow = sorted(
    (n, str(d), c)
    for (n, d), c in __import__("collections").Counter(zip(t["node"].to_pylist(), t["date"].to_pylist())).items()
)
assert [tuple(r) for r in rows] == arrow, (rows, arrow)
print(";".join(f"{n}/{d}={c}" for n, d, c in rows))
"#;
    python(script, &[target.to_str().unwrap()])
}

#[test]
fn a_fleet_on_a_mounted_path_reads_back_with_hive_partitions_and_no_row_twice() {
    let fleet = tempfile::tempdir().unwrap();
    let target = fleet.path().join("bucket");
    std::fs::create_dir(&target).unwrap();
    let url = format!("file://{}", target.display());
    let mut rows = 0;
    let mut dirs = Vec::new();
    for node in ["n1", "n2"] {
        let dir = fleet.path().join(node);
        rows += node_store(&dir, node);
        dirs.push((dir, node));
    }
    // D+1 01:10: day D's file and D+1's hour 0 are sealed, hour 1 is not.
    let now = T0 + 25 * HOUR_US + 600_000_000;
    let mut expected = BTreeMap::new();
    for (dir, _) in &dirs {
        assert!(upload(dir, &url, now).status.success());
        expected.extend(sealed(dir, now));
    }
    assert_eq!(expected.len(), 4, "{:?}", expected.keys());
    assert_target_holds(&target, &expected);
    assert_eq!(
        fleet_counts(&target),
        "n1/2025-11-21=480;n1/2025-11-22=240;n2/2025-11-21=480;n2/2025-11-22=240"
    );

    // Day D+1 ends: it is compacted from the uploaded hour 0 and hour 1's
    // part. The day file goes up, and hour 0's object goes, so every row is
    // there once.
    let later = T0 + 2 * DAY_US + 600_000_000;
    for (dir, node) in &dirs {
        let mut options = StoreOptions::new(dir);
        options.node = node.to_string();
        let mut store = Store::open(options, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
        store.compact(later).unwrap();
        store.close().unwrap();
        let out = upload(dir, &url, later);
        assert!(out.status.success());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("Uploaded 1 file(s)") && said.contains("1 replaced object(s) deleted"),
            "{said}"
        );
    }
    let mut expected = BTreeMap::new();
    for (dir, _) in &dirs {
        expected.extend(sealed(dir, later));
    }
    assert_target_holds(&target, &expected);
    assert_eq!(
        fleet_counts(&target),
        "n1/2025-11-21=480;n1/2025-11-22=360;n2/2025-11-21=480;n2/2025-11-22=360"
    );
    assert_eq!(rows, 2 * 840);
}

/// Every path under `dir`, with its owner and group (links not followed).
fn owners(dir: &Path) -> BTreeMap<String, (u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        let meta = at.symlink_metadata().unwrap();
        let name = at.strip_prefix(dir).unwrap().display().to_string();
        out.insert(name, (meta.uid(), meta.gid()));
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&at).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

/// The packaged agent runs as its own user and owns the data directory; an
/// operator runs `upload` and `compact` as root. What they make (the upload
/// state, a merged day file, a WAL segment) takes the directory's owner: a
/// root-owned `upload/` failed the agent's uploader with "Permission
/// denied" at every pass. Run by another user, everything stays theirs.
#[test]
fn a_store_keeps_its_owner_through_upload_and_compact_run_by_root() {
    use std::os::unix::fs::MetadataExt;
    let fleet = tempfile::tempdir().unwrap();
    let target = fleet.path().join("bucket");
    std::fs::create_dir(&target).unwrap();
    let dir = fleet.path().join("n1");
    node_store(&dir, "n1");
    // SAFETY: geteuid reads the effective uid; it cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let owner = if root {
        for path in owners(&dir).keys() {
            std::os::unix::fs::lchown(dir.join(path), Some(12345), Some(12346)).unwrap();
        }
        (12345, 12346)
    } else {
        let meta = dir.metadata().unwrap();
        (meta.uid(), meta.gid())
    };
    let before = owners(&dir).len();
    let url = format!("file://{}", target.display());
    let now = T0 + 25 * HOUR_US + 600_000_000;
    assert!(upload(&dir, &url, now).status.success());
    let later = T0 + 2 * DAY_US + 600_000_000;
    let compact = Command::new(VTAX)
        .args(["compact", "--data-dir"])
        .arg(&dir)
        .args(["--now", &(later / 1_000_000).to_string()])
        .output()
        .unwrap();
    assert!(compact.status.success(), "{compact:?}");
    assert!(upload(&dir, &url, later).status.success());
    let after = owners(&dir);
    assert!(
        after.keys().any(|p| p.starts_with("upload/")) && after.len() > before,
        "upload and compact made files: {after:?}"
    );
    let others: Vec<_> = after.iter().filter(|(_, o)| **o != owner).collect();
    assert!(others.is_empty(), "not owned by {owner:?}: {others:?}");
}

#[test]
fn a_crash_between_put_and_manifest_converges_with_no_object_missing_or_twice() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("data");
    node_store(&dir, "n1");
    let target = base.path().join("bucket");
    std::fs::create_dir(&target).unwrap();
    let url = format!("file://{}", target.display());
    // Every file sealed: day D's and both hours of D+1.
    let now = T0 + 3 * DAY_US;
    let expected = sealed(&dir, now);
    assert_eq!(expected.len(), 3);
    let crashed = Command::new(VTAX)
        .args(["upload", "--data-dir"])
        .arg(&dir)
        .args(["--url", &url, "--now", &(now / 1_000_000).to_string()])
        .env("VTAX_UPLOAD_CRASH_AFTER_PUTS", "2")
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), Some(86), "the failpoint fired");
    let manifest = dir.join("upload/manifest.jsonl");
    let puts = |text: &str| text.lines().filter(|l| l.contains(r#""op":"put""#)).count();
    assert_eq!(
        puts(&std::fs::read_to_string(&manifest).unwrap()),
        1,
        "the second put is not recorded"
    );
    assert_eq!(tree(&target).len(), 2, "but its object is there");
    assert!(upload(&dir, &url, now).status.success());
    assert!(upload(&dir, &url, now).status.success(), "and again");
    assert_target_holds(&target, &expected);
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert_eq!(puts(&text), 3, "each file recorded once:\n{text}");
}

/// moto_server on a free port, stopped on drop.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto() -> Moto {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server runs (scripts/test.sh installs moto[server])");
    let moto = Moto {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    moto
}

const S3_LIST: &str = r#"
import sys, hashlib, boto3
endpoint, bucket, op = sys.argv[1], sys.argv[2], sys.argv[3]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
if op == "create":
    s3.create_bucket(Bucket=bucket)
else:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            print(o["Key"], o["Size"], hashlib.sha256(body).hexdigest())
"#;

#[test]
fn uploads_to_a_local_s3_and_lists_back_the_same_bytes() {
    let moto = moto();
    python(S3_LIST, &[&moto.endpoint, "vtax-fleet", "create"]);
    let base = tempfile::tempdir().unwrap();
    let dir: PathBuf = base.path().join("data");
    node_store(&dir, "n1");
    let now = T0 + 3 * DAY_US;
    let run = || {
        Command::new(VTAX)
            .args(["upload", "--data-dir"])
            .arg(&dir)
            .args([
                "--url",
                "s3://vtax-fleet/prod/gpu",
                "--endpoint",
                &moto.endpoint,
            ])
            .args(["--allow-http", "--region", "us-east-1"])
            .args(["--now", &(now / 1_000_000).to_string()])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .output()
            .unwrap()
    };
    let out = run();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("Uploaded 3 file(s)"), "{said}");
    let listed = python(S3_LIST, &[&moto.endpoint, "vtax-fleet", "list"]);
    let mut expected: Vec<String> = sealed(&dir, now)
        .iter()
        .map(|(key, f)| {
            let bytes = std::fs::read(&f.path).unwrap();
            let digest = python(
                "import sys, hashlib; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
                &[f.path.to_str().unwrap()],
            );
            format!("prod/gpu/{key} {} {digest}", bytes.len())
        })
        .collect();
    expected.sort();
    assert_eq!(listed.lines().collect::<Vec<_>>(), expected);
    // A second run finds everything in the manifest and puts nothing.
    let out = run();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains("Uploaded 0 file(s)"), "{said}");
}

#[test]
fn the_agent_uploads_from_its_own_thread_and_says_so_on_metrics() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    node_store(&data, "n1");
    let target = base.path().join("bucket");
    std::fs::create_dir(&target).unwrap();
    let config = base.path().join("vtax.toml");
    std::fs::write(
        &config,
        format!(
            "[upload]\nurl = \"file://{}\"\ninterval_secs = 1\n",
            target.display()
        ),
    )
    .unwrap();
    let agent = Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    // Every file of 2025 is long sealed: day D, and D+1's two hours.
    let body = agent.wait_for_metric("vtax_upload_files_total 3", Duration::from_secs(30));
    assert!(body.contains("vtax_upload_pending_files 0"), "{body}");
    assert!(body.contains("vtax_upload_failures_total 0"), "{body}");
    assert!(agent.stop());
    let expected = sealed(&data, T0 + 3 * DAY_US)
        .into_iter()
        .filter(|(_, f)| f.table == "scraped")
        .collect();
    assert_target_holds(&target, &expected);
}
