//! A writer for the crash test (`tests/tests/crash.rs`): it writes rows into a store
//! as fast as it can until it is killed.
//!
//! ```text
//! crash_writer <data_dir> <start_id>
//! ```
//!
//! It opens the store (replaying the WAL), then appends batches of rows with ids
//! `start_id, start_id + 1, …` (see the row scheme in the crate docs), calling
//! `tick`, `sync`, `flush` and `compact` as it goes, with small limits so that
//! kills land while files are published, WAL segments rotated and deleted, and
//! days compacted. On stdout, one line each, flushed at once:
//!
//! * `READY <start_id> replayed=<rows> torn=<bytes> quarantined=<files>` once the
//!   store is open;
//! * `ISSUE <n>` before an append: every id this run will have used is below `n`,
//!   so a restart from `n` never reuses an id;
//! * `ACK <n>` after the store reported more frames durable: every row this run
//!   appended with an id below `n` (and at or above `start_id`) is durable.
//!
//! The test varies the cadence from run to run through the environment:
//! `VTAX_CRASH_SYNC_EVERY` (an explicit `sync` after this many appends, default
//! 3), `VTAX_CRASH_SYNC_INTERVAL_MS` (`tick` syncs when this much time has passed,
//! default 3), `VTAX_CRASH_MAX_BUFFERED` (the store's memory bound in bytes,
//! default 4096) and `VTAX_CRASH_GRACE_MIN` (the publish grace in minutes of row
//! time, default 45).
//!
//! On any store error it prints it to stderr and exits with status 1; the test
//! treats any exit but a SIGKILL as a failure. It also exits by itself after
//! `VTAX_CRASH_WRITER_MAX_SECS` (default 20) so that it never outlives a test
//! that died without killing it.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::process::exit;
use std::time::{Duration, Instant};

use vtax_store::Store;
use vtax_tests::{batch, busy_options, catalog, now_after};

/// Rows per append.
const ROWS_PER_BATCH: u64 = 16;
/// A `flush` (every bucket published, partial hours too) after this many appends.
const FLUSH_EVERY: u64 = 41;
/// A `compact` after this many appends.
const COMPACT_EVERY: u64 = 7;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: crash_writer <data_dir> <start_id>");
        exit(2);
    }
    let dir = PathBuf::from(&args[1]);
    let start: u64 = args[2].parse().unwrap_or_else(|_| {
        eprintln!("start_id {:?} is not a number", args[2]);
        exit(2)
    });
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let sync_every = env("VTAX_CRASH_SYNC_EVERY", 3).max(1);
    let mut options = busy_options(&dir);
    options.sync_interval = Duration::from_millis(env("VTAX_CRASH_SYNC_INTERVAL_MS", 3));
    options.max_buffered_bytes = env("VTAX_CRASH_MAX_BUFFERED", 4096) as usize;
    options.publish_grace = Duration::from_secs(60 * env("VTAX_CRASH_GRACE_MIN", 45));
    let max_run = Duration::from_secs(env("VTAX_CRASH_WRITER_MAX_SECS", 20));
    let began = Instant::now();
    let fail = |what: &str, e: vtax_store::Error| -> ! {
        eprintln!("crash_writer: {what}: {e}");
        exit(1)
    };

    let mut store = Store::open(options, catalog()).unwrap_or_else(|e| fail("open", e));
    let mut out = std::io::stdout().lock();
    let mut say = |line: String| {
        // One write per line (a pipe takes it whole), flushed before going on.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            // The test is gone.
            exit(3);
        }
    };
    let stats = store.stats().clone();
    say(format!(
        "READY {start} replayed={} torn={} quarantined={}",
        stats.rows_replayed, stats.wal_torn_bytes, stats.files_quarantined
    ));

    // Appended but not yet durable: (highest WAL seq of the append, ids below this).
    let mut in_flight: VecDeque<(u64, u64)> = VecDeque::new();
    let mut acked = start;
    let mut next = start;
    let mut appends: u64 = 0;
    loop {
        let end = next + ROWS_PER_BATCH;
        say(format!("ISSUE {end}"));
        let seq = store
            .append(&batch(next..end))
            .unwrap_or_else(|e| fail("append", e));
        in_flight.push_back((seq, end));
        next = end;
        appends += 1;
        let now = now_after(next);

        store.tick(now).unwrap_or_else(|e| fail("tick", e));
        if appends.is_multiple_of(sync_every) {
            store.sync().unwrap_or_else(|e| fail("sync", e));
        }
        if appends.is_multiple_of(FLUSH_EVERY) {
            store.flush().unwrap_or_else(|e| fail("flush", e));
        }
        if appends.is_multiple_of(COMPACT_EVERY) {
            store.compact(now).unwrap_or_else(|e| fail("compact", e));
        }

        let durable_below = store.durable_below();
        let before = acked;
        while let Some(&(seq, ids_below)) = in_flight.front() {
            if seq >= durable_below {
                break;
            }
            acked = ids_below;
            in_flight.pop_front();
        }
        if acked != before {
            say(format!("ACK {acked}"));
        }
        if began.elapsed() > max_run {
            eprintln!("crash_writer: not killed within {max_run:?}; exiting");
            exit(4);
        }
    }
}
