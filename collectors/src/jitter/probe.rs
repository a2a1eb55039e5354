//! The probe thread: wakes on a fixed grid of absolute deadlines
//! (cyclictest's method) and, when the CPU budget allows (after a random
//! part of another slice, [`spin_threshold_ns`]), spins for a short slice
//! reading the clock (sysjitter's and osnoise's method), from a random
//! instant before the next deadline ([`spin_start_ns`]). One thread does both so that the two probes never delay each
//! other: a spin always ends before the next deadline.
//!
//! The thread rotates over its CPUs (`sched_setaffinity`), a dwell at a time,
//! and closes a window on every multiple of `window_secs` of wall-clock time,
//! so windows line up across nodes. Finished windows wait in [`Shared`] for
//! the collector's next tick.

use std::collections::{BinaryHeap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::procfs::{self, CpuTicks};
use crate::kept::KeptFile;

/// Upper bounds of the Prometheus histogram buckets, in nanoseconds, with
/// their `le` text (Go's shortest form, as client_golang writes it, so that
/// the series line up with other exporters'). `+Inf` follows.
pub const BUCKETS: &[(u64, &str)] = &[
    (1_000, "1e-06"),
    (2_500, "2.5e-06"),
    (5_000, "5e-06"),
    (10_000, "1e-05"),
    (25_000, "2.5e-05"),
    (50_000, "5e-05"),
    (100_000, "0.0001"),
    (250_000, "0.00025"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (100_000_000, "0.1"),
];

/// Wake-ups later than these count as stalls.
pub const STALL_NS: [u64; 2] = [50_000, 500_000];

/// Finished windows kept for the collector; older ones are dropped (counted)
/// if the collector stops harvesting.
const MAX_QUEUED_WINDOWS: usize = 16;

/// Latencies above this are recorded as this in the histogram (its range):
/// an hour, so a stopped agent's or a paused VM's wake-up of a minute reads
/// as the minute it was. The window's largest is kept exactly besides.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// What the thread needs; resolved and checked by the collector.
#[derive(Clone, Debug)]
pub struct Settings {
    /// CPUs to rotate over, at least one.
    pub cpus: Vec<usize>,
    /// Period of the wake-up grid.
    pub interval_ns: u64,
    /// Length of one spin; 0 turns the interruption probe off.
    pub slice_ns: u64,
    /// Clock gaps above this are interruptions.
    pub gap_threshold_ns: u64,
    /// Window length in whole seconds.
    pub window_secs: u64,
    /// Time on one CPU before moving to the next.
    pub dwell_ns: u64,
    /// Share of one core the thread may use.
    pub budget_ratio: f64,
    /// Whether to ask for SCHED_FIFO.
    pub sched_fifo: bool,
    /// Its priority.
    pub fifo_priority: i32,
    /// Gaps kept per window (the largest).
    pub max_gaps: usize,
    /// `<procfs>/stat`.
    pub stat_path: PathBuf,
    /// The thread's own schedstat: `/proc/thread-self/schedstat`, the
    /// agent's procfs rather than `<procfs>`, which is the host's.
    pub schedstat_path: PathBuf,
}

/// How the thread runs, once it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Kernel thread id, for reading its CPU time from outside.
    pub tid: i32,
    /// "SCHED_FIFO priority 1", or "SCHED_OTHER" with the reason when
    /// SCHED_FIFO was asked for and refused.
    pub policy: String,
    /// Whether the run delay can be read (`thread-self/schedstat` exists).
    pub run_delay: bool,
    /// The thread's timer slack after [`set_timer_slack`], in nanoseconds
    /// (`PR_GET_TIMERSLACK`), or why it could not be set.
    pub timer_slack: Result<u64, String>,
}

/// What the thread and the collector share.
#[derive(Default)]
pub struct Shared {
    /// Set by the collector to end the thread.
    pub stop: AtomicBool,
    /// Setup and finished windows.
    pub state: Mutex<State>,
    /// Signalled when the setup is known.
    pub ready: Condvar,
}

/// The mutable part of [`Shared`].
#[derive(Default)]
pub struct State {
    /// The thread's setup, or why it could not start.
    pub setup: Option<Result<Setup, String>>,
    /// Finished windows, oldest first.
    pub windows: VecDeque<Window>,
    /// Windows dropped because nobody harvested them.
    pub dropped_windows: u64,
}

/// One finished window.
#[derive(Debug)]
pub struct Window {
    /// Wall-clock end, microseconds since the epoch.
    pub end_us: i64,
    /// Per CPU probed in the window.
    pub cpus: Vec<CpuWindow>,
    /// The largest gaps of the window, any CPU.
    pub gaps: Vec<Gap>,
    /// A source that failed in the window (the file and what was wrong).
    pub error: Option<String>,
}

/// What one window saw on one CPU.
#[derive(Debug)]
pub struct CpuWindow {
    /// The CPU.
    pub cpu: usize,
    /// Wake-up lateness, nanoseconds.
    pub latency: Histogram<u32>,
    /// Wake-ups per [`BUCKETS`] bucket (not cumulative), `+Inf` last.
    pub buckets: [u64; BUCKETS.len() + 1],
    /// Sum of the lateness, nanoseconds.
    pub latency_sum_ns: u64,
    /// The largest lateness, nanoseconds, exactly.
    pub latency_max_ns: u64,
    /// Wake-ups later than each of [`STALL_NS`].
    pub stalls: [u64; STALL_NS.len()],
    /// Wall time the thread was placed on this CPU.
    pub probed_ns: u64,
    /// The thread's CPU time while placed on it.
    pub thread_cpu_ns: u64,
    /// Time spun.
    pub spin_ns: u64,
    /// Time lost to gaps above the threshold while spinning.
    pub lost_ns: u64,
    /// Gaps above the threshold.
    pub gaps: u64,
    /// Largest gap.
    pub largest_gap_ns: u64,
    /// The thread's run delay while spinning; `None` without schedstat.
    pub run_delay_ns: Option<u64>,
    /// The CPU's irq + softirq ticks while probed, from /proc/stat.
    pub irq_ticks: u64,
    /// The CPU's steal ticks while probed.
    pub steal_ticks: u64,
    /// The CPU's idle and iowait ticks while probed.
    pub idle_ticks: u64,
    /// All the CPU's ticks while probed.
    pub all_ticks: u64,
}

impl CpuWindow {
    pub(super) fn new(cpu: usize, run_delay: bool) -> Self {
        CpuWindow {
            cpu,
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 2)
                .expect("static histogram bounds are valid"),
            buckets: [0; BUCKETS.len() + 1],
            latency_sum_ns: 0,
            latency_max_ns: 0,
            stalls: [0; STALL_NS.len()],
            probed_ns: 0,
            thread_cpu_ns: 0,
            spin_ns: 0,
            lost_ns: 0,
            gaps: 0,
            largest_gap_ns: 0,
            run_delay_ns: run_delay.then_some(0),
            irq_ticks: 0,
            steal_ticks: 0,
            idle_ticks: 0,
            all_ticks: 0,
        }
    }

    pub(super) fn record_wakeup(&mut self, late_ns: u64) {
        self.latency
            .saturating_record(late_ns.clamp(1, MAX_LATENCY_NS));
        let bucket = BUCKETS
            .iter()
            .position(|&(bound, _)| late_ns <= bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[bucket] += 1;
        self.latency_sum_ns = self.latency_sum_ns.saturating_add(late_ns);
        self.latency_max_ns = self.latency_max_ns.max(late_ns);
        for (count, threshold) in self.stalls.iter_mut().zip(STALL_NS) {
            *count += u64::from(late_ns > threshold);
        }
    }
}

/// One interruption of a spin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gap {
    /// Its length (first, so the heap orders by it).
    pub gap_ns: u64,
    /// When it began, microseconds since the epoch.
    pub time_us: i64,
    /// The CPU it was seen on.
    pub cpu: usize,
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The calling thread's CPU time in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The end of the window opening at `now_wall` (ns), after the window that
/// ended at `last_end`: see `Probe::plan_window`.
fn next_window_end(now_wall: i128, last_end: i128, window: i128) -> i128 {
    let next = (now_wall / window + 1) * window;
    if last_end >= next && last_end < next + 2 * window {
        last_end + window
    } else {
        next
    }
}

/// Nanoseconds to add to CLOCK_MONOTONIC for wall-clock time.
fn wall_offset_ns() -> i128 {
    // The agent's clock, which takes a small step of the wall clock in
    // gradually: re-planned from the stepped wall clock, a window was
    // written twice.
    i128::from(vtax_store::clock::now_us()) * 1000 - i128::from(monotonic_ns())
}

/// The tokens a spin waits for: a slice's worth and a random part of
/// another. Spinning as soon as the budget allows repeats with a period of a
/// few wake-ups, a whole fraction of a second, and so samples the same
/// instants of every second: a node whose spins fell on a burst that comes
/// every second (the collectors' ticks on the wall-clock grid, a scrape) saw
/// it as unexplained time for as long as it ran, and its peers did not (the
/// fleet evaluation, bench/fleet/evaluate.py, found healthy agents apart by
/// several times their unexplained share). Random waits spread the spins over
/// every instant, so the share measured is the share of time lost. Below the
/// refill's cap of two slices, so always reached.
fn spin_threshold_ns(slice_ns: u64) -> f64 {
    slice_ns as f64 * (1.0 + fastrand::f64())
}

/// When a spin starts: at a random instant between now and the latest
/// start that still ends it a guard before the next deadline, so that the
/// spins sample every phase of the timer tick and of whatever else comes
/// on a fixed period. Right after the wake-up, a spin always fell at the
/// same offset from the tick (a 10 ms grid and a 4 ms tick meet again
/// every 20 ms): a node whose offset covered the tick lost the tick's
/// cost in every spin and reported it as unexplained, several percent,
/// and a node whose offset did not never saw it (bench/fleet/evaluate.py).
/// None: no room to move, spin now.
fn spin_start_ns(now_ns: u64, next_deadline_ns: u64, slice_ns: u64) -> Option<u64> {
    let latest = next_deadline_ns.checked_sub(slice_ns + SPIN_GUARD_NS)?;
    (latest > now_ns).then(|| fastrand::u64(now_ns..=latest))
}

/// What one spin saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Spun {
    /// Time the loop watched the clock: the spin less the time spent
    /// recording its gaps.
    watched_ns: u64,
    /// Time lost to gaps above the threshold.
    lost_ns: u64,
    /// Gaps above the threshold.
    gaps: u64,
    /// The longest of them.
    largest_gap_ns: u64,
    /// The clock's last reading, where the spin ended.
    ended_ns: u64,
}

