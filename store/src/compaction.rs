//! Compaction beside the writer: merges run on a thread of their own while
//! the thread that owns the [`Store`] goes on appending, syncing the WAL and
//! publishing. A day's merge takes seconds (6–7 s for a 362 MB day of 50
//! cgroups on a 2-vCPU VM); on the writer's thread that long a stall holds up
//! every fsync, the agent's detector and its watchdog.
//!
//! The store plans a round of merges ([`Store::plan_merges`]), a worker runs
//! them one after another, and [`Compactor::poll`], called from the writer's
//! loop, hands each outcome back ([`Store::finish_merge`]). A cycle is up to
//! [`MAX_MERGE_ROUNDS`] rounds (a round's outputs can make the next round's
//! inputs), then retention.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::store::{Merge, MergeOutcome, Store, MAX_MERGE_ROUNDS};

/// Runs a store's compaction and retention every `interval`, merging off the
/// caller's thread. One per store, driven by its owner's loop.
pub struct Compactor {
    interval: Duration,
    next_cycle: Instant,
    cycle: Option<Cycle>,
    /// Started at the first merge and kept: one thread for every round, so
    /// every merge allocates from the one malloc arena that thread took and
    /// reuses what the merge before it freed.
    worker: Option<Worker>,
    /// What retention takes for now: the wall clock, never further ahead of
    /// the time first seen than the time measured since.
    retention_clock: SteadyClock,
}

/// The wall clock as far as the machine measured time passing: a wall time
/// seen once, plus the boot clock's advance since (`CLOCK_BOOTTIME`, which
/// counts a suspend as a wall clock does). A wall clock stepped a year ahead
/// (a bad NTP source, an operator's typo) made every file a year old, and
/// retention by age deleted the whole store within a compaction interval;
/// bounded by this, retention goes on from the time that really passed.
/// A step that holds for [`STEP_TAKEN_AFTER_US`] is the time (a clock that
/// was behind at the agent's start, a dead RTC battery, set right by NTP):
/// held for good, retention deleted nothing until a restart. A clock stepped
/// back is taken as it is: retention then deletes less.
#[derive(Debug, Default)]
pub struct SteadyClock {
    /// The wall time and boot time measured from, in µs.
    origin: Option<(i64, i64)>,
    /// The last forward step warned of, in µs.
    warned_step_us: i64,
    /// The boot time a forward step was first seen at.
    step_seen_at_boot_us: Option<i64>,
}

/// How far the wall clock may run ahead of the time measured before it is a
/// step: far above an NTP slew's drift over months.
const STEP_SLACK_US: i64 = 3_600_000_000;

/// How long a forward step must hold before it is taken as the time: a day,
/// for someone to notice a clock set wrong before retention acts on it.
const STEP_TAKEN_AFTER_US: i64 = 86_400_000_000;

impl SteadyClock {
    /// The wall time `now_us`, bounded by the time measured since the first
    /// call; a forward step past [`STEP_SLACK_US`] is logged once.
    pub fn bound(&mut self, now_us: i64) -> i64 {
        match crate::clock::boot_us() {
            Some(boot_us) => self.bound_at(now_us, boot_us),
            None => now_us,
        }
    }

    /// [`Self::bound`] with the boot clock reading `boot_us`.
    fn bound_at(&mut self, now_us: i64, boot_us: i64) -> i64 {
        let (wall0, boot0) = *self.origin.get_or_insert((now_us, boot_us));
        let measured = wall0 + (boot_us - boot0) + STEP_SLACK_US;
        if now_us <= measured {
            self.step_seen_at_boot_us = None;
            return now_us;
        }
        let seen_at = *self.step_seen_at_boot_us.get_or_insert(boot_us);
        if boot_us - seen_at >= STEP_TAKEN_AFTER_US {
            tracing::warn!(
                "The wall clock has been ahead of the time measured for a day: retention by age takes it as the time."
            );
            self.origin = Some((now_us, boot_us));
            self.step_seen_at_boot_us = None;
            self.warned_step_us = 0;
            return now_us;
        }
        let step = now_us - measured;
        if step > self.warned_step_us + STEP_SLACK_US {
            self.warned_step_us = step;
            tracing::warn!(
                ahead_secs = step / 1_000_000,
                "The wall clock is ahead of the time that passed since the agent started: retention by age goes by the time measured, and deletes nothing for the step."
            );
        }
        measured
    }
}

