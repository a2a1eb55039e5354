//! The uploader against a mounted-path target: which files go, where, and what
//! a merge of uploaded files does remotely.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use vtax_store::schema::{FieldDef, FieldType, TagDef, Unit};
use vtax_store::tables::{self, ScrapedRow};
use vtax_store::{BatchBuilder, Catalog, Store, StoreOptions, DAY_US, HOUR_US};

use super::command::pending_summary;
use super::*;
use crate::config::Config;

/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;
const SETTLE_US: i64 = SETTLE.as_micros() as i64;

fn open_store(dir: &Path) -> Store {
    let mut options = StoreOptions::new(dir);
    options.node = "n1".into();
    Store::open(options, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap()
}

/// Appends `n` rows, one a second from `start`, and publishes them as a part.
fn part(store: &mut Store, start: i64, n: i64) {
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    for i in 0..n {
        let row = ScrapedRow {
            target: "",
            metric: "m",
            labels: &format!("i=\"{}\"", i % 3),
            value: Some(i as f64),
        };
        b.push_row(start + i * 1_000_000, &row).unwrap();
    }
    store.append(&b.finish()).unwrap();
    store.flush().unwrap();
}

fn uploader(data_dir: &Path, target: &Path) -> Uploader {
    let config = UploadConfig {
        url: Some(format!("file://{}", target.display())),
        ..UploadConfig::default()
    };
    Uploader::open(data_dir, Remote::connect(&config).unwrap()).unwrap()
}

fn pass(u: &mut Uploader, now_us: i64) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(u.pass(now_us))
        .unwrap();
}

/// Every object under `target`, relative path → bytes.
fn objects(target: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![target.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e.path().strip_prefix(target).unwrap().display().to_string();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

fn local_files(dir: &Path) -> Vec<FileInfo> {
    vtax_store::files::live_files(dir).unwrap()
}

#[test]
fn sealed_hours_go_under_node_and_date_and_parts_stay() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    // Hour 0 in two parts, sealed by compaction; hour 1 in two parts, running.
    part(&mut store, T0, 100);
    part(&mut store, T0 + 600_000_000, 100);
    part(&mut store, T0 + HOUR_US, 10);
    part(&mut store, T0 + HOUR_US + 60_000_000, 10);
    let now = T0 + HOUR_US + 20 * 60_000_000;
    store.compact(now).unwrap();
    let mut u = uploader(data.path(), target.path());
    pass(&mut u, now);
    let hour0 = local_files(data.path())
        .into_iter()
        .find(|f| f.watermarks.contains_key(&(T0 / HOUR_US)))
        .unwrap();
    let key = format!("tables/scraped/node=n1/date=2025-11-21/{}", hour0.name());
    let remote = objects(target.path());
    assert_eq!(remote.keys().collect::<Vec<_>>(), [&key]);
    assert_eq!(remote[&key], std::fs::read(&hour0.path).unwrap());
    assert_eq!((u.stats.files, u.stats.bytes), (1, hour0.bytes));
    assert_eq!(u.stats.pending_files, 0);
    // A second pass finds nothing to do.
    pass(&mut u, now);
    assert_eq!(u.stats.files, 1);
    assert_eq!(objects(target.path()).len(), 1);
}

#[test]
fn a_large_file_goes_in_parts_and_arrives_whole() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    part(&mut store, T0, 2000);
    let mut u = uploader(data.path(), target.path());
    u.single_put_max_bytes = 1024;
    u.multipart_chunk_bytes = 500;
    pass(&mut u, T0 + DAY_US);
    let local = local_files(data.path());
    assert!(
        local[0].bytes > 3 * 500,
        "{} bytes: several parts",
        local[0].bytes
    );
    let remote = objects(target.path());
    assert_eq!(remote.len(), 1);
    assert_eq!(
        remote.values().next().unwrap(),
        &std::fs::read(&local[0].path).unwrap()
    );
    assert_eq!(u.stats.files, 1);
}

/// A store holding `hours` hour files of day 0, each uploaded once its hour
/// settled when `uploaded` says so.
fn hours_of_day_zero(
    data: &Path,
    target: &Path,
    hours: i64,
    uploaded: impl Fn(i64) -> bool,
) -> (Store, Uploader) {
    let mut store = open_store(data);
    let mut u = uploader(data, target);
    for hour in 0..hours {
        part(&mut store, T0 + hour * HOUR_US, 50);
        if uploaded(hour) {
            pass(&mut u, T0 + (hour + 1) * HOUR_US + SETTLE_US);
        }
    }
    (store, u)
}

