//! The `vtax` binary end to end: import, query, run, and third-party readers.

mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, TimestampMicrosecondType};
use vtax_store::scan::scan_dir;
use vtax_store::{tables, Catalog, ScanRequest};

use common::{stdout_of, VTAX};

/// 2025-11-21T23:00:00Z: the samples straddle midnight, so two date partitions.
const START_MS: i64 = 1_763_766_000_000;

/// Values whose bits are easy to lose: signed zero, subnormals, extremes, integers
/// beyond 2^53, and decimals that have no exact binary form.
fn awkward(i: u64) -> f64 {
    match i % 9 {
        0 => -0.0,
        1 => f64::from_bits(1),
        2 => f64::MAX,
        3 => f64::MIN_POSITIVE,
        4 => 9_007_199_254_740_993.0,
        5 => 0.1 + i as f64 * 1e-7,
        6 => -1.0e-300 * i as f64,
        7 => f64::INFINITY,
        _ => i as f64 * 1234.5678,
    }
}

/// Writes an OpenMetrics file and the expected rows (time_us, metric, labels, bits).
fn write_input(path: &Path, samples_per_series: i64) -> BTreeSet<(i64, String, String, u64)> {
    let mut text = String::new();
    let mut expected = BTreeSet::new();
    text.push_str("# TYPE gpu_power_watts gauge\n");
    for gpu in 0..4u64 {
        for k in 0..samples_per_series {
            let ms = START_MS + k * 15_000;
            let v = awkward(gpu * 1000 + k as u64);
            // Labels out of order on purpose: stored canonically.
            let _ = writeln!(
                text,
                "gpu_power_watts{{uuid=\"GPU-{gpu}\",gpu=\"{gpu}\"}} {v:?} {}.{:03}",
                ms / 1000,
                ms % 1000
            );
            expected.insert((
                ms * 1000,
                "gpu_power_watts".to_string(),
                format!("gpu=\"{gpu}\",uuid=\"GPU-{gpu}\""),
                v.to_bits(),
            ));
        }
    }
    text.push_str("# TYPE stale gauge\n");
    let _ = writeln!(text, "stale NaN {}", START_MS / 1000);
    text.push_str("# EOF\n");
    std::fs::write(path, text).unwrap();
    expected
}

fn stored_rows(data_dir: &Path) -> BTreeSet<(i64, String, String, u64)> {
    let catalog = Catalog::new(tables::BUILTIN).unwrap();
    let request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let result = scan_dir(data_dir, &catalog, &request).unwrap();
    let mut rows = BTreeSet::new();
    for batch in &result.batches {
        let time = batch.column(0).as_primitive::<TimestampMicrosecondType>();
        let metric = batch.column(2).as_dictionary::<Int32Type>();
        let labels = batch.column(3).as_dictionary::<Int32Type>();
        let value = batch.column(4).as_primitive::<Float64Type>();
        let metric_values = metric.values().as_string::<i32>();
        let label_values = labels.values().as_string::<i32>();
        for i in 0..batch.num_rows() {
            rows.insert((
                time.value(i),
                metric_values
                    .value(metric.keys().value(i) as usize)
                    .to_string(),
                label_values
                    .value(labels.keys().value(i) as usize)
                    .to_string(),
                value.value(i).to_bits(),
            ));
        }
    }
    rows
}

#[test]
fn import_is_lossless_and_duckdb_pyarrow_polars_read_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.om");
    let data = dir.path().join("data");
    let mut expected = write_input(&input, 500);
    assert!(import(&data, &[&input]).status.success());

    let stored = stored_rows(&data);
    // Prometheus's NaN has one bit pattern; it must survive too.
    let nan = (
        START_MS / 1000 * 1_000_000,
        "stale".to_string(),
        String::new(),
        0x7ff8_0000_0000_0001,
    );
    assert!(stored.contains(&nan), "the stale marker NaN keeps its bits");
    expected.insert(nan.clone());
    assert_eq!(stored, expected);

    let partitions: Vec<_> = std::fs::read_dir(data.join("tables/scraped"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(partitions, ["date=2025-11-21", "date=2025-11-22"]);

    // The Python readers compare everything but the NaN row: their NaN handling is
    // theirs, not ours.
    expected.remove(&nan);
    let mut tsv = String::new();
    for (t, metric, labels, bits) in &expected {
        let _ = writeln!(tsv, "{t}\t{metric}\t{labels}\t{}", hex_le(*bits));
    }
    let expected_path = dir.path().join("expected.tsv");
    std::fs::write(&expected_path, tsv).unwrap();
    // The readers get their own store, imported without the NaN sample.
    let readers_data = dir.path().join("readers");
    let input_no_nan = dir.path().join("input-no-nan.om");
    let text = std::fs::read_to_string(&input).unwrap();
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("stale") && !l.contains("TYPE stale"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&input_no_nan, without).unwrap();
    assert!(import(&readers_data, &[&input_no_nan]).status.success());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/check_readers.py"
    );
    // The README's test command installs duckdb, pyarrow and polars.
    let stdout = stdout_of(
        Command::new("python3")
            .arg(script)
            .arg(&readers_data)
            .arg(&expected_path),
    );
    for reader in ["duckdb", "pyarrow", "polars"] {
        assert!(
            stdout.contains(&format!("{reader}: 2000 rows match bit for bit")),
            "{stdout}"
        );
    }
}

