//! The `store` table end to end: an agent whose data directory fills up
//! says so on `/metrics` (write and disk-full errors, no space left), keeps
//! running and taking rows, and once space returns writes them all: the
//! rows it made each second while the disk was full are in the store after
//! a clean stop.
//!
//! Mounting a tmpfs needs root (CAP_SYS_ADMIN); see `vtax_tests::tmpfs`
//! for `VTAX_SKIP_TMPFS_TEST=1`.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Agent;
use vtax_tests::tmpfs::Tmpfs;

/// The value of an unlabelled sample in a `/metrics` body.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// Waits until the agent's `/metrics` satisfies `check`; returns that body.
fn wait_for(agent: &Agent, what: &str, mut check: impl FnMut(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = agent.get("/metrics", &[]).text();
        if check(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 30 s\n{body}\nlog:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An agent with `config` and `data` on the `baremetal-node` fixture tree.
fn start_on_fixture(config: &Path, data: &Path) -> Agent {
    let fixture = common::fixtures().join("baremetal-node");
    Agent::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--path.procfs",
        fixture.join("proc").to_str().unwrap(),
        "--path.sysfs",
        fixture.join("sys").to_str().unwrap(),
    ])
}

/// Writes zeros to `path` until the filesystem refuses more.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            break;
        }
    }
    // Whatever is left is smaller than a chunk; take it too.
    let small = [0u8; 512];
    while file.write_all(&small).is_ok() {}
}

/// How long `a_full_data_disk_is_reported_on_metrics_and_no_row_is_lost`
/// keeps the disk full, counting the log lines.
const FULL_SPELL: Duration = Duration::from_secs(12);

#[test]
fn a_full_data_disk_is_reported_on_metrics_and_no_row_is_lost() {
    let Some(tmpfs) = Tmpfs::mount_or_skip("16m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vtax.toml");
    std::fs::write(&config, "[store]\nretention_max_bytes = 8388608\n").unwrap();
    let data = tmpfs.path().join("data");
    let agent = start_on_fixture(&config, &data);
    let body = wait_for(&agent, "the store's first syncs", |b| {
        sample(b, "vtax_store_wal_syncs_total").is_some_and(|n| n >= 2.0)
    });
    assert_eq!(sample(&body, "vtax_store_write_errors_total"), Some(0.0));
    assert_eq!(
        sample(&body, "vtax_store_retention_max_bytes"),
        Some(8388608.0)
    );
    let size = sample(&body, "vtax_store_filesystem_size_bytes").unwrap();
    assert_eq!(size, (16 << 20) as f64, "the tmpfs's size");

    let ballast = tmpfs.path().join("ballast");
    fill(&ballast);
    let full = wait_for(&agent, "disk-full errors", |b| {
        sample(b, "vtax_store_disk_full_errors_total").is_some_and(|n| n > 0.0)
    });
    assert!(sample(&full, "vtax_store_filesystem_avail_bytes").unwrap() < 64.0 * 1024.0);
    let errors = sample(&full, "vtax_store_write_errors_total").unwrap();
    assert!(errors >= 1.0, "{full}");
    let appended = sample(&full, "vtax_store_rows_appended_total").unwrap();
    // Full for a few more seconds: errors go on, rows are still taken, none refused.
    let later = wait_for(&agent, "more rows while full", |b| {
        sample(b, "vtax_store_rows_appended_total").is_some_and(|n| n > appended + 100.0)
            && sample(b, "vtax_store_write_errors_total").is_some_and(|n| n >= errors + 3.0)
    });
    assert_eq!(sample(&later, "vtax_store_rows_refused_total"), Some(0.0));
    assert!(
        agent.log().contains("No space left on device"),
        "the log says why:\n{}",
        agent.log()
    );
    // Full for a fixed spell: the errors repeat every second, their lines
    // do not (one per kind a minute, `vtax_store::log_limit`).
    std::thread::sleep(FULL_SPELL);
    let log = agent.log();
    let failure_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("WARN"))
        .collect();
    let spell = sample(
        &agent.get("/metrics", &[]).text(),
        "vtax_store_write_errors_total",
    )
    .unwrap();
    eprintln!(
        "{} error and warning lines for {spell} write errors while full:\n{}",
        failure_lines.len(),
        failure_lines.join("\n")
    );
    let maintenance = failure_lines
        .iter()
        .filter(|l| l.contains("Store maintenance failed"))
        .count();
    assert_eq!(
        maintenance, 1,
        "one line for a disk that stays full:\n{log}"
    );
    assert!(
        spell >= errors + 8.0,
        "the errors went on: {errors} then {spell}"
    );

    // A little space appears, less than the rows held since the disk
    // filled: the WAL writes what fits at once, though still full.
    let wal_bytes = sample(&later, "vtax_store_wal_bytes").unwrap();
    let ballast_bytes = std::fs::metadata(&ballast).unwrap().len();
    let freed_at = Instant::now();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ballast)
        .unwrap()
        .set_len(ballast_bytes - (16 << 10))
        .unwrap();
    let resumed = wait_for(
        &agent,
        "WAL frames written once a little space appeared",
        |b| sample(b, "vtax_store_wal_bytes").is_some_and(|n| n > wal_bytes),
    );
    eprintln!(
        "the WAL resumed {:.2} s after 16 KiB was freed: {wal_bytes} then {} bytes",
        freed_at.elapsed().as_secs_f64(),
        sample(&resumed, "vtax_store_wal_bytes").unwrap()
    );

    std::fs::remove_file(&ballast).unwrap();
    let errors = sample(&resumed, "vtax_store_write_errors_total").unwrap();
    let syncs = sample(&resumed, "vtax_store_wal_syncs_total").unwrap();
    let recovered = wait_for(&agent, "syncs again once space returned", |b| {
        sample(b, "vtax_store_wal_syncs_total").is_some_and(|n| n >= syncs + 2.0)
    });
    let errors_after = sample(&recovered, "vtax_store_write_errors_total").unwrap();
    assert!(
        errors_after <= errors + 1.0,
        "errors stop once space returned: {errors} then {errors_after}"
    );
    assert!(agent.stop(), "a clean stop publishes every held row");

    // The store's own rows, one a second, run through the full spell
    // without a gap: the rows held in memory while the disk was full were
    // written once it had room.
    let rows = common::query_rows(&data, "store");
    let while_full = rows
        .iter()
        .filter(|r| {
            r["filesystem_avail_bytes"]
                .as_f64()
                .is_some_and(|n| n < 64.0 * 1024.0)
        })
        .count();
    assert!(while_full >= 3, "rows made while full are stored: {rows:?}");
    eprintln!(
        "{} store rows, {while_full} made while the disk was full",
        rows.len()
    );
    assert_a_row_every_second(&rows, "");
}