/// A cycle under way.
struct Cycle {
    started: Instant,
    rounds: usize,
    merges: usize,
    merge_error: Option<Error>,
    round_running: bool,
}

/// The compaction thread: takes rounds of merges and runs them in order.
struct Worker {
    thread: JoinHandle<()>,
    rounds: mpsc::Sender<Vec<Merge>>,
    done: mpsc::Receiver<Done>,
    keep_going: Arc<AtomicBool>,
}

/// What the compaction thread reports.
enum Done {
    Merge(Box<MergeOutcome>),
    /// Every merge of the round was reported (or skipped once told to stop).
    Round,
}

/// What a finished cycle did.
#[derive(Debug)]
pub struct CycleReport {
    /// Merges finished and swapped in.
    pub merges: usize,
    /// The first merge that failed; the cycle planned no more merges after it
    /// (their inputs stay as they were and are merged at a later cycle).
    pub merge_error: Option<Error>,
    /// Files deleted by retention, or why retention failed. Retention runs
    /// even after a failed merge: on a full disk it is what makes room.
    pub retention: Result<usize>,
    /// From the cycle's start to its end, retention included.
    pub took: Duration,
}

impl Compactor {
    /// A compactor whose first cycle starts `interval` from now.
    pub fn new(interval: Duration) -> Self {
        Compactor {
            interval,
            next_cycle: Instant::now() + interval,
            cycle: None,
            worker: None,
            retention_clock: SteadyClock::default(),
        }
    }

    /// Whether a round of merges is running or waits to be handed back.
    pub fn busy(&self) -> bool {
        self.cycle.as_ref().is_some_and(|c| c.round_running)
    }

    /// Hands finished merges back to `store`, starts the next round or cycle
    /// when due, and returns a cycle's report once it ends. Cheap when
    /// nothing is due: call it every turn of the writer's loop.
    pub fn poll(&mut self, store: &mut Store, now_us: i64) -> Option<CycleReport> {
        if self.retention_clock.origin.is_none() {
            // From the agent's first turn, not its first retention minutes later.
            self.retention_clock.bound(now_us);
        }
        if self.cycle.is_none() {
            if Instant::now() < self.next_cycle {
                return None;
            }
            self.next_cycle = Instant::now() + self.interval;
            self.cycle = Some(Cycle {
                started: Instant::now(),
                rounds: 0,
                merges: 0,
                merge_error: None,
                round_running: false,
            });
        }
        let cycle = self.cycle.as_mut().expect("a cycle runs");
        if cycle.round_running {
            let worker = self.worker.as_ref().expect("a round runs on the worker");
            loop {
                match worker.done.try_recv() {
                    Ok(Done::Merge(outcome)) => cycle.finish(store, *outcome),
                    Ok(Done::Round) => {
                        cycle.round_running = false;
                        break;
                    }
                    Err(mpsc::TryRecvError::Empty) => return None,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        let worker = self.worker.take().expect("checked");
                        cycle.merge_error.get_or_insert(worker.join());
                        cycle.round_running = false;
                        break;
                    }
                }
            }
        }
        if cycle.rounds < MAX_MERGE_ROUNDS && cycle.merge_error.is_none() {
            let started = store.plan_merges(now_us).and_then(|merges| {
                if merges.is_empty() {
                    return Ok(false);
                }
                let worker = match &mut self.worker {
                    Some(worker) => worker,
                    None => self.worker.insert(Worker::start()?),
                };
                // The thread takes rounds until its sender is dropped, so a
                // send fails only if it died.
                if worker.rounds.send(merges).is_err() {
                    return Err(self.worker.take().expect("just sent to").join());
                }
                Ok(true)
            });
            match started {
                Ok(true) => {
                    cycle.round_running = true;
                    cycle.rounds += 1;
                    return None;
                }
                Ok(false) => {}
                Err(e) => {
                    cycle.merge_error = Some(e);
                }
            }
        }
        let cycle = self.cycle.take().expect("a cycle runs");
        let retention = store.apply_retention(self.retention_clock.bound(now_us));
        Some(CycleReport {
            merges: cycle.merges,
            merge_error: cycle.merge_error,
            retention,
            took: cycle.started.elapsed(),
        })
    }

    /// Stops a running merge at its next column, waits for the compaction
    /// thread, and hands back what finished: the store is then ready to
    /// close. A stopped merge publishes nothing and leaves its inputs.
    pub fn stop(mut self, store: &mut Store) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        worker.keep_going.store(false, Ordering::Relaxed);
        let Worker {
            thread,
            rounds,
            done,
            ..
        } = worker;
        drop(rounds);
        let mut cycle = self.cycle.take();
        for message in done {
            if let (Done::Merge(outcome), Some(cycle)) = (message, cycle.as_mut()) {
                cycle.finish(store, *outcome);
            }
        }
        let _ = thread.join();
    }
}