#[test]
fn a_compacted_day_of_uploaded_hours_is_only_recorded() {
    // Three hours merge at once; 24 merge 8 at a time, then the three
    // results, so that the day file's own inputs were never uploaded.
    for (hours, merges, intermediates) in [(3, 1, 0), (24, 4, 3)] {
        let data = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let (mut store, mut u) = hours_of_day_zero(data.path(), target.path(), hours, |_| true);
        assert_eq!(u.stats.files, hours as u64);
        let before = objects(target.path());
        assert_eq!(store.compact(T0 + DAY_US + SETTLE_US).unwrap(), merges);
        let day = local_files(data.path());
        assert_eq!(day.len(), 1, "the day is one file");
        assert_eq!(day[0].compacted_intermediates.len(), intermediates);
        pass(&mut u, T0 + DAY_US + SETTLE_US);
        assert_eq!((u.stats.files, u.stats.covered), (hours as u64, 1));
        assert_eq!(objects(target.path()), before, "no row twice remotely");
    }
}

#[test]
fn a_day_merged_in_rounds_before_its_last_hour_went_replaces_the_hours() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let (mut store, mut u) = hours_of_day_zero(data.path(), target.path(), 24, |h| h < 23);
    assert_eq!(objects(target.path()).len(), 23);
    store.compact(T0 + DAY_US + SETTLE_US).unwrap();
    let day = local_files(data.path());
    assert_eq!(day.len(), 1);
    pass(&mut u, T0 + DAY_US + SETTLE_US);
    let remote = objects(target.path());
    assert_eq!(remote.len(), 1, "only the day remains: {:?}", remote.keys());
    let (key, bytes) = remote.iter().next().unwrap();
    assert!(key.ends_with(day[0].name()), "{key}");
    assert_eq!(*bytes, std::fs::read(&day[0].path).unwrap());
    assert_eq!(u.stats.replaced_deleted, 23);
}

#[test]
fn a_late_row_replaces_the_uploaded_hour_remotely() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    let mut u = uploader(data.path(), target.path());
    part(&mut store, T0, 100);
    let now = T0 + HOUR_US + SETTLE_US;
    pass(&mut u, now);
    let first = objects(target.path());
    assert_eq!(first.len(), 1);
    // A late row of hour 0 (as a WAL replay after a long stop brings) makes
    // the store merge the uploaded file with the new part.
    part(&mut store, T0 + 30 * 60_000_000, 1);
    store.compact(now).unwrap();
    let merged = local_files(data.path());
    assert_eq!(merged.len(), 1);
    pass(&mut u, now);
    let remote = objects(target.path());
    assert_eq!(remote.len(), 1, "{remote:?}");
    let (key, bytes) = remote.iter().next().unwrap();
    assert!(key.ends_with(merged[0].name()), "{key}");
    assert_eq!(*bytes, std::fs::read(&merged[0].path).unwrap());
    assert_eq!(u.stats.replaced_deleted, 1);
    let manifest = Manifest::read(data.path(), &u.remote.url).unwrap();
    assert!(manifest.pending_deletes().is_empty());
}

/// A manifest line edited by hand names a replaced object by a key no object
/// can have: the pass goes on without it (it failed at that delete, every
/// pass, and nothing more went up).
#[test]
fn a_manifest_key_no_object_can_have_does_not_stop_the_uploads() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    let url = uploader(data.path(), target.path()).remote.url.clone();
    let line = format!("{{\"op\":\"replaced\",\"target\":\"{url}\",\"key\":\"a//b\"}}\n");
    std::fs::write(data.path().join("upload/manifest.jsonl"), line).unwrap();
    let mut u = uploader(data.path(), target.path());
    part(&mut store, T0, 100);
    pass(&mut u, T0 + HOUR_US + SETTLE_US);
    assert_eq!(objects(target.path()).len(), 1);
    assert_eq!(u.stats.failures, 0);
}