/// Runs `vtax import --data-dir DATA FILES...`.
/// A store in `dir/data` imported from `samples_per_series` samples of
/// [`write_input`]'s series.
fn imported_store(dir: &Path, samples_per_series: i64) -> std::path::PathBuf {
    let input = dir.join("in.om");
    write_input(&input, samples_per_series);
    let data = dir.join("data");
    assert!(import(&data, &[&input]).status.success());
    data
}

fn import(data: &Path, files: &[&Path]) -> std::process::Output {
    Command::new(VTAX)
        .args(["import", "--data-dir"])
        .arg(data)
        .args(files)
        .output()
        .unwrap()
}

/// A series holds one value per instant: a sample that repeats a series
/// and time, in one file or an earlier import, is left out (the first
/// kept) and said, not counted as imported; a pipe, which an import could
/// read only once, is refused before anything is written.
#[test]
fn an_import_says_what_it_left_out_and_refuses_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let a = dir.path().join("a.prom");
    let b = dir.path().join("b.prom");
    std::fs::write(
        &a,
        "m 1 1796600000000\nk 5 1796600000000\nm 2 1796600000000\n",
    )
    .unwrap();
    std::fs::write(&b, "k 7 1796600000000\n").unwrap();
    let out = import(&data, &[&a]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Imported 2 samples"), "{stderr}");
    assert!(
        stderr.contains("1 of the 3 samples read repeated a series and time"),
        "{stderr}"
    );
    let out = import(&data, &[&b]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Read 1 samples") && stderr.contains("went from 2 to 2 rows"),
        "{stderr}"
    );
    assert!(stderr.contains("1 rows that repeated"), "{stderr}");
    assert_eq!(scraped_count(&data), 2);

    let out = Command::new(VTAX)
        .args(["import", "--data-dir"])
        .arg(dir.path().join("piped"))
        .arg("/dev/stdin")
        .stdin(std::fs::File::open(&a).unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A file given as stdin is a regular file; a pipe is not.
    assert!(out.status.success(), "{stderr}");
    let mut child = Command::new(VTAX)
        .args(["import", "--data-dir"])
        .arg(dir.path().join("piped2"))
        .arg("/dev/stdin")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("not a regular file (a pipe or a device)"),
        "{stderr}"
    );
    assert!(!dir.path().join("piped2").exists(), "nothing written");
}

/// Files as exporters and build systems leave them: a `.prom` file (the
/// textfile collector's) with a `# UNIT` comment is Prometheus text, as
/// Prometheus reads it; a plain comment with bytes that are not UTF-8 is
/// skipped, as Prometheus and the scrape skip it; and an untimestamped
/// OpenMetrics file whose modification time is in 1970 (a Nix store's)
/// is refused rather than filed under 1970.
#[test]
fn an_import_reads_files_as_prometheus_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let unit = dir.path().join("unit.prom");
    std::fs::write(&unit, "# UNIT m seconds\nm 1 1796600000000\n").unwrap();
    let comment = dir.path().join("comment.prom");
    let mut text = b"# made by \xff\xfe\n".to_vec();
    text.extend_from_slice(b"k 2 1796600000000\n");
    std::fs::write(&comment, text).unwrap();
    // `# EOF` in a `.prom` file is a comment, timestamps or not.
    let eof = dir.path().join("eof.prom");
    std::fs::write(&eof, "e 3 1796600000000\n# EOF\ne2 4 1796600000000\n").unwrap();
    let out = import(&data, &[&unit, &comment, &eof]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Imported 4 samples"), "{stderr}");

    let nix = dir.path().join("nix.om");
    std::fs::write(&nix, "a 1\n# EOF\n").unwrap();
    let touched = Command::new("touch")
        .args(["-d", "@1"])
        .arg(&nix)
        .status()
        .unwrap();
    assert!(touched.success());
    let out = import(&data, &[&nix]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no timestamp, and the file's modification time"),
        "{stderr}"
    );
    assert_eq!(scraped_count(&data), 4);
}