/// Reads `clock` in a tight loop from `start_ns` until it reaches `end_ns`;
/// a step longer than `threshold_ns` is a gap, handed to `record` with the
/// time it began.
///
/// The step after a gap starts when `record` has returned, not when the gap
/// ended: recording touches the gap heap and converts the clock, cold after
/// the interruption, and timed as part of the next step it often went over a
/// 1 µs threshold itself, so that one interruption counted as two
/// (bench/jitter/vs_oslat.py counts the gaps beside oslat's). That
/// recording time is neither lost nor watched.
fn spin_until(
    mut clock: impl FnMut() -> u64,
    start_ns: u64,
    end_ns: u64,
    threshold_ns: u64,
    mut record: impl FnMut(u64, u64),
) -> Spun {
    let mut spun = Spun::default();
    let mut last = start_ns;
    loop {
        let mut now = clock();
        let step = now.saturating_sub(last);
        spun.watched_ns += step;
        if step > threshold_ns {
            spun.lost_ns += step;
            spun.gaps += 1;
            spun.largest_gap_ns = spun.largest_gap_ns.max(step);
            record(last, step);
            now = clock();
        }
        last = now;
        if now >= end_ns {
            spun.ended_ns = now;
            return spun;
        }
    }
}

/// Of the run delay read around a spin (`read_ns`, between a read before
/// it and one after), what fell within it. The reads span more than the
/// spin: a preemption in or right after the first read (a neighbour's whole
/// slice) counted as run delay that no gap of the spin held, and the
/// unexplained share, what is lost less the run delay, was clamped to zero.
/// The wall time outside the spin (`outside_ns`, the reads) is taken off,
/// and what is left is at most what the spin lost (`lost_ns`): a wait while
/// spinning is a gap.
fn run_delay_in_spin(read_ns: u64, outside_ns: u64, lost_ns: u64) -> u64 {
    read_ns.saturating_sub(outside_ns).min(lost_ns)
}