/// A put that landed but was never confirmed (its answer lost, its check
/// failed, the agent stopped before the `put` line), then the file merged
/// away: the merged file's upload deletes the object the put may have left,
/// or the bucket holds the hour twice and every glob over it counts its
/// rows twice.
#[test]
fn an_unconfirmed_put_of_a_file_merged_since_is_replaced_too() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    let mut u = uploader(data.path(), target.path());
    part(&mut store, T0, 100);
    let now = T0 + HOUR_US + SETTLE_US;
    pass(&mut u, now);
    assert_eq!(objects(target.path()).len(), 1);
    drop(u);
    // The object is there; the manifest never heard of it.
    let manifest = data.path().join("upload").join(manifest::MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest).unwrap();
    let unconfirmed: String = text
        .lines()
        .filter(|l| !l.contains(r#""op":"put""#))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(unconfirmed, text, "the put line was there");
    std::fs::write(&manifest, unconfirmed).unwrap();
    part(&mut store, T0 + 30 * 60_000_000, 1);
    store.compact(now).unwrap();
    let merged = local_files(data.path());
    assert_eq!(merged.len(), 1);
    let mut u = uploader(data.path(), target.path());
    pass(&mut u, now);
    let remote = objects(target.path());
    assert_eq!(remote.len(), 1, "the hour once: {:?}", remote.keys());
    assert!(remote.keys().next().unwrap().ends_with(merged[0].name()));
}

/// The same bucket and prefix at another S3 service is another target: a
/// file put to the first is neither taken as uploaded to the second nor
/// deletable for it.
#[test]
fn a_target_is_its_url_and_its_endpoint() {
    let at = |endpoint: Option<&str>| UploadConfig {
        url: Some("s3://fleet/cr".into()),
        endpoint: endpoint.map(str::to_string),
        ..UploadConfig::default()
    };
    assert_eq!(at(None).target().as_deref(), Some("s3://fleet/cr"));
    let (a, b) = (
        at(Some("http://10.0.0.1:9000")),
        at(Some("http://10.0.0.2:9000")),
    );
    assert_ne!(a.target(), b.target());
    let data = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    part(&mut store, T0, 10);
    let file = local_files(data.path()).remove(0);
    let mut manifest = Manifest::open(data.path(), &a.target().unwrap()).unwrap();
    manifest
        .append(manifest::Record::Put {
            target: a.target().unwrap(),
            file: file_id(&file.table, file.day, file.name()),
            bytes: file.bytes,
            key: "k".into(),
            e_tag: None,
            replaces: Vec::new(),
            time_us: T0,
        })
        .unwrap();
    drop(manifest);
    let deletable =
        |config: &UploadConfig| (retention_guard(config, data.path()).unwrap().0)(&file);
    assert!(deletable(&a), "uploaded to a");
    assert!(!deletable(&b), "never uploaded to b");
}

#[test]
fn retention_keeps_a_file_until_its_upload_is_confirmed() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut config = UploadConfig {
        url: Some(format!("file://{}", target.path().display())),
        ..UploadConfig::default()
    };
    let mut options = StoreOptions::new(data.path());
    options.node = "n1".into();
    options.retention_max_age = Some(Duration::from_secs(86_400));
    options.retention_deletable = retention_guard(&config, data.path());
    let mut store =
        Store::open(options.clone(), Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    part(&mut store, T0, 10);
    part(&mut store, T0 + DAY_US, 10);
    let later = T0 + 10 * DAY_US;
    assert_eq!(store.apply_retention(later).unwrap(), 0, "nothing uploaded");
    let mut u = uploader(data.path(), target.path());
    // Upload only day 0's file: day 1's hour has not settled at this time.
    pass(&mut u, T0 + DAY_US + HOUR_US / 2);
    assert_eq!(u.stats.files, 1);
    assert_eq!(store.apply_retention(later).unwrap(), 1);
    let left = local_files(data.path());
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].day, T0 / DAY_US + 1, "the un-uploaded file is kept");
    // Off: retention no longer waits.
    config.delete_local_after_upload = false;
    assert!(retention_guard(&config, data.path()).is_none());
}