fn hex_le(bits: u64) -> String {
    bits.to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every row of the store's `scraped` table, read as a reader beside it.
fn scraped_count(data: &Path) -> usize {
    let request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let catalog = Catalog::new(&[&tables::SCRAPED]).unwrap();
    scan_dir(data, &catalog, &request).unwrap().rows()
}

/// An import killed part-way (and one killed after it finished), run again,
/// leaves each sample once: the store merges equal rows into one, and the
/// import merges the hours it wrote. Samples without a timestamp get their
/// file's modification time, the same at every run.
#[test]
fn an_import_run_again_after_a_kill_adds_each_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("history.prom");
    let untimed = dir.path().join("untimed.prom");
    let mut text = String::new();
    // 4 series, one sample a second for 30 hours of 2025-11-21 and -22.
    let series = 4;
    let seconds = 30 * 3600;
    for t in 0..seconds {
        for s in 0..series {
            let ms = 1_763_683_200_000_i64 + t * 1000;
            writeln!(
                text,
                "node_cpu_seconds_total{{cpu=\"{s}\"}} {}.5 {ms}",
                t + s
            )
            .unwrap();
        }
    }
    std::fs::write(&input, &text).unwrap();
    std::fs::write(&untimed, "up 1\nvtax_demo_bytes 42\n").unwrap();
    let expected = (series * seconds) as usize + 2;
    let data = dir.path().join("data");
    for kill_after_ms in [300, 900, 60_000] {
        let mut child = Command::new(VTAX)
            .args(["import", "--no-progress", "--data-dir"])
            .arg(&data)
            .args([&input, &untimed])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none()
            && started.elapsed() < Duration::from_millis(kill_after_ms)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        child.wait().unwrap();
    }
    for _ in 0..2 {
        let out = import(&data, &[&input, &untimed]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(scraped_count(&data), expected);
    }
}

/// A sample without a timestamp takes its file's modification time; a file
/// dated in the future (a clock set wrong where it was written) is refused
/// as a timestamp more than a day ahead is, saying where the time came from.
#[test]
fn a_file_dated_ahead_gives_its_untimed_samples_no_time() {
    let dir = tempfile::tempdir().unwrap();
    let untimed = dir.path().join("untimed.prom");
    std::fs::write(&untimed, "up 1\n").unwrap();
    let in_2100 = std::time::UNIX_EPOCH + Duration::from_secs(4_102_444_800);
    std::fs::File::options()
        .write(true)
        .open(&untimed)
        .unwrap()
        .set_modified(in_2100)
        .unwrap();
    let data = dir.path().join("data");
    let out = import(&data, &[&untimed]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "untimed.prom:line 1: it has no timestamp, and the file's modification time, which \
             it would take, is more than a day ahead of now (the year 2100)"
        ),
        "{stderr}"
    );
    assert!(!data.join("tables").exists(), "nothing written");
}

/// Prometheus text takes milliseconds; Unix seconds written there (the most
/// common slip) read as January 1970, where no query's default range looks.
/// The import refuses the file, naming the line and the likely slip.
#[test]
fn unix_seconds_in_prometheus_text_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("seconds.prom");
    std::fs::write(&file, "m 1 1796464800000\nm 2 1796464800\n").unwrap();
    let data = dir.path().join("data");
    let out = import(&data, &[&file]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("seconds.prom:line 2: its timestamp is in 1970 (its day 21)")
            && stderr.contains("Unix seconds written for them land in the first months of 1970"),
        "{stderr}"
    );
    assert!(!data.join("tables").exists(), "nothing written");
}

/// Two files of one import that share samples (two dumps of one exporter
/// that overlap, or one file given twice) leave each sample once, as two
/// imports of them do: a series holds one value per instant, the first
/// given. Before, an hour written in one part kept both copies.
#[test]
fn one_import_of_overlapping_files_keeps_each_instant_once() {
    let dir = tempfile::tempdir().unwrap();
    let (early, late) = (dir.path().join("early.prom"), dir.path().join("late.prom"));
    std::fs::write(
        &early,
        "m{a=\"1\"} 1 1763766000000\nm{a=\"1\"} 2 1763766001000\n",
    )
    .unwrap();
    // Overlaps at 1763766001: the same instant with another value.
    std::fs::write(
        &late,
        "m{a=\"1\"} 20 1763766001000\nm{a=\"1\"} 3 1763766002000\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let out = import(&data, &[&early, &early, &late]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = common::vtax_stdout([
        "query",
        "--data-dir",
        data.to_str().unwrap(),
        "scraped",
        "--format",
        "csv",
    ]);
    let values: Vec<&str> = stdout
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap())
        .collect();
    assert_eq!(values, ["1.0", "2.0", "3.0"], "{stdout}");
}