/// Asserts that no two of the `store` table's rows (one a second from the
/// main loop) are two seconds or more apart; `context` goes in the message.
fn assert_a_row_every_second(rows: &[serde_json::Value], context: &str) {
    let times: Vec<f64> = rows
        .iter()
        .map(|r| seconds(r["time"].as_str().unwrap()))
        .collect();
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] < 2.0,
            "a gap in the store's rows from {} to {}\n{context}",
            pair[0],
            pair[1]
        );
    }
}

/// Unix seconds of an RFC 3339 time as `vtax query` prints it.
fn seconds(rfc3339: &str) -> f64 {
    humantime::parse_rfc3339(rfc3339)
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Days since the Unix epoch, now.
fn today() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_micros() as i64 / vtax_store::DAY_US
}

/// The `scraped` table's live files of `day`.
fn scraped_files(data: &Path, day: i64) -> Vec<vtax_store::files::FileInfo> {
    vtax_store::files::live_files(data)
        .unwrap()
        .into_iter()
        .filter(|f| f.table == "scraped" && f.day == day)
        .collect()
}

/// Rows a seeded hour holds: a debug build merges a day of them in about a
/// second (1.0 s on a 2-vCPU VM), four turns of the main loop. That is too
/// short for the gap check below to catch a merge on the main loop every time;
/// the store's `Compactor` tests show where the merge runs.
const SEEDED_ROWS_PER_HOUR: i64 = 60_000;

/// Writes `hours` hour files of `rows_per_hour` rows of the `scraped` table
/// from `day_start_us`, 40 series, as an agent's store of an earlier run would
/// hold them. Returns the rows written.
fn seed_hours(data: &Path, day_start_us: i64, hours: i64, rows_per_hour: i64) -> usize {
    let mut options = vtax_store::StoreOptions::new(data);
    options.node = "seeded".into();
    let catalog = vtax_store::Catalog::new(vtax_store::tables::BUILTIN).unwrap();
    let mut store = vtax_store::Store::open(options, catalog).unwrap();
    let mut rows = 0;
    for hour in 0..hours {
        let mut b = vtax_store::BatchBuilder::new(&vtax_store::tables::SCRAPED);
        for i in 0..rows_per_hour {
            let t = day_start_us + hour * vtax_store::HOUR_US + (i / 40) * 1_000_000;
            let labels = format!("series=\"{}\"", i % 40);
            let row = vtax_store::tables::ScrapedRow {
                target: "",
                metric: "seeded_metric",
                labels: &labels,
                value: Some((i * 7919 % 1000) as f64 / 3.0),
            };
            b.push_row(t, &row).unwrap();
            rows += 1;
        }
        store.append(&b.finish()).unwrap();
        store.flush().unwrap();
    }
    store.close().unwrap();
    rows
}