#[test]
fn config_names_the_bad_key() {
    let bad = [
        ("[upload]\nurl = \"ftp://x/y\"\n", "upload.url"),
        ("[upload]\nurl = \"s3:///p\"\n", "no bucket"),
        ("[upload]\nurl = \"file://relative\"\n", "absolute path"),
        (
            "[upload]\nurl = \"gs://b/p\"\nregion = \"eu\"\n",
            "upload.region",
        ),
        ("[upload]\ninterval_secs = 0\n", "upload.interval_secs"),
    ];
    for (text, wanted) in bad {
        let err = Config::parse(text, "t.toml").unwrap_err().to_string();
        assert!(err.contains(wanted), "{text}: {err}");
        assert!(err.starts_with("t.toml:"), "{err}");
    }
    let err = Config::parse("[upload]\nbucket = \"x\"\n", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("bucket") && err.contains("line 2"), "{err}");
    let ok = Config::parse(
        "[upload]\nurl = \"s3://b/fleet/\"\nendpoint = \"http://127.0.0.1:9000\"\nallow_http = true\n",
        "t.toml",
    )
    .unwrap();
    let target = Target::parse(ok.upload.url.as_deref().unwrap()).unwrap();
    assert_eq!(
        (target.bucket.as_str(), target.prefix.as_str()),
        ("b", "fleet")
    );
}

#[test]
fn the_manifest_forgets_files_long_gone_and_keeps_what_matters() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    let mut u = uploader(data.path(), target.path());
    u.manifest_rewrite_above_bytes = 1;
    // Day 0 uploaded, then retained away; day 1's hour uploaded; day 1's
    // hour then merged with a late part, leaving a delete to do.
    part(&mut store, T0, 10);
    pass(&mut u, T0 + HOUR_US + SETTLE_US);
    part(&mut store, T0 + DAY_US, 10);
    pass(&mut u, T0 + DAY_US + HOUR_US + SETTLE_US);
    let day0 = local_files(data.path())
        .into_iter()
        .find(|f| f.day == T0 / DAY_US)
        .unwrap();
    std::fs::remove_file(&day0.path).unwrap();
    part(&mut store, T0 + DAY_US + 60_000_000, 1);
    store.compact(T0 + DAY_US + HOUR_US + SETTLE_US).unwrap();
    let hour = local_files(data.path());
    assert_eq!(hour.len(), 1);
    pass(&mut u, T0 + DAY_US + HOUR_US + SETTLE_US);
    let text = std::fs::read_to_string(data.path().join("upload/manifest.jsonl")).unwrap();
    // The live file, and the input its compaction names (a reader of the
    // manifest could still ask about it); day 0 is forgotten.
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains(hour[0].name()), "{text}");
    assert!(text.contains(&hour[0].compacted_from[0]), "{text}");
    assert!(u
        .manifest
        .covered(&file_id("scraped", day0.day, day0.name()))
        .is_none());
    // Reopened, it still knows the live file: nothing is put again.
    drop(u);
    let mut u = uploader(data.path(), target.path());
    pass(&mut u, T0 + 2 * DAY_US);
    assert_eq!(u.stats.files, 0);
    assert_eq!(
        objects(target.path()).len(),
        2,
        "day 0's object stays remote"
    );
}

vtax_store::table! {
    /// A second table, so that a pass handles several partitions.
    static GPU: TableDef, struct GpuRow {
        name: "gpu",
        help: "Test table.",
        tags: [gpu = TagDef { name: "gpu", help: "Index." }],
        fields: [power_watts: f64 = FieldDef::gauge(FieldType::F64, Unit::Watts, "Power.")],
        exported: true,
    }
}

const NODE: &str = "gpu-node-17";

fn two_tables() -> Catalog {
    Catalog::new(&[&tables::SCRAPED, &GPU]).unwrap()
}

/// Appends `n` rows of `gpu`, one a second from `start`, as a part.
fn gpu_part(store: &mut Store, start: i64, n: i64) {
    let mut b = BatchBuilder::new(&GPU);
    for i in 0..n {
        let row = GpuRow {
            gpu: &(i % 4).to_string(),
            power_watts: i as f64,
        };
        b.push_row(start + i * 1_000_000, &row).unwrap();
    }
    store.append(&b.finish()).unwrap();
    store.flush().unwrap();
}

/// Rows of `table` before `until_us` in the node's store and in the fleet copy.
fn rows_here_and_there(data: &Path, target: &Path, table: &str, until_us: i64) -> (usize, usize) {
    let request = vtax_store::ScanRequest {
        table: table.into(),
        until_us: Some(until_us),
        ..Default::default()
    };
    let here = vtax_store::scan::scan_dir(data, &two_tables(), &request).unwrap();
    let there = vtax_store::scan::scan_fleet_node(target, NODE, &two_tables(), &request).unwrap();
    (here.rows(), there.rows())
}

