//! Kills a writer with SIGKILL at random instants, many times over, and checks
//! after each kill that every published file reads, that every row
//! acknowledged before the last completed fsync is present exactly once, and
//! that a plain glob of `*.parquet` counts no row twice.
//!
//! The writer is `src/bin/crash_writer.rs`; the row scheme is in the crate docs.
//! Knobs (environment):
//! * `VTAX_CRASH_SEED`: seed of the random kill instants (printed on every run);
//! * `VTAX_CRASH_ITERATIONS`: kills (default 100, at least 50);
//! * `VTAX_CRASH_KEEP=1`: keep the data directory and print where it is;
//! * `VTAX_CRASH_VERBOSE=1`: print every run.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use vtax_store::{scan, ScanRequest, Store};
use vtax_tests::{
    all_files, busy_options, catalog, read_parquet, sample, scanned_ids, table_files, IdCounts,
};

/// Kills a child that the test did not get to kill (a failed assertion).
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What one run of the writer said before it was killed.
#[derive(Debug, Default)]
struct Run {
    start: u64,
    ready: bool,
    /// Every id this run appended with an id below this is durable (`start` if none).
    acked: u64,
    /// Every id this run may have used is below this (`start` if none).
    issued: u64,
    /// From the READY line.
    replayed_rows: u64,
    torn_bytes: u64,
    quarantined: u64,
}

/// When to kill.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// This long after the writer said it is open.
    AfterReady(Duration),
    /// This long after it was started, perhaps while it is still opening the store
    /// (removing temp files, finishing a compaction, cutting a torn WAL tail).
    AfterSpawn(Duration),
}

fn writer_binary() -> &'static str {
    env!("CARGO_BIN_EXE_crash_writer")
}

/// How the writer paces its work (see `crash_writer`'s docs); varied per run so
/// that kills find the store in many states: files that ran ahead of the WAL,
/// long unsynced tails, buckets that live long or short.
#[derive(Clone, Copy, Debug)]
struct Cadence {
    sync_every: u64,
    sync_interval_ms: u64,
    max_buffered: u64,
    grace_min: u64,
}

impl Cadence {
    fn random(rng: &mut StdRng) -> Self {
        Cadence {
            sync_every: [1, 2, 3, 5, 8][rng.random_range(0..5)],
            sync_interval_ms: [1, 3, 10, 50][rng.random_range(0..4)],
            max_buffered: [2 << 10, 4 << 10, 16 << 10, 64 << 10][rng.random_range(0..4)],
            // Longer than the late rows' lag; the long ones keep buckets (and the
            // frames they hold) in memory for dozens of appends.
            grace_min: [45, 180, 720, 720][rng.random_range(0..4)],
        }
    }
}

fn run_writer(dir: &Path, start: u64, cadence: Cadence, kill_at: KillAt) -> Run {
    let mut child = Command::new(writer_binary())
        .arg(dir)
        .arg(start.to_string())
        .env("VTAX_CRASH_WRITER_MAX_SECS", "30")
        .env("VTAX_CRASH_SYNC_EVERY", cadence.sync_every.to_string())
        .env(
            "VTAX_CRASH_SYNC_INTERVAL_MS",
            cadence.sync_interval_ms.to_string(),
        )
        .env("VTAX_CRASH_MAX_BUFFERED", cadence.max_buffered.to_string())
        .env("VTAX_CRASH_GRACE_MIN", cadence.grace_min.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start crash_writer");
    let spawned = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut guard = ChildGuard(Some(child));
    let (tx, rx) = mpsc::channel::<String>();
    let reader = thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                // A line cut by the kill has no newline: it was never said.
                Ok(_) if line.ends_with('\n') => {
                    if tx.send(line.trim_end().to_owned()).is_err() {
                        break;
                    }
                }
                Ok(_) => break,
            }
        }
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let mut run = Run {
        start,
        acked: start,
        issued: start,
        ..Default::default()
    };
    let mut lines = Vec::new();
    let deadline = match kill_at {
        KillAt::AfterSpawn(d) => spawned + d,
        KillAt::AfterReady(d) => {
            let ready_by = spawned + Duration::from_secs(30);
            loop {
                match rx.recv_timeout(ready_by.saturating_duration_since(Instant::now())) {
                    Ok(line) => {
                        let is_ready = line.starts_with("READY ");
                        lines.push(line);
                        if is_ready {
                            break Instant::now() + d;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        panic!("crash_writer did not open the store within 30 s")
                    }
                    Err(RecvTimeoutError::Disconnected) => break Instant::now(),
                }
            }
        }
    };
    thread::sleep(deadline.saturating_duration_since(Instant::now()));
    let mut child = guard.0.take().unwrap();
    // `Child::kill` is SIGKILL on Unix.
    let killed = child.kill();
    let status = child.wait().expect("wait for crash_writer");
    reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    lines.extend(rx.try_iter());
    if killed.is_err() || status.signal() != Some(libc::SIGKILL) {
        panic!(
            "crash_writer ended by itself ({status}) before the kill; stderr:\n{stderr}\nlast lines: {:?}",
            &lines[lines.len().saturating_sub(5)..]
        );
    }
    for line in &lines {
        let mut words = line.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|n| n.parse::<u64>().ok()),
        ) {
            (Some("READY"), Some(n)) => {
                assert_eq!(n, start, "writer started from the id it was given");
                run.ready = true;
                for word in words {
                    let (k, v) = word.split_once('=').expect("key=value");
                    let v: u64 = v.parse().expect("a number");
                    match k {
                        "replayed" => run.replayed_rows = v,
                        "torn" => run.torn_bytes = v,
                        "quarantined" => run.quarantined = v,
                        _ => {}
                    }
                }
            }
            (Some("ISSUE"), Some(n)) => {
                assert!(n > run.issued, "ISSUE goes up: {line}");
                run.issued = n;
            }
            (Some("ACK"), Some(n)) => {
                assert!(n > run.acked && n <= run.issued, "ACK {n} out of order");
                run.acked = n;
            }
            _ => panic!("unexpected line from crash_writer: {line:?}"),
        }
    }
    run
}