/// Room left between a spin's end and the next deadline, for the late
/// wake-up of the sleep before it.
const SPIN_GUARD_NS: u64 = 200_000;

/// The longest a budget skip sleeps.
const MAX_BUDGET_SKIP_NS: u64 = 10_000_000_000;

/// The deadline after `deadline_ns`, on the same grid: every step is a whole
/// number of periods, so the grid keeps its phase for the thread's life (a
/// reference sleeper put on the same deadlines, as the cyclictest bench does,
/// stays on them).
fn next_deadline(
    deadline_ns: u64,
    now_ns: u64,
    interval_ns: u64,
    tokens: f64,
    budget_ratio: f64,
) -> u64 {
    let mut next = deadline_ns + interval_ns;
    if tokens < 0.0 {
        // Over budget on wake-ups alone: skip periods until the budget has
        // caught up. The cap keeps a vanishing budget (below about 4e-6 of a
        // core, where one wake-up owes more) from sleeping for hours, past
        // the agent's stop, or overflowing.
        let owed_ns = ((-tokens / budget_ratio) as u64).min(MAX_BUDGET_SKIP_NS);
        next += owed_ns.div_ceil(interval_ns) * interval_ns;
    }
    if next <= now_ns {
        // Overran (a long stall, a spin, the skip above): back onto the grid
        // after now, as a missed period is not a late one.
        next += (now_ns - next) / interval_ns * interval_ns + interval_ns;
    }
    next
}

fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: ts is a valid timespec; EINTR just ends this sleep early and
    // the wake-up is measured against the same deadline.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