/// `vtax query` without a table lists the tables; a range that holds
/// nothing and a tag the table lacks are errors that say what would do.
#[test]
fn query_lists_tables_and_refuses_empty_ranges_and_unknown_tags() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("up.prom");
    std::fs::write(&input, "up 1 1763766000000\n").unwrap();
    let data = dir.path().join("data");
    assert!(import(&data, &[&input]).status.success());
    let run = |args: &[&str]| {
        Command::new(VTAX)
            .arg("query")
            .args(args)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    for table in ["scraped", "cpu", "gpu", "jitter", "neighbor_events"] {
        assert!(
            listed.lines().any(|l| l.starts_with(&format!("{table} "))),
            "{table} listed:\n{listed}"
        );
    }
    let out = run(&["scraped", "--since", "1m", "--until", "2h"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--since 1m is not before --until 2h"),
        "{stderr}"
    );
    let out = run(&["scraped", "--where", "host=a"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has no tag \"host\" (tags: target, metric, labels)"),
        "{stderr}"
    );
}

/// Beside a running agent, an import is refused (the store has one
/// writer) and the error says what to do instead.
#[test]
fn an_import_beside_a_running_agent_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = common::Agent::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--no-collector.cgroups",
        "--no-collector.jitter",
    ]);
    let input = dir.path().join("up.prom");
    std::fs::write(&input, "up 1 1763766000000\n").unwrap();
    let out = import(&data, &[&input]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("one writer") && stderr.contains("Stop the agent"),
        "{stderr}"
    );
    assert!(agent.stop());
}

#[test]
fn malformed_input_names_the_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.prom");
    let bad = dir.path().join("bad.prom");
    std::fs::write(&good, "up 1 1763766000000\n").unwrap();
    std::fs::write(&bad, "up 1 1763766000000\nup{job=\"a\" 2 1763766001000\n").unwrap();
    let data = dir.path().join("data");
    let out = import(&data, &[&good, &bad]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.prom:line 2"), "{stderr}");
    assert!(
        !data.join("tables").exists(),
        "nothing written, not even the good file"
    );
}

/// A line with no end in sight (a binary file, a label value made to
/// exhaust memory) is refused at the bound, not held whole in memory.
#[test]
fn a_line_past_the_bound_is_refused_with_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("long.prom");
    let mut text = String::from("up 1 1763766000000\nup{job=\"");
    text.push_str(&"x".repeat(17 << 20));
    text.push_str("\"} 1 1763766001000\n");
    std::fs::write(&long, text).unwrap();
    let data = dir.path().join("data");
    let out = import(&data, &[&long]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("long.prom:line 2: longer than 16 MiB"),
        "{stderr}"
    );
    assert!(!data.join("tables").exists(), "nothing written");
}

#[test]
fn query_filters_by_tag_and_time_and_prints_csv() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.om");
    let data = dir.path().join("data");
    write_input(&input, 20);
    assert!(import(&data, &[&input]).status.success());
    let stdout = common::vtax_stdout([
        "query",
        "--data-dir",
        data.to_str().unwrap(),
        "scraped",
        "--where",
        "labels=gpu=\"2\",uuid=\"GPU-2\"",
        "--since",
        "2025-11-21T23:01:00Z",
        "--until",
        "2025-11-21T23:02:00Z",
        "--format",
        "csv",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "time,target,metric,labels,value");
    // One sample every 15 s within [23:01, 23:02): 4 rows.
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(
        lines[1].starts_with("2025-11-21T23:01:00Z,,gpu_power_watts,"),
        "{stdout}"
    );
}