/// What the checker knows across runs.
#[derive(Default)]
struct Ledger {
    /// Id ranges acknowledged durable: `[start, acked)` of every run.
    acked: Vec<(u64, u64)>,
    /// Every id that any earlier check found present: once recovered after a
    /// crash, a row must never vanish.
    seen: IdCounts,
}

impl Ledger {
    fn acked_rows(&self) -> u64 {
        self.acked.iter().map(|(a, b)| b - a).sum()
    }
}

/// Evidence of where kills landed, for the summary.
#[derive(Default, Debug)]
struct Coverage {
    kills: usize,
    kills_timed_from_spawn: usize,
    kills_before_ready: usize,
    runs_with_acks: usize,
    with_temp_files: usize,
    /// Kills that left a merged file under its pending name.
    with_pending_merges: usize,
    with_torn_wal_tail: usize,
    with_unacked_rows_present: usize,
    max_files: usize,
    max_wal_segments: usize,
}

/// Checks a data directory after a kill (`scan_dir`, read-only) or through an
/// open store. Returns the ids present.
fn check(
    dir: &Path,
    ledger: &Ledger,
    ids: &[u64],
    context: &str,
    coverage: Option<&mut Coverage>,
) -> IdCounts {
    let mut problems = Vec::new();

    // Every published file reads from end to end, read directly; and a plain
    // glob of `*.parquet`, which reads every one of them, counts no row twice
    // (a merge's inputs are gone before its file takes a name it matches).
    let files = table_files(dir);
    let mut globbed = Vec::new();
    for path in &files.parquet {
        match read_parquet(path) {
            Ok(file) => {
                for row in &file.rows {
                    match row.id() {
                        Ok(id) => globbed.push(id),
                        Err(e) => {
                            problems.push(format!("{}: {e}", path.display()));
                            break;
                        }
                    }
                }
            }
            Err(e) => problems.push(format!("a published file does not read: {e}")),
        }
    }
    let glob_duplicates = IdCounts::new(&globbed).duplicates();
    if !glob_duplicates.is_empty() {
        problems.push(format!(
            "a plain glob of *.parquet counts {} ids more than once (id, count): {:?}",
            glob_duplicates.len(),
            &glob_duplicates[..glob_duplicates.len().min(12)]
        ));
    }
    let quarantined = all_files(&dir.join("quarantine"));
    if !quarantined.is_empty() {
        problems.push(format!("files were quarantined: {quarantined:?}"));
    }

    let counts = IdCounts::new(ids);
    let duplicates = counts.duplicates();
    if !duplicates.is_empty() {
        problems.push(format!(
            "{} ids present more than once (id, count): {:?}",
            duplicates.len(),
            &duplicates[..duplicates.len().min(12)]
        ));
    }
    for &(from, to) in &ledger.acked {
        let missing = counts.missing_in(from..to);
        if !missing.is_empty() {
            problems.push(format!(
                "acknowledged ids of the run that started at {from} (acked below {to}) are missing: {}",
                sample(&missing)
            ));
        }
    }
    let vanished: Vec<u64> = ledger
        .seen
        .present()
        .filter(|&id| counts.count(id) == 0)
        .collect();
    if !vanished.is_empty() {
        problems.push(format!(
            "ids that an earlier check found present (recovered after a crash) have vanished: {}",
            sample(&vanished)
        ));
    }
    if !problems.is_empty() {
        panic!(
            "{context}: {} problem(s) in {}:\n  {}\nfiles: {:#?}",
            problems.len(),
            dir.display(),
            problems.join("\n  "),
            files.parquet
        );
    }

    if let Some(coverage) = coverage {
        if !files.pending.is_empty() {
            coverage.with_pending_merges += 1;
        }
        if !files.temp.is_empty() {
            coverage.with_temp_files += 1;
        }
        let acked_max = ledger.acked.iter().map(|r| r.1).max().unwrap_or(0);
        if counts.max().is_some_and(|m| m >= acked_max) {
            coverage.with_unacked_rows_present += 1;
        }
        coverage.max_files = coverage.max_files.max(files.parquet.len());
        let segments = vtax_store::wal::list_segments(&dir.join("wal"))
            .map(|s| s.len())
            .unwrap_or(0);
        coverage.max_wal_segments = coverage.max_wal_segments.max(segments);
    }
    counts
}