/// Pins the calling thread to `cpu`.
pub(super) fn pin(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays in bounds
    // for cpu < CPU_SETSIZE, which the config checks.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPUs the calling thread may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid for sched_getaffinity to fill.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The timer slack the probe asks for: the least the kernel takes.
const PROBE_TIMER_SLACK_NS: libc::c_ulong = 1;

/// Sets the calling thread's timer slack to [`PROBE_TIMER_SLACK_NS`] and
/// returns the slack the kernel then reports.
///
/// A SCHED_OTHER thread's `clock_nanosleep` may end up to its timer slack
/// (50 µs by default) after the deadline, so that the kernel can fire
/// nearby timers in one interrupt. That lateness is a scheduling policy of
/// this thread, not the platform's: with the default slack the probe's
/// wake-up latency is the platform's plus up to 50 µs, and disagrees with
/// cyclictest (which also sets it; bench/jitter/vs_cyclictest.py). A
/// SCHED_FIFO thread has no slack whatever is set.
fn set_timer_slack() -> Result<u64, String> {
    // SAFETY: PR_SET_TIMERSLACK and PR_GET_TIMERSLACK act on the calling
    // thread and take plain integers.
    unsafe {
        if libc::prctl(libc::PR_SET_TIMERSLACK, PROBE_TIMER_SLACK_NS, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let slack = libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0);
        if slack < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        Ok(slack as u64)
    }
}

/// Asks for SCHED_FIFO when configured; says what the thread got.
fn set_policy(settings: &Settings) -> String {
    if !settings.sched_fifo {
        return "SCHED_OTHER".into();
    }
    let param = libc::sched_param {
        sched_priority: settings.fifo_priority,
    };
    // SAFETY: pid 0 is the calling thread; param is valid.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        format!("SCHED_FIFO priority {}", settings.fifo_priority)
    } else {
        let e = std::io::Error::last_os_error();
        format!("SCHED_OTHER (SCHED_FIFO refused: {e})")
    }
}

/// The window being filled.
struct Filling {
    cpus: Vec<CpuWindow>,
    gaps: BinaryHeap<std::cmp::Reverse<Gap>>,
    error: Option<String>,
    run_delay: bool,
}

impl Filling {
    fn new(run_delay: bool) -> Self {
        Filling {
            cpus: Vec::new(),
            gaps: BinaryHeap::new(),
            error: None,
            run_delay,
        }
    }

    fn cpu(&mut self, cpu: usize) -> &mut CpuWindow {
        let i = match self.cpus.iter().position(|c| c.cpu == cpu) {
            Some(i) => i,
            None => {
                self.cpus.push(CpuWindow::new(cpu, self.run_delay));
                self.cpus.len() - 1
            }
        };
        &mut self.cpus[i]
    }

    fn fail(&mut self, error: String) {
        self.error.get_or_insert(error);
    }

    fn keep_gap(&mut self, gap: Gap, max: usize) {
        if max == 0 {
            return;
        }
        if self.gaps.len() < max {
            self.gaps.push(std::cmp::Reverse(gap));
        } else if self.gaps.peek().is_some_and(|smallest| smallest.0 < gap) {
            self.gaps.pop();
            self.gaps.push(std::cmp::Reverse(gap));
        }
    }
}

/// The thread's sources re-read every dwell or spin.
struct Sources {
    stat: KeptFile,
    schedstat: Option<KeptFile>,
    buf: Vec<u8>,
}

impl Sources {
    fn stat(&mut self) -> Result<Vec<CpuTicks>, String> {
        let len = self
            .stat
            .read(&mut self.buf)
            .map_err(|e| format!("{}: {e}", self.stat.path().display()))?;
        procfs::parse_stat(&self.buf[..len], &self.stat.path().display().to_string())
            .map_err(|e| e.to_string())
    }

    fn run_delay(&mut self) -> Option<Result<u64, String>> {
        let file = self.schedstat.as_mut()?;
        let len = match file.read(&mut self.buf) {
            Ok(len) => len,
            Err(e) => return Some(Err(format!("{}: {e}", file.path().display()))),
        };
        Some(
            procfs::parse_run_delay(&self.buf[..len], &file.path().display().to_string())
                .map_err(|e| e.to_string()),
        )
    }
}

/// Runs the probe until `shared.stop` is set.
pub fn run(settings: Settings, shared: &Shared) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let policy = set_policy(&settings);
    let timer_slack = set_timer_slack();
    let mut sources = Sources {
        stat: KeptFile::new(settings.stat_path.clone()),
        // The descriptor names this thread's task: open it here, not in the
        // collector, since `thread-self` resolves at open time.
        schedstat: std::fs::File::open(&settings.schedstat_path)
            .ok()
            .map(|_| KeptFile::new(settings.schedstat_path.clone())),
        buf: Vec::new(),
    };
    let run_delay = sources.schedstat.is_some();
    if let Some(file) = sources.schedstat.as_mut() {
        // Bind the descriptor now, on this thread.
        let _ = file.read(&mut sources.buf);
    }
    let first_cpu = settings.cpus[0];
    let setup = pin(first_cpu)
        .map_err(|e| format!("cannot pin the probe to CPU {first_cpu}: {e}"))
        .map(|()| Setup {
            tid,
            policy,
            run_delay,
            timer_slack,
        });
    let started = setup.is_ok();
    {
        let mut state = shared.state.lock().expect("not poisoned");
        state.setup = Some(setup);
        shared.ready.notify_all();
    }
    if started {
        Probe::new(settings, sources, run_delay).run(shared);
    }
}