#[test]
fn a_stopped_store_uploads_every_part_and_the_fleet_copy_holds_every_row() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let open = || {
        let mut options = StoreOptions::new(data.path());
        options.node = NODE.into();
        Store::open(options, two_tables()).unwrap()
    };
    let mut store = open();
    // Hour 0 of both tables in several parts (published early), hour 1 in
    // one; hour 2 is still open at the first pass. The agent stops before
    // its compaction merges any of them.
    for minute in [0, 10, 20] {
        part(&mut store, T0 + minute * 60_000_000, 100);
    }
    part(&mut store, T0 + HOUR_US, 50);
    for minute in [0, 30] {
        gpu_part(&mut store, T0 + minute * 60_000_000, 80);
    }
    gpu_part(&mut store, T0 + 2 * HOUR_US, 40);
    store.close().unwrap();
    assert_eq!(local_files(data.path()).len(), 7);

    let mut u = uploader(data.path(), target.path());
    let now = T0 + 2 * HOUR_US + 10 * 60_000_000;
    pass(&mut u, now);
    assert_eq!(u.stats.files, 6, "every part of the finished hours");
    assert_eq!(u.stats.pending_files, 0);
    assert_eq!(u.stats.pending_open_files, 1, "gpu's hour 2");
    assert_eq!(
        pending_summary(&u.stats),
        "1 file(s) pending: 1 of hours not ended 5 minutes before --now (they go once they have)"
    );
    for table in ["scraped", "gpu"] {
        let (here, there) =
            rows_here_and_there(data.path(), target.path(), table, T0 + 2 * HOUR_US);
        assert_eq!(here, there, "{table}: the finished hours' rows");
    }
    assert_eq!(
        rows_here_and_there(data.path(), target.path(), "scraped", T0 + DAY_US),
        (350, 350)
    );
    for key in objects(target.path()).keys() {
        let table = key.split('/').nth(1).unwrap();
        assert!(
            key.starts_with(&format!(
                "tables/{table}/node={NODE}/date=2025-11-21/{NODE}-"
            )),
            "{key}"
        );
    }
    assert_eq!(
        vtax_store::scan::fleet_nodes(target.path()).unwrap(),
        [NODE]
    );

    // Once the hour ends, its file goes too: every row is remote.
    pass(&mut u, T0 + DAY_US);
    assert_eq!(
        (
            u.stats.files,
            u.stats.pending_files,
            u.stats.pending_open_files
        ),
        (7, 0, 0)
    );
    assert_eq!(pending_summary(&u.stats), "0 file(s) pending");
    for table in ["scraped", "gpu"] {
        let (here, there) = rows_here_and_there(data.path(), target.path(), table, T0 + DAY_US);
        assert_eq!(here, there, "{table}");
    }
    assert_eq!(
        rows_here_and_there(data.path(), target.path(), "gpu", T0 + DAY_US),
        (200, 200)
    );

    // The agent starts again and merges the parts: the merged files' rows
    // are remote already, so they are only recorded.
    let mut store = open();
    store.compact(T0 + DAY_US / 2).unwrap();
    store.close().unwrap();
    let objects_before = objects(target.path());
    pass(&mut u, T0 + DAY_US);
    assert_eq!(u.stats.files, 7, "nothing put twice");
    assert!(u.stats.covered >= 2, "{:?}", u.stats);
    assert_eq!(objects(target.path()), objects_before);
    for table in ["scraped", "gpu"] {
        let (here, there) = rows_here_and_there(data.path(), target.path(), table, T0 + DAY_US);
        assert_eq!(here, there, "{table}");
    }
}

#[test]
fn parts_a_running_store_has_yet_to_merge_are_pending_with_their_reason() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    part(&mut store, T0, 100);
    part(&mut store, T0 + 600_000_000, 100);
    let mut u = uploader(data.path(), target.path());
    let now = T0 + HOUR_US + 10 * 60_000_000;
    pass(&mut u, now);
    assert_eq!(u.stats.files, 0, "the writer merges them first");
    assert_eq!(
        (u.stats.pending_files, u.stats.pending_unmerged_files),
        (2, 2)
    );
    assert!(
        pending_summary(&u.stats)
            .contains("2 parts of finished hours the running agent has yet to merge"),
        "{}",
        pending_summary(&u.stats)
    );
    store.compact(now).unwrap();
    pass(&mut u, now);
    assert_eq!((u.stats.files, u.stats.pending_files), (1, 0));
}