#[test]
fn run_samples_cpus_and_publishes_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let child = Command::new(VTAX)
        .args(["run", "--web.listen-address", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(VTAX)
        .args(["query", "--data-dir"])
        .arg(&data)
        .args(["cpu", "--fields", "steal_seconds", "--format", "csv"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        stdout.lines().count() > 2 * cpus,
        "at least two ticks per CPU:\n{stdout}"
    );
    let partitions =
        std::fs::read_dir(data.join("tables/cpu")).expect("published to Parquet on SIGTERM");
    assert!(partitions.count() >= 1);
}

/// A query that matches nothing says so and names the columns, where
/// arrow's table of no batches printed `++` twice.
#[test]
fn a_table_query_with_no_rows_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = imported_store(dir.path(), 5);
    for args in [&["scraped", "--where", "metric=none_such"][..], &["cpu"]] {
        let stdout = stdout_of(
            Command::new(VTAX)
                .args(["query", "--data-dir"])
                .arg(&data)
                .args(args),
        );
        assert!(
            stdout.starts_with("No rows. Columns: time, "),
            "{args:?}: {stdout}"
        );
        assert!(!stdout.contains("++"), "{stdout}");
    }
}

/// Runs `vtax verify` on `data`: whether it succeeded, and what it printed.
fn verify_store(data: &Path, quarantine: bool) -> (bool, String) {
    let mut command = Command::new(VTAX);
    command.args(["verify", "--data-dir"]).arg(data);
    if quarantine {
        command.arg("--quarantine");
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A directory under a table whose name is no partition (a copy under
/// `date=20251121`, a date that does not exist) holds rows that vtax never
/// reads while a glob of the table reads them all: `vtax verify` names it and
/// fails, where it once called the store sound.
#[test]
fn verify_names_a_directory_of_parquet_files_that_is_no_partition() {
    let dir = tempfile::tempdir().unwrap();
    let data = imported_store(dir.path(), 50);
    let (ok, stderr) = verify_store(&data, false);
    assert!(ok, "{stderr}");
    let file = &vtax_store::files::live_files(&data).unwrap()[0];
    let table = file.path.parent().unwrap().parent().unwrap();
    for name in ["date=20251121", "date=2025-02-30"] {
        let foreign = table.join(name);
        std::fs::create_dir(&foreign).unwrap();
        std::fs::copy(&file.path, foreign.join(file.name())).unwrap();
        let (ok, stderr) = verify_store(&data, false);
        assert!(!ok, "{stderr}");
        assert!(
            stderr.contains(&format!(
                "not a partition: {} holds 1 Parquet file(s)",
                foreign.display()
            )),
            "{stderr}"
        );
        std::fs::remove_dir_all(&foreign).unwrap();
    }
    // Without Parquet files it is nobody's data: passed over.
    std::fs::create_dir(table.join("notes")).unwrap();
    std::fs::write(table.join("notes/README"), "x").unwrap();
    let (ok, stderr) = verify_store(&data, false);
    assert!(ok, "{stderr}");
}

/// A FIFO under a WAL segment's name is named once a minute, not at every
/// listing of the log: a report listed it a dozen times, and a running agent
/// at every checkpoint.
#[test]
fn an_entry_under_a_segment_name_that_is_no_file_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = imported_store(dir.path(), 5);
    std::fs::create_dir_all(data.join("wal")).unwrap();
    let fifo = data.join("wal/00000000000000099999.wal");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for command in [&["compact"][..], &["report", "--output"]] {
        let mut run = Command::new(VTAX);
        run.args(command);
        if command[0] == "report" {
            run.arg(dir.path().join("report.html"));
        }
        let out = run.arg("--data-dir").arg(&data).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(
            stderr
                .matches("Not a regular file under a log segment")
                .count(),
            1,
            "{command:?}: {stderr}"
        );
    }
}

/// `--output` naming something that is no regular file (`/dev/null`, a FIFO)
/// is written into, as a shell's `>` writes; renaming the page over it, as
/// root, left `/dev/null` a regular file that every later reader of
/// `/dev/null` read others' output from. A link to a file keeps being a link.
#[test]
fn report_writes_into_a_fifo_and_through_a_link_without_replacing_either() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let data = imported_store(dir.path(), 5);
    let report = |output: &Path| {
        stdout_of(
            Command::new(VTAX)
                .args(["report", "--data-dir"])
                .arg(&data)
                .arg("--output")
                .arg(output),
        );
    };

    let fifo = dir.path().join("page.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    report(&fifo);
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    let page = reader.join().unwrap();
    assert!(
        page.starts_with("<!DOCTYPE html>"),
        "{}",
        &page[..page.len().min(200)]
    );
    assert!(page.trim_end().ends_with("</html>"));

    let pages = dir.path().join("www");
    std::fs::create_dir(&pages).unwrap();
    let file = pages.join("node.html");
    std::fs::write(&file, "old").unwrap();
    let link = dir.path().join("latest.html");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    report(&link);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let replaced = std::fs::read_to_string(&file).unwrap();
    assert!(replaced.starts_with("<!DOCTYPE html>"), "{replaced}");
    let left: Vec<_> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["node.html"], "no temporary file stays");
}

#[test]
fn verify_names_damaged_files_and_quarantine_moves_them_aside() {
    let dir = tempfile::tempdir().unwrap();
    let data = imported_store(dir.path(), 500);
    let files = {
        let mut files: Vec<_> = vtax_store::files::live_files(&data)
            .unwrap()
            .into_iter()
            .map(|f| f.path)
            .collect();
        files.sort();
        files
    };
    assert_eq!(files.len(), 2, "one file a date partition");
    // The first page of the first column starts after the 4-byte magic: its
    // header smashed, the footer whole. The second file loses its footer's end.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[4..28].fill(0xff);
    std::fs::write(&files[0], bytes).unwrap();
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() - 5]).unwrap();

    // A query fails on the first damage it meets (footers are read before
    // any page: the file without its footer's end), naming the file and the
    // ways on; told to, it leaves both files out and names them.
    let query = |skip: bool| {
        let mut command = Command::new(VTAX);
        command
            .args(["query", "scraped", "--format", "csv", "--data-dir"])
            .arg(&data);
        if skip {
            command.arg("--skip-damaged");
        }
        command.output().unwrap()
    };
    let out = query(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&*files[1].to_string_lossy()), "{stderr}");
    assert!(stderr.contains("--skip-damaged reads the rest"), "{stderr}");
    let out = query(true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for file in &files {
        assert!(stderr.contains(&*file.to_string_lossy()), "{stderr}");
    }
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        1,
        "the header only"
    );

    let verify = |quarantine: bool| verify_store(&data, quarantine);
    let (ok, stderr) = verify(false);
    assert!(!ok, "damage fails the command:\n{stderr}");
    for file in &files {
        assert!(stderr.contains(&*file.to_string_lossy()), "{stderr}");
        assert!(file.exists(), "a plain verify moves nothing");
    }
    assert!(
        stderr.contains("0 file(s) sound, 2 damaged, 0 unreadable."),
        "{stderr}"
    );

    let (ok, stderr) = verify(true);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("2 damaged moved or copied to"), "{stderr}");
    assert!(files.iter().all(|f| !f.exists()));
    let (ok, stderr) = verify(false);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("0 file(s) sound, 0 damaged, 0 unreadable."),
        "{stderr}"
    );
}