struct Probe {
    settings: Settings,
    sources: Sources,
    filling: Filling,
    cpu_index: usize,
    /// The CPU's ticks when it was last placed or its dwell last closed.
    ticks_at: Option<Vec<CpuTicks>>,
    dwell_started_ns: u64,
    dwell_cpu_time_ns: u64,
    dwell_end_ns: u64,
    window_end_ns: u64,
    window_end_us: i64,
    wall_offset_ns: i128,
    /// CPU time the budget still allows, nanoseconds (may go negative).
    tokens: f64,
    /// Tokens the next spin waits for.
    spin_at_tokens: f64,
    last_ns: u64,
    last_cpu_ns: u64,
}

impl Probe {
    fn new(settings: Settings, mut sources: Sources, run_delay: bool) -> Self {
        let now = monotonic_ns();
        let mut filling = Filling::new(run_delay);
        let ticks_at = match sources.stat() {
            Ok(t) => Some(t),
            Err(e) => {
                filling.fail(e);
                None
            }
        };
        let settings_slice_ns = settings.slice_ns;
        let mut probe = Probe {
            dwell_end_ns: now + settings.dwell_ns,
            settings,
            sources,
            filling,
            cpu_index: 0,
            ticks_at,
            dwell_started_ns: now,
            dwell_cpu_time_ns: thread_cpu_ns(),
            window_end_ns: 0,
            window_end_us: 0,
            wall_offset_ns: 0,
            tokens: 0.0,
            spin_at_tokens: spin_threshold_ns(settings_slice_ns),
            last_ns: now,
            last_cpu_ns: thread_cpu_ns(),
        };
        probe.plan_window();
        probe
    }

    /// Sets the end of the window now open at the next whole multiple of
    /// `window_secs` of wall-clock time, after the end of the window before:
    /// a clock a little behind where the last window was planned (set back,
    /// or taking a step in) gave the same end again, and the window was
    /// written two to four times under one time. A clock set back by more
    /// than two windows starts from the new time (a window waiting for the
    /// old one's end would last as long as the step).
    fn plan_window(&mut self) {
        self.wall_offset_ns = wall_offset_ns();
        let now_wall = i128::from(monotonic_ns()) + self.wall_offset_ns;
        let window = i128::from(self.settings.window_secs) * 1_000_000_000;
        let last_end = i128::from(self.window_end_us) * 1000;
        let end_wall = next_window_end(now_wall, last_end, window);
        self.window_end_ns = (end_wall - self.wall_offset_ns).max(0) as u64;
        self.window_end_us = (end_wall / 1000) as i64;
    }