#[test]
fn a_node_of_a_fleet_copy_is_queried_by_its_name() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut options = StoreOptions::new(data.path());
    options.node = NODE.into();
    let mut store = Store::open(options, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    part(&mut store, T0, 100);
    part(&mut store, T0 + HOUR_US, 100);
    store.close().unwrap();
    let mut u = uploader(data.path(), target.path());
    pass(&mut u, T0 + DAY_US);
    let request = vtax_store::ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let rows = |dir: &Path, node: Option<&str>| {
        crate::query::scan_node(dir, node, &request).map(|r| r.rows())
    };
    assert_eq!(rows(target.path(), Some(NODE)).unwrap(), 200);
    assert_eq!(rows(data.path(), Some(NODE)).unwrap(), 200);
    assert_eq!(rows(data.path(), None).unwrap(), 200);
    let err = |dir: &Path, node: Option<&str>| format!("{:#}", rows(dir, node).unwrap_err());
    assert!(
        err(target.path(), None)
            .contains("fleet copy of 1 node(s): choose one with --where node=NAME (gpu-node-17)"),
        "{}",
        err(target.path(), None)
    );
    assert!(
        err(target.path(), Some("gpu_node_17")).contains("has no such node; it has gpu-node-17"),
        "{}",
        err(target.path(), Some("gpu_node_17"))
    );
    assert!(
        err(data.path(), Some("gpu-node-18")).contains("is node gpu-node-17's"),
        "{}",
        err(data.path(), Some("gpu-node-18"))
    );
}

/// A node with no credentials in its environment asks the cloud's instance
/// metadata service; when that fails the log says "no credentials" and where
/// they are set, not only the client's error about a request to
/// 169.254.169.254. Any other failure is left as the client says it.
#[test]
fn a_failure_of_the_instance_metadata_service_says_no_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let remote = Remote::connect(&UploadConfig {
        url: Some(format!("file://{}", dir.path().display())),
        ..UploadConfig::default()
    })
    .unwrap();
    assert_eq!(remote.credentials_from, None, "a mounted path needs none");
    let imds = anyhow::anyhow!(
        "Error performing PUT http://169.254.169.254/latest/api/token: 403 Forbidden"
    )
    .context("put x/tables/scraped/a.parquet");
    assert_eq!(remote.explain(&imds), format!("{imds:#}"));
    let s3 = Remote {
        credentials_from: Some("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ..remote
    };
    let said = s3.explain(&imds);
    assert!(
        said.starts_with("no credentials: the environment sets none (AWS_ACCESS_KEY_ID")
            && said.ends_with(&format!("{imds:#}")),
        "{said}"
    );
    let refused = anyhow::anyhow!("403 Forbidden: AccessDenied");
    assert_eq!(s3.explain(&refused), "403 Forbidden: AccessDenied");
}

/// A local object store whose multipart uploads fail at their second part,
/// and which counts the uploads aborted.
#[derive(Debug)]
struct FailingParts {
    inner: object_store::local::LocalFileSystem,
    aborted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Display for FailingParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FailingParts({})", self.inner)
    }
}

#[derive(Debug)]
struct FailingUpload {
    inner: Box<dyn object_store::MultipartUpload>,
    parts: usize,
    aborted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait::async_trait]