/// A replay fails on a damaged file of the recording and says what to do;
/// told to skip it, it replays the rest and names the file on stderr.
#[test]
fn replay_detector_names_a_damaged_file_and_skips_it_when_told() {
    use vtax_store::{BatchBuilder, Store, StoreOptions, Value};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cpu = vtax_collectors::tables()
        .into_iter()
        .find(|t| t.name == "cpu")
        .expect("the cpu table");
    let start_us = 1_764_000_000_000_000; // 2025-11-24T16:00:00Z
    let mut store = Store::open(StoreOptions::new(&data), vtax::catalog()).unwrap();
    let mut batch = BatchBuilder::new(cpu);
    for second in 0..30 {
        let tags = vec!["0"; cpu.tags.len()];
        let fields = vec![Value::F64(second as f64); cpu.fields.len()];
        batch
            .push(start_us + second * 1_000_000, &tags, &fields)
            .unwrap();
    }
    store.append(&batch.finish()).unwrap();
    store.close().unwrap();
    let mut files = vtax_tests::all_files(&data.join("tables/cpu"));
    files.retain(|f| f.extension().is_some_and(|e| e == "parquet"));
    assert_eq!(files.len(), 1, "{files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[4..28].fill(0xff);
    std::fs::write(&files[0], bytes).unwrap();

    let replay = |skip: bool| {
        let mut command = Command::new(VTAX);
        command
            .args([
                "replay-detector",
                "--since",
                "1764000000",
                "--until",
                "1764000060",
            ])
            .arg("--data-dir")
            .arg(&data);
        if skip {
            command.arg("--skip-damaged");
        }
        command.output().unwrap()
    };
    let file = files[0].to_string_lossy();
    let out = replay(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&*file), "{stderr}");
    assert!(
        stderr.contains("--skip-damaged replays the rest"),
        "{stderr}"
    );
    let out = replay(true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 damaged file(s) left out") && stderr.contains(&*file),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no rows, no events");
}

/// Offsets of the frames of a pristine WAL segment (an 8-byte magic, then
/// `[len: u32][crc32: u32][payload]`).
fn wal_frame_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 8;
    while at < bytes.len() {
        offsets.push(at);
        at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    offsets
}