    fn run(mut self, shared: &Shared) {
        let interval = self.settings.interval_ns;
        let mut next = monotonic_ns() + interval;
        while !shared.stop.load(Ordering::Relaxed) {
            sleep_until(next);
            let woke = monotonic_ns();
            if woke >= self.window_end_ns.saturating_add(interval) {
                self.close_stalled_window(woke, shared);
            }
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() };
            let cpu = usize::try_from(cpu).unwrap_or(self.settings.cpus[self.cpu_index]);
            self.filling
                .cpu(cpu)
                .record_wakeup(woke.saturating_sub(next));
            self.refill(woke);
            let slice = self.settings.slice_ns;
            if slice > 0 && self.tokens >= self.spin_at_tokens {
                if let Some(start) = spin_start_ns(woke, next + interval, slice) {
                    sleep_until(start);
                }
                // Too late to end before the next deadline (woken late, or
                // no room): no spin, which would delay that wake-up and be
                // measured in it.
                if monotonic_ns() + slice < next + interval {
                    self.spin(cpu);
                    self.spin_at_tokens = spin_threshold_ns(slice);
                }
            }
            let now = monotonic_ns();
            if now >= self.dwell_end_ns || now >= self.window_end_ns {
                self.close_dwell(now, now >= self.dwell_end_ns);
            }
            if now >= self.window_end_ns {
                self.close_window(shared);
            }
            next = next_deadline(next, now, interval, self.tokens, self.settings.budget_ratio);
        }
    }

    /// Adds the budget earned since the last wake-up and takes off the CPU
    /// time used since then. The cap keeps a burst after a quiet spell to a
    /// couple of slices.
    fn refill(&mut self, now: u64) {
        let cpu_now = thread_cpu_ns();
        let earned = (now - self.last_ns) as f64 * self.settings.budget_ratio;
        let used = cpu_now.saturating_sub(self.last_cpu_ns) as f64;
        let cap = (2 * self.settings.slice_ns.max(self.settings.interval_ns / 100)) as f64;
        self.tokens = (self.tokens + earned - used).min(cap);
        self.last_ns = now;
        self.last_cpu_ns = cpu_now;
    }

    fn spin(&mut self, cpu: usize) {
        let threshold = self.settings.gap_threshold_ns;
        let read_started = monotonic_ns();
        let before = self.sources.run_delay();
        let start = monotonic_ns();
        let end = start + self.settings.slice_ns;
        let wall_offset_ns = self.wall_offset_ns;
        let max = self.settings.max_gaps;
        let filling = &mut self.filling;
        let spun = spin_until(monotonic_ns, start, end, threshold, |began_ns, gap_ns| {
            let time_us = ((i128::from(began_ns) + wall_offset_ns) / 1000) as i64;
            filling.keep_gap(
                Gap {
                    gap_ns,
                    time_us,
                    cpu,
                },
                max,
            );
        });
        let after = self.sources.run_delay();
        let outside_ns = (start - read_started) + monotonic_ns().saturating_sub(spun.ended_ns);
        let delay = match (before, after) {
            (Some(Ok(a)), Some(Ok(b))) => Some(Ok(run_delay_in_spin(
                b.saturating_sub(a),
                outside_ns,
                spun.lost_ns,
            ))),
            (Some(Err(e)), _) | (_, Some(Err(e))) => Some(Err(e)),
            _ => None,
        };
        let window = self.filling.cpu(cpu);
        window.spin_ns += spun.watched_ns;
        window.lost_ns += spun.lost_ns;
        window.gaps += spun.gaps;
        window.largest_gap_ns = window.largest_gap_ns.max(spun.largest_gap_ns);
        match delay {
            Some(Ok(d)) => {
                if let Some(total) = window.run_delay_ns.as_mut() {
                    *total += d;
                }
            }
            Some(Err(e)) => self.filling.fail(e),
            None => {}
        }
    }

    /// Charges the dwell's wall time, thread CPU time and the CPU's
    /// irq/softirq/steal/idle ticks to the CPU placed on, then moves on to the
    /// next CPU when the dwell is over.
    fn close_dwell(&mut self, now: u64, rotate: bool) {
        let cpu = self.settings.cpus[self.cpu_index];
        let cpu_time = thread_cpu_ns();
        let ticks = match self.sources.stat() {
            Ok(t) => Some(t),
            Err(e) => {
                self.filling.fail(e);
                None
            }
        };
        let window = self.filling.cpu(cpu);
        window.probed_ns += now - self.dwell_started_ns;
        window.thread_cpu_ns += cpu_time.saturating_sub(self.dwell_cpu_time_ns);
        if let (Some(before), Some(after)) = (&self.ticks_at, &ticks) {
            let find = |t: &[CpuTicks]| t.iter().find(|t| t.cpu == cpu).copied();
            if let (Some(a), Some(b)) = (find(before), find(after)) {
                window.irq_ticks += b.irq.saturating_sub(a.irq);
                window.steal_ticks += b.steal.saturating_sub(a.steal);
                window.idle_ticks += b.idle.saturating_sub(a.idle);
                window.all_ticks += b.total.saturating_sub(a.total);
            }
        }
        self.ticks_at = ticks;
        self.dwell_started_ns = now;
        self.dwell_cpu_time_ns = cpu_time;
        if rotate {
            self.dwell_end_ns = now + self.settings.dwell_ns;
            if self.settings.cpus.len() > 1 {
                self.cpu_index = (self.cpu_index + 1) % self.settings.cpus.len();
                let next = self.settings.cpus[self.cpu_index];
                if let Err(e) = pin(next) {
                    self.filling
                        .fail(format!("cannot move the probe to CPU {next}: {e}"));
                }
            }
        }
    }

    /// Closes the window at its end when the thread did not run across it
    /// (the agent stopped, the VM paused): the window holds what it measured
    /// up to its end, not the stall's wall time after it, and the late
    /// wake-up that ends the stall goes to the window it came in, which
    /// starts at its own start. The CPU's ticks since the last dwell mix the
    /// stall's in and are charged to neither.
    fn close_stalled_window(&mut self, woke: u64, shared: &Shared) {
        self.ticks_at = None;
        let end = self.window_end_ns.max(self.dwell_started_ns);
        self.close_dwell(end, false);
        self.close_window(shared);
        let window = self.settings.window_secs * 1_000_000_000;
        let start = self.window_end_ns.saturating_sub(window);
        self.dwell_started_ns = self.dwell_started_ns.max(start).min(woke);
    }

    fn close_window(&mut self, shared: &Shared) {
        let run_delay = self.filling.run_delay;
        let filling = std::mem::replace(&mut self.filling, Filling::new(run_delay));
        let mut gaps: Vec<Gap> = filling.gaps.into_iter().map(|g| g.0).collect();
        gaps.sort_by_key(|g| g.time_us);
        let mut cpus = filling.cpus;
        cpus.sort_by_key(|c| c.cpu);
        let window = Window {
            end_us: self.window_end_us,
            cpus,
            gaps,
            error: filling.error,
        };
        {
            let mut state = shared.state.lock().expect("not poisoned");
            if state.windows.len() >= MAX_QUEUED_WINDOWS {
                state.windows.pop_front();
                state.dropped_windows += 1;
            }
            state.windows.push_back(window);
        }
        self.plan_window();
    }
}