#[test]
fn the_agent_merges_a_finished_day_beside_its_writes_and_applies_retention() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let today = today();
    let finished_day = today - 2;
    let expired_day = today - 10;
    let seeded = seed_hours(
        &data,
        finished_day * vtax_store::DAY_US,
        24,
        SEEDED_ROWS_PER_HOUR,
    );
    seed_hours(
        &data,
        expired_day * vtax_store::DAY_US,
        1,
        SEEDED_ROWS_PER_HOUR,
    );
    let files_of = |day: i64| scraped_files(&data, day);
    assert_eq!(files_of(finished_day).len(), 24);

    let config = dir.path().join("vtax.toml");
    std::fs::write(
        &config,
        "[store]\ncompact_interval_secs = 3\nretention_max_age_days = 5\n",
    )
    .unwrap();
    let agent = start_on_fixture(&config, &data);
    let deadline = Instant::now() + Duration::from_secs(300);
    // Done when one file holds the whole day: while a merge commits, its
    // output is pending (not live) as its inputs go, so the live count
    // falls to one or none before the round ends.
    let merged_into_one = |day: i64, rows: usize| matches!(files_of(day).as_slice(), [only] if only.rows as usize == rows);
    while !merged_into_one(finished_day, seeded) || !files_of(expired_day).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the day was not merged or the old day kept:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A few more of the store's rows after the merge.
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.log();
    assert!(agent.stop(), "a clean stop");
    let merged = files_of(finished_day);
    assert_eq!(merged[0].watermarks.len(), 24, "one file of 24 hours");
    assert_eq!(merged[0].rows as usize, seeded);
    let done = log
        .lines()
        .find(|l| l.contains("Compaction and retention done."))
        .unwrap_or_else(|| panic!("the day's merge is logged:\n{log}"));
    assert!(done.contains("files_retained_away=1"), "{done}");
    eprintln!("{done}");

    // The main loop wrote the store's row every second while the day merged
    // on the compaction thread.
    let rows = common::query_rows(&data, "store");
    assert!(rows.len() >= 5, "{rows:?}");
    assert_a_row_every_second(&rows, &log);
}

/// Whether a merge's output is being written in `day`'s partition of the
/// `scraped` table: the store writes every file as a `.tmp` beside it first.
fn merge_in_flight(data: &Path, day: i64) -> bool {
    let dir = vtax_store::files::partition_dir(data, "scraped", day);
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
    })
}

/// Hours of the day the stop test seeds, and their rows: 1.2M rows, which the
/// store writes as 9 files and a debug build merges in about 2.3 s (2-vCPU VM),
/// so a stop that waited for the merge's round would show.
const STOP_TEST_HOURS: i64 = 3;
const STOP_TEST_ROWS_PER_HOUR: i64 = 400_000;

#[test]
fn sigterm_during_a_day_merge_stops_it_promptly_and_loses_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let finished_day = today() - 2;
    let seeded = seed_hours(
        &data,
        finished_day * vtax_store::DAY_US,
        STOP_TEST_HOURS,
        STOP_TEST_ROWS_PER_HOUR,
    ) as u64;
    let day_files_and_rows = || {
        let files = scraped_files(&data, finished_day);
        (files.len(), files.iter().map(|f| f.rows).sum::<u64>())
    };
    // The store writes an hour this large as several files.
    let (seeded_files, rows) = day_files_and_rows();
    assert_eq!(rows, seeded);
    assert!(seeded_files >= STOP_TEST_HOURS as usize);

    let config = dir.path().join("vtax.toml");
    std::fs::write(&config, "[store]\ncompact_interval_secs = 2\n").unwrap();
    let agent = start_on_fixture(&config, &data);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !merge_in_flight(&data, finished_day) {
        assert!(
            Instant::now() < deadline,
            "no merge of the seeded day began:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let asked = Instant::now();
    let log_before_stop = agent.log();
    assert!(agent.stop(), "a clean stop during the merge");
    let stop_took = asked.elapsed();

    // The merge was given up mid-round: its inputs are all still there, no
    // temp file is left, and the day holds every row.
    assert!(!merge_in_flight(&data, finished_day), "a .tmp was left");
    assert_eq!(
        day_files_and_rows(),
        (seeded_files, seeded),
        "the round was finished, not stopped"
    );
    let own_rows = common::query_rows(&data, "store");
    assert!(!own_rows.is_empty(), "the agent's own rows were flushed");
    assert_a_row_every_second(&own_rows, &log_before_stop);

    // A second run merges the day, which takes longer than the stop did.
    let again = start_on_fixture(&config, &data);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !merge_in_flight(&data, finished_day) {
        assert!(Instant::now() < deadline, "no merge:\n{}", again.log());
        std::thread::sleep(Duration::from_millis(2));
    }
    let began = Instant::now();
    // Done when one file holds every row: the live count alone falls to one
    // while a round commits (its output pending as its inputs go), with
    // another round still to come.
    while day_files_and_rows() != (1, seeded) {
        assert!(
            Instant::now() < deadline,
            "the interrupted day was not merged on the next run:\n{}",
            again.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let merge_took = began.elapsed();
    assert!(again.stop(), "a clean stop");
    assert_eq!(day_files_and_rows(), (1, seeded));
    eprintln!("stop took {stop_took:?}, the whole merge {merge_took:?}");
    assert!(
        stop_took < merge_took,
        "stopping ({stop_took:?}) took as long as merging ({merge_took:?})"
    );
}