impl Cycle {
    fn finish(&mut self, store: &mut Store, outcome: MergeOutcome) {
        match store.finish_merge(outcome) {
            Ok(()) => self.merges += 1,
            Err(Error::Stopped) => {}
            Err(e) => {
                self.merge_error.get_or_insert(e);
            }
        }
    }
}

impl Worker {
    fn start() -> Result<Worker> {
        let keep_going = Arc::new(AtomicBool::new(true));
        let (rounds, todo) = mpsc::channel::<Vec<Merge>>();
        let (report, done) = mpsc::channel();
        let thread = {
            let keep_going = keep_going.clone();
            std::thread::Builder::new()
                .name("compaction".into())
                .spawn(move || {
                    for merges in todo {
                        for merge in merges {
                            if !keep_going.load(Ordering::Relaxed) {
                                break;
                            }
                            let outcome = merge.run(&keep_going);
                            let failed = outcome.error().is_some();
                            let _ = report.send(Done::Merge(Box::new(outcome)));
                            if failed {
                                // A merge that failed (a full disk, most
                                // often) would fail again for the rest.
                                break;
                            }
                        }
                        let _ = report.send(Done::Round);
                    }
                })
                .map_err(|source| Error::Io {
                    op: "spawn",
                    path: "the compaction thread".into(),
                    source,
                })?
        };
        Ok(Worker {
            thread,
            rounds,
            done,
            keep_going,
        })
    }

    /// Joins a thread that died mid-round: a merge panicked (a bug).
    fn join(self) -> Error {
        drop(self.rounds);
        let message = match self.thread.join() {
            Ok(()) => "the compaction thread ended".to_string(),
            Err(payload) => crate::error::panic_message(payload.as_ref()),
        };
        Error::Panicked(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wall clock stepped a year ahead is held to the time measured; one
    /// that keeps time, or steps back, is taken as it is.
    #[test]
    fn a_forward_step_of_the_wall_clock_is_not_taken_for_time_passed() {
        let year_us = 365 * 86_400 * 1_000_000i64;
        let now = 1_796_640_000_000_000;
        let mut clock = SteadyClock::default();
        assert_eq!(clock.bound(now), now);
        assert_eq!(clock.bound(now + 1_000_000), now + 1_000_000);
        assert_eq!(clock.bound(now - 600_000_000), now - 600_000_000);
        let held = clock.bound(now + year_us);
        assert!(held < now + 2 * STEP_SLACK_US, "{}", held - now);
        assert!(held >= now + STEP_SLACK_US);
    }

    /// A clock behind at the start (a dead RTC battery) and set right a
    /// while later: held for a day, then taken, rather than holding
    /// retention back until a restart.
    #[test]
    fn a_forward_step_that_holds_for_a_day_is_the_time() {
        let (year_us, day_us) = (365 * 86_400 * 1_000_000i64, 86_400 * 1_000_000i64);
        let behind = 1_796_640_000_000_000 - year_us;
        let mut clock = SteadyClock::default();
        assert_eq!(clock.bound_at(behind, 0), behind);
        let right = behind + year_us;
        assert!(clock.bound_at(right + 60_000_000, 60_000_000) < right - day_us);
        let held = clock.bound_at(right + day_us, day_us);
        assert!(held < right, "held within the day");
        let later = right + day_us + 61_000_000;
        assert_eq!(
            clock.bound_at(later, day_us + 61_000_000),
            later,
            "taken after a day"
        );
        assert_eq!(
            clock.bound_at(later + 1_000_000, day_us + 62_000_000),
            later + 1_000_000
        );
    }
}