/// Waits up to `timeout` for the thread's setup.
pub fn wait_setup(shared: &Shared, timeout: Duration) -> Option<Result<Setup, String>> {
    let state = shared.state.lock().expect("not poisoned");
    let (state, _) = shared
        .ready
        .wait_timeout_while(state, timeout, |s| s.setup.is_none())
        .expect("not poisoned");
    state.setup.clone()
}

#[cfg(test)]
mod tests {
    use super::{
        next_deadline, next_window_end, run_delay_in_spin, spin_start_ns, spin_threshold_ns, spin_until, CpuWindow,
        Spun, BUCKETS, SPIN_GUARD_NS, STALL_NS,
    };

    /// A window opens after the one before ends, though the clock read a
    /// little behind it (a leap second, a step being taken in): the same end
    /// again wrote a window two to four times. Set back by more, the clock
    /// starts windows from its new time.
    #[test]
    fn a_window_ends_after_the_one_before() {
        let w: i128 = 10_000_000_000;
        let t: i128 = 1_796_640_000 * 1_000_000_000;
        assert_eq!(next_window_end(t + 3, t, w), t + w, "on time");
        assert_eq!(next_window_end(t - 1_000_000_000, t, w), t + w, "a second back");
        assert_eq!(next_window_end(t - 3600 * 1_000_000_000, t, w), t - 3590 * 1_000_000_000);
        assert_eq!(next_window_end(t + 3600 * 1_000_000_000, t, w), t + 3610 * 1_000_000_000);
    }

    const MS: u64 = 1_000_000;

    /// A spin starts anywhere from now to a guard and a slice before the
    /// next deadline, spread over that whole span.
    #[test]
    fn a_spin_starts_at_a_random_point_that_ends_before_the_next_deadline() {
        let (now, next, slice) = (1_000_000, 11_000_000, 200_000);
        let starts: Vec<u64> = (0..1000)
            .map(|_| spin_start_ns(now, next, slice).unwrap())
            .collect();
        assert!(starts
            .iter()
            .all(|&s| s >= now && s + slice + SPIN_GUARD_NS <= next));
        let early = starts.iter().filter(|&&s| s < 5_800_000).count();
        assert!((350..650).contains(&early), "{early} of 1000 in the first half");
        assert_eq!(spin_start_ns(now, now + slice + SPIN_GUARD_NS, slice), None);
        assert_eq!(spin_start_ns(now, slice, slice), None, "no underflow");
    }

    /// Spins wait for a slice's worth of budget and a random part of
    /// another, never past the refill's cap (two slices), and not the same
    /// wait every time: a fixed one would make the spins periodic.
    #[test]
    fn a_spin_waits_for_a_random_part_of_a_second_slice() {
        let slice = 200_000;
        let waits: Vec<f64> = (0..1000).map(|_| spin_threshold_ns(slice)).collect();
        assert!(waits.iter().all(|&w| (200_000.0..400_000.0).contains(&w)));
        let low = waits.iter().filter(|&&w| w < 300_000.0).count();
        assert!((350..650).contains(&low), "{low} of 1000 below the middle");
    }

    /// A neighbour's slice taken in the read before the spin is not the
    /// spin's run delay (27 of 241 windows under load read more run delay
    /// than time lost, and their unexplained share was clamped to 0); one
    /// taken within the spin is, as far as the spin lost time.
    #[test]
    fn run_delay_outside_the_spin_is_not_charged_to_it() {
        // 3 ms preempted in the first read, nothing lost while spinning.
        assert_eq!(run_delay_in_spin(3_000_000, 3_004_000, 0), 0);
        // 3 ms preempted while spinning: the gap holds it.
        assert_eq!(run_delay_in_spin(3_000_000, 4_000, 3_001_000), 2_996_000);
        // Both: the part within the spin.
        assert_eq!(
            run_delay_in_spin(5_000_000, 2_004_000, 3_001_000),
            2_996_000
        );
        // A gap longer than the run delay (steal, an interrupt): the delay.
        assert_eq!(run_delay_in_spin(1_000_000, 4_000, 6_000_000), 996_000);
    }