#[test]
fn verify_checks_the_wal_and_remote_write_queues() {
    use vtax_exporters::remote_write::queue::Queue;
    use vtax_store::tables::ScrapedRow;
    use vtax_store::{BatchBuilder, Store, StoreOptions};

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Three WAL frames, left unpublished as a killed agent leaves them.
    {
        let mut options = StoreOptions::new(&data);
        options.node = "verify".into();
        let mut store = Store::open(options, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
        for i in 0..3 {
            let mut batch = BatchBuilder::new(&tables::SCRAPED);
            let row = ScrapedRow {
                target: "",
                metric: "m",
                labels: "",
                value: Some(i as f64),
            };
            batch.push_row(START_MS * 1000 + i, &row).unwrap();
            store.append(&batch.finish()).unwrap();
            store.sync().unwrap();
        }
    }
    let segment = vtax_store::wal::list_segments(&data.join("wal"))
        .unwrap()
        .pop()
        .unwrap()
        .1;
    let mut bytes = std::fs::read(&segment).unwrap();
    let frames = wal_frame_offsets(&bytes);
    assert_eq!(frames.len(), 3);
    bytes[frames[1] + 12] ^= 1;
    std::fs::write(&segment, &bytes).unwrap();
    // A remote's queue of three records, the second damaged.
    let queue_dir = data.join("remote_write").join("central");
    {
        let (mut queue, _) = Queue::open(&queue_dir, 1 << 20).unwrap();
        for i in 0..3 {
            queue.append(&[i; 16], 10, 0).unwrap();
        }
        queue.sync().unwrap();
    }
    let queue_segment = queue_dir.join(format!("{:020}.seg", 0));
    let mut bytes = std::fs::read(&queue_segment).unwrap();
    bytes[8 + (20 + 16) + 20 + 3] ^= 1;
    std::fs::write(&queue_segment, &bytes).unwrap();

    let verify = |quarantine: bool| verify_store(&data, quarantine);
    let (ok, stderr) = verify(false);
    assert!(!ok, "damage fails the command:\n{stderr}");
    for expected in [
        "wal: 1 segment(s), 2 intact frame(s).",
        &format!("damaged: WAL segment {}", segment.display()),
        "remote_write/central: 1 segment(s), 2 intact record(s), 20 sample(s) not yet \
         acknowledged by the receiver.",
        &format!(
            "damaged: remote write queue segment {}: 36 byte(s)",
            queue_segment.display()
        ),
        "2 damaged or unreadable file(s)",
    ] {
        assert!(stderr.contains(expected), "{expected:?} in:\n{stderr}");
    }
    assert_eq!(
        std::fs::read(&queue_segment).unwrap(),
        bytes,
        "verify writes nothing"
    );

    // Quarantine keeps copies; the store's close publishes the WAL's intact
    // rows, and the queue's damaged record stays stepped over in place.
    let (ok, stderr) = verify(true);
    assert!(ok, "{stderr}");
    assert!(data
        .join("quarantine/wal")
        .join(segment.file_name().unwrap())
        .exists());
    assert!(queue_dir
        .join("quarantine/00000000000000000000.seg")
        .exists());
    let (ok, stderr) = verify(false);
    assert!(ok, "damage kept in quarantine passes:\n{stderr}");
    assert!(stderr.contains(" 0 intact frame(s)."), "{stderr}");
    assert!(
        stderr.contains("damaged, a copy kept in quarantine: remote write queue segment"),
        "{stderr}"
    );
    let rows = scan_dir(
        &data,
        &Catalog::new(&[&tables::SCRAPED]).unwrap(),
        &ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        },
    )
    .unwrap()
    .rows();
    assert_eq!(rows, 2, "the intact frames' rows are in the tables");
}

/// Runs vtax with its stdout a pipe whose reader closes before the first
/// write (`vtax catalogue | head` once head has had its lines).
fn run_into_closed_pipe(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(VTAX)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// Every command that prints ends quietly, and successfully, when the
/// reader of its output goes away, rather than panic on EPIPE.
#[test]
fn printing_commands_exit_quietly_on_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.om");
    let data = dir.path().join("data");
    write_input(&input, 20);
    assert!(import(&data, &[&input]).status.success());
    let data = data.to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["catalogue"],
        &["check-config", "--print-defaults"],
        &["check-config"],
        &["doctor", "--no-collector.jitter"],
        &["query", "--data-dir", data, "scraped"],
        &["query", "--data-dir", data, "scraped", "--format", "csv"],
        &["query", "--data-dir", data, "scraped", "--format", "json"],
        &["report", "--data-dir", data, "--output", "-"],
        &["verify", "--data-dir", data],
        &[
            "replay-detector",
            "--data-dir",
            data,
            "--since",
            "2025-11-21",
            "--until",
            "2025-11-23",
        ],
    ];
    for args in commands {
        let out = run_into_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked") && !stderr.contains("error"),
            "vtax {}: {:?}\n{stderr}",
            args.join(" "),
            out.status
        );
    }
}