fn scan_all() -> ScanRequest {
    ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    }
}

fn read_only_ids(dir: &Path, context: &str) -> Vec<u64> {
    let result = scan::scan_dir(dir, &catalog(), &scan_all())
        .unwrap_or_else(|e| panic!("{context}: scan_dir fails: {e}"));
    scanned_ids(&result).unwrap_or_else(|e| panic!("{context}: {e}"))
}

#[test]
fn sigkill_at_random_instants_loses_no_acknowledged_row_and_duplicates_none() {
    let began = Instant::now();
    let seed: u64 = std::env::var("VTAX_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let iterations: usize = std::env::var("VTAX_CRASH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
        .max(50);
    eprintln!("crash test: seed {seed} (VTAX_CRASH_SEED={seed} repeats it), {iterations} kills");
    let verbose = std::env::var("VTAX_CRASH_VERBOSE").is_ok_and(|v| v == "1");
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("data");
    if std::env::var("VTAX_CRASH_KEEP").is_ok_and(|v| v == "1") {
        eprintln!("crash test: keeping {}", tmp.path().display());
        let _ = tmp.keep();
    }

    let mut ledger = Ledger::default();
    let mut coverage = Coverage::default();
    let mut next_start = 0;
    for i in 0..iterations {
        // Mostly after the store is open, 5-150 ms later (log-uniform: as many
        // kills in 5-10 ms, right after a replay, as in 75-150 ms); now and then
        // while it is still opening (replaying, tidying after the last kill).
        let kill_at = if i % 9 == 4 {
            KillAt::AfterSpawn(Duration::from_millis(rng.random_range(1..=40)))
        } else {
            let ms = (5f64.ln() + rng.random::<f64>() * (150f64 / 5.0).ln()).exp();
            KillAt::AfterReady(Duration::from_micros((ms * 1000.0) as u64))
        };
        let cadence = Cadence::random(&mut rng);
        let run = run_writer(&dir, next_start, cadence, kill_at);
        let context = format!("seed {seed}, kill {i} ({kill_at:?}, {cadence:?}, run {run:?})");
        if verbose {
            eprintln!("{context}");
        }
        assert_eq!(
            run.quarantined, 0,
            "{context}: the writer quarantined files on open"
        );
        coverage.kills += 1;
        if matches!(kill_at, KillAt::AfterSpawn(_)) {
            coverage.kills_timed_from_spawn += 1;
        }
        if !run.ready {
            coverage.kills_before_ready += 1;
        }
        if run.torn_bytes > 0 {
            coverage.with_torn_wal_tail += 1;
        }
        if run.acked > run.start {
            ledger.acked.push((run.start, run.acked));
            coverage.runs_with_acks += 1;
        }
        let ids = read_only_ids(&dir, &context);
        let counts = check(&dir, &ledger, &ids, &context, Some(&mut coverage));
        ledger.seen = IdCounts::new(&counts.present().collect::<Vec<_>>());
        // Never reuse an id: start past everything issued and everything present.
        next_start = next_start
            .max(run.issued)
            .max(counts.max().map_or(0, |m| m + 1));
    }

    // Finally open it for writing (replay and repair), check, close, check again.
    let store = Store::open(busy_options(&dir), catalog()).expect("open after the last kill");
    assert_eq!(store.stats().files_quarantined, 0);
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    check(&dir, &ledger, &ids, "after Store::open", None);
    store.close().expect("close");
    let ids = read_only_ids(&dir, "after close");
    let counts = check(&dir, &ledger, &ids, "after close", None);
    assert!(
        table_files(&dir).temp.is_empty(),
        "open removed every stray temp file"
    );

    eprintln!(
        "crash test: {} kills in {:.1?}; {} rows acknowledged, {} present; {coverage:?}",
        coverage.kills,
        began.elapsed(),
        ledger.acked_rows(),
        counts.distinct(),
    );
    // A proof only if the writer got somewhere between kills.
    assert!(
        coverage.runs_with_acks * 4 >= iterations,
        "the writer acknowledged rows in only {} of {iterations} runs",
        coverage.runs_with_acks
    );
}