    /// A clock that returns `reads` in turn, then stays at the last.
    fn scripted_clock(reads: &[u64]) -> impl FnMut() -> u64 + '_ {
        let mut next = 0;
        move || {
            let now = reads[next.min(reads.len() - 1)];
            next += 1;
            now
        }
    }

    /// One interruption, then a recording slow enough (1.5 µs, over the
    /// 1 µs threshold) to be a gap of its own if it were timed: one gap,
    /// and the recording's time is neither lost nor watched.
    #[test]
    fn a_slow_recording_after_a_gap_is_not_a_second_gap() {
        let reads = [100, 200, 5_200, 6_700, 6_800, 7_000];
        let mut recorded = Vec::new();
        let spun = spin_until(scripted_clock(&reads), 0, 7_000, 1_000, |began, gap| {
            recorded.push((began, gap))
        });
        assert_eq!(recorded, [(200, 5_000)]);
        assert_eq!(
            spun,
            Spun {
                watched_ns: 7_000 - 1_500,
                lost_ns: 5_000,
                gaps: 1,
                largest_gap_ns: 5_000,
                ended_ns: 7_000,
            }
        );
    }

    /// Steps at or under the threshold are not gaps; the spin ends on the
    /// first read at or past its end.
    #[test]
    fn a_spin_without_interruptions_watches_its_whole_slice() {
        let reads = [400, 1_400, 2_400, 2_900, 3_000, 9_999];
        let spun = spin_until(scripted_clock(&reads), 0, 3_000, 1_000, |_, _| {
            panic!("no gap")
        });
        assert_eq!(
            spun,
            Spun {
                watched_ns: 3_000,
                ended_ns: 3_000,
                ..Spun::default()
            }
        );
    }

    #[test]
    fn the_next_deadline_is_one_period_on_when_on_time_and_in_budget() {
        assert_eq!(
            next_deadline(5 * MS + 123, 5 * MS + 200_000, MS, 10.0, 0.01),
            6 * MS + 123
        );
    }

    #[test]
    fn an_overrun_skips_to_the_first_deadline_after_now_on_the_same_grid() {
        // Done almost 4 ms after the deadline: the ones already past are
        // missed, and the next is the first still ahead, 123 ns after now.
        let next = next_deadline(5 * MS + 123, 9 * MS, MS, 10.0, 0.01);
        assert_eq!(next, 9 * MS + 123);
    }

    #[test]
    fn a_budget_skip_is_whole_periods_and_keeps_the_phase() {
        // 25 us over a 1% budget is owed 2.5 ms: three whole periods are
        // skipped, not 2.5, so the deadlines stay at .123 ms past each ms.
        let next = next_deadline(5 * MS + 123, 5 * MS + 100_000, MS, -25_000.0, 0.01);
        assert_eq!(next, 9 * MS + 123);
        assert_eq!(next % MS, 123);
    }

    #[test]
    fn a_skip_after_an_overrun_lands_on_the_grid_after_now() {
        // Done 15 ms late and owing 2.5 ms: now is past every skipped deadline.
        let next = next_deadline(5 * MS + 123, 20 * MS, MS, -25_000.0, 0.01);
        assert_eq!(next, 20 * MS + 123);
        // Done exactly on the next deadline: that one is missed, not taken.
        assert_eq!(next_deadline(5 * MS, 6 * MS, MS, 1.0, 0.01), 7 * MS);
    }

    #[test]
    fn a_vanishing_budget_skips_at_most_ten_seconds_and_keeps_the_phase() {
        let next = next_deadline(5 * MS + 123, 5 * MS + 200_000, MS, -40_000.0, 1e-12);
        assert_eq!(next, 5 * MS + 123 + MS + 10_000 * MS);
    }

    /// The stall counts are kept in the store only: on /metrics the
    /// histogram's count minus its bucket at each threshold must give them.
    #[test]
    fn the_histogram_counts_the_stalls_at_each_threshold() {
        let mut window = CpuWindow::new(0, false);
        for late_ns in [
            1,
            49_999,
            50_000,
            50_001,
            499_999,
            500_000,
            500_001,
            9_000_000_000,
        ] {
            window.record_wakeup(late_ns);
        }
        let count: u64 = window.buckets.iter().sum();
        for (i, threshold) in STALL_NS.into_iter().enumerate() {
            let bound = BUCKETS
                .iter()
                .position(|&(bound, _)| bound == threshold)
                .unwrap_or_else(|| panic!("no bucket bound at {threshold} ns"));
            let at_most: u64 = window.buckets[..=bound].iter().sum();
            assert_eq!(count - at_most, window.stalls[i], "over {threshold} ns");
        }
        assert_eq!(window.stalls, [5, 2]);
    }
}