impl object_store::MultipartUpload for FailingUpload {
    fn put_part(&mut self, data: object_store::PutPayload) -> object_store::UploadPart {
        self.parts += 1;
        if self.parts == 2 {
            return Box::pin(async {
                Err(object_store::Error::Generic {
                    store: "FailingParts",
                    source: "503 Slow Down".into(),
                })
            });
        }
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<object_store::PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.aborted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for FailingParts {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        Ok(Box::new(FailingUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            parts: 0,
            aborted: self.aborted.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &object_store::path::Path) -> object_store::Result<()> {
        self.inner.delete(location).await
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
    ) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
    ) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

/// A multipart upload whose part fails is aborted, each pass that tries it:
/// left, its finished parts stay in the bucket, billed and never listed.
#[test]
fn a_failed_multipart_upload_is_aborted() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut store = open_store(data.path());
    part(&mut store, T0, 2000);
    let aborted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let remote = Remote {
        store: std::sync::Arc::new(FailingParts {
            inner: object_store::local::LocalFileSystem::new_with_prefix(target.path()).unwrap(),
            aborted: aborted.clone(),
        }),
        prefix: String::new(),
        url: format!("file://{}", target.path().display()),
        credentials_from: None,
    };
    let mut u = Uploader::open(data.path(), remote).unwrap();
    u.single_put_max_bytes = 1024;
    u.multipart_chunk_bytes = 500;
    for round in 1..=2 {
        pass(&mut u, T0 + DAY_US);
        assert_eq!(u.stats.files, 0);
        assert_eq!(u.stats.failures, round);
        assert_eq!(
            aborted.load(std::sync::atomic::Ordering::SeqCst),
            round as usize
        );
    }
    // Nothing left behind: no object, no staged part.
    assert!(
        objects(target.path()).is_empty(),
        "{:?}",
        objects(target.path()).keys()
    );
}

/// A stopped store of two hours' parts, the first of `first_rows` rows and
/// the second of 100: the first's file, to damage.
fn two_hours(data: &Path, first_rows: i64) -> FileInfo {
    let mut store = open_store(data);
    part(&mut store, T0, first_rows);
    part(&mut store, T0 + HOUR_US, 100);
    drop(store);
    local_files(data)
        .into_iter()
        .find(|f| f.watermarks.contains_key(&(T0 / HOUR_US)))
        .unwrap()
}

/// A file whose footer does not read is never put (no reader could read it),
/// but it is counted pending with its reason, not left out unsaid.
#[test]
fn a_file_that_does_not_read_is_pending_with_its_reason() {
    let data = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let damaged = two_hours(data.path(), 100);
    let bytes = std::fs::read(&damaged.path).unwrap();
    std::fs::write(&damaged.path, &bytes[..bytes.len() - 9]).unwrap();
    // Written an hour ago: the oldest pending file's age counts it.
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&damaged.path)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();

    let mut u = uploader(data.path(), target.path());
    let now = T0 + 2 * HOUR_US + 10 * 60_000_000;
    pass(&mut u, now);
    assert_eq!(u.stats.files, 1, "the other hour goes");
    assert_eq!(objects(target.path()).len(), 1);
    assert_eq!(
        (u.stats.pending_files, u.stats.pending_unreadable_files),
        (1, 1)
    );
    assert!(u.stats.oldest_pending_age_seconds >= 3600.0);
    assert!(
        pending_summary(&u.stats).contains("1 that do not read"),
        "{}",
        pending_summary(&u.stats)
    );
    // Quarantined or mended, it is no longer pending.
    std::fs::remove_file(&damaged.path).unwrap();
    pass(&mut u, now);
    assert_eq!(
        (u.stats.pending_files, u.stats.pending_unreadable_files),
        (0, 0)
    );
}

/// A file whose footer reads but whose pages changed on this disk (a flipped
/// bit) is not put, whole or in parts: the fleet's copy would hold wrong
/// values where the node's `vtax verify` finds damage. It is pending with its
/// reason, and the files after it still go.
#[test]
fn a_file_whose_pages_changed_is_not_uploaded() {
    for single_put_max_bytes in [u64::MAX, 1024] {
        let data = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let damaged = two_hours(data.path(), 2000);
        let mut bytes = std::fs::read(&damaged.path).unwrap();
        bytes[40] ^= 0x10;
        std::fs::write(&damaged.path, &bytes).unwrap();
        assert!(vtax_store::files::read_info(&damaged.path, "scraped", damaged.day).is_ok());

        let mut u = uploader(data.path(), target.path());
        u.single_put_max_bytes = single_put_max_bytes;
        u.multipart_chunk_bytes = 500;
        pass(&mut u, T0 + 2 * HOUR_US + 10 * 60_000_000);
        let remote = objects(target.path());
        assert_eq!(remote.len(), 1, "{:?}", remote.keys());
        assert!(
            !remote.values().any(|object| *object == bytes),
            "the damaged file went"
        );
        assert_eq!((u.stats.files, u.stats.failures), (1, 0));
        assert_eq!(
            (u.stats.pending_files, u.stats.pending_unreadable_files),
            (1, 1)
        );
    }
}