/// A name the node chose can hold an escape sequence (a directory, a
/// cgroup, a mount may be named anything); what vtax prints to a terminal,
/// errors and the doctor's problems alike, writes it escaped.
#[test]
fn a_control_character_in_a_name_is_printed_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("proc\u{1b}[2J\u{7}");
    let odd = odd.to_str().unwrap();
    let escaped = "proc\\u{1b}[2J\\u{7}";
    let out = Command::new(VTAX)
        .args(["check-config", "--path.procfs", odd])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(escaped) && !stderr.contains('\u{1b}'),
        "{stderr:?}"
    );
    // The doctor lists it among the problems, on stdout.
    let out = Command::new(VTAX)
        .args(["doctor", "--no-collector.jitter", "--path.procfs", odd])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "  - paths.procfs: {}",
            dir.path().join(escaped).display()
        )),
        "{stdout:?}"
    );
    assert!(
        !stdout.contains('\u{1b}') && !out.stderr.contains(&0x1b),
        "{stdout:?}"
    );
}

/// Commands that read a store fail on a data directory that is not there,
/// rather than report an empty store; `vtax run` creates it.
#[test]
fn store_commands_fail_on_a_missing_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    store_commands_fail_on(&dir.path().join("nonexistent"), dir.path());
    // A directory that is no store (`/var/lib` for `/var/lib/vtax`): verify
    // called it sound, query printed an empty table, compact made a store
    // of it.
    let not_a_store = dir.path().join("lib");
    std::fs::create_dir_all(not_a_store.join("apt")).unwrap();
    store_commands_fail_on(&not_a_store, dir.path());
    assert_eq!(
        std::fs::read_dir(&not_a_store).unwrap().count(),
        1,
        "nothing made in it"
    );
}

/// Every command that reads a store fails on `missing`, saying there is no
/// store there, and makes nothing.
fn store_commands_fail_on(missing: &Path, dir: &Path) {
    let existed = missing.exists();
    let missing = missing.to_str().unwrap();
    let target = format!("file://{}", dir.join("bucket").display());
    let commands: &[&[&str]] = &[
        &["verify", "--data-dir", missing],
        &["verify", "--data-dir", missing, "--quarantine"],
        &["compact", "--data-dir", missing],
        &["query", "--data-dir", missing, "cpu"],
        &["report", "--data-dir", missing, "--output", "-"],
        &["upload", "--data-dir", missing, "--url", &target],
        &[
            "replay-detector",
            "--data-dir",
            missing,
            "--since",
            "1h",
            "--until",
            "0h",
        ],
    ];
    for args in commands {
        let out = Command::new(VTAX).args(*args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(&format!("no store at {missing}")),
            "vtax {}: {:?}\n{stderr}",
            args.join(" "),
            out.status
        );
        assert_eq!(
            Path::new(missing).exists(),
            existed,
            "vtax {} made the directory",
            args.join(" ")
        );
    }
}

/// Files under `dir`, at any depth, whose names end in `.parquet`.
fn parquet_files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                out.push(path);
            }
        }
    }
    out
}

/// A store left by a killed agent holds its last rows in the WAL only:
/// `vtax compact` publishes them first, so they merge with the rest of
/// their day, and retention removes them with it rather than leaving a
/// piece of an expired day behind.
#[test]
fn compact_takes_in_the_rows_a_killed_agent_left_in_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = common::Agent::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--no-collector.jitter",
    ]);
    agent.wait_for_metric("vtax_cpu_user_seconds_total", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    let mut agent = agent;
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    let rows = common::query_rows(&data, "cpu").len();
    assert!(rows > 0);
    let kept = dir.path().join("kept");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&kept)
        .status()
        .unwrap();
    assert!(copied.success());

    let later = "2099-01-01T00:00:00Z";
    let out = Command::new(common::VTAX)
        .args(["compact", "--data-dir"])
        .arg(&kept)
        .args(["--now", later])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(common::query_rows(&kept, "cpu").len(), rows);
    let cpu_files = parquet_files_under(&kept.join("tables/cpu"));
    assert_eq!(cpu_files.len(), 1, "one file for the day: {cpu_files:?}");

    let out = Command::new(common::VTAX)
        .args(["compact", "--data-dir"])
        .arg(&data)
        .args(["--now", later, "--retention.max-age", "1d"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(common::query_rows(&data, "cpu").is_empty());
    assert!(parquet_files_under(&data.join("tables")).is_empty());
}

/// A path flag that is not UTF-8 is refused, naming its key, by every
/// command that resolves the configuration: it panicked (exit 101).
#[test]
fn a_path_that_is_not_utf8_is_refused_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join(std::ffi::OsStr::from_bytes(b"store\xff"));
    for command in ["check-config", "doctor"] {
        let out = Command::new(VTAX)
            .arg(command)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.contains("store.data_dir = ") && stderr.contains("not UTF-8 text"),
            "{command}: {stderr}"
        );
    }
}
