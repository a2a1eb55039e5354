//! The collector: walks when something changed, then reads each cgroup's
//! files into its row every tick.

use super::*;

/// With the hierarchy watched, the longest time between two walks (or
/// `rescan_interval_secs`, if longer): a net under the watch for changes it
/// cannot see (a cgroup made through a mount of another cgroup namespace,
/// should the kernel not report it here).
pub const WATCHED_WALK_INTERVAL_SECS: f64 = 60.0;

/// The cgroups collector.
pub struct Cgroups {
    pub(super) root: PathBuf,
    pub(super) selection: Selection,
    pub(super) hz: f64,
    pub(super) layout: Option<Layout>,
    pub(super) discovery: Discovery,
    /// When the last walk ran; `None` forces one.
    pub(super) walked_at: Option<i64>,
    /// Whether the next tick reads the settings (limits): set by each walk.
    pub(super) settings_due: bool,
    /// When the last tick that read every file of every cgroup ran.
    pub(super) full_read_at: Option<i64>,
    /// Whether walks wait for the watch to see a change (on unless
    /// `rescan_interval_secs` is 0, which walks on every read).
    pub(super) watch_changes: bool,
    /// The watch over the directories of the last walk; `None` when there is
    /// none (then the hierarchy is walked every `rescan_interval_secs`).
    pub(super) watch: Option<CgroupWatch>,
    /// Why the hierarchy is not watched, once that is known.
    pub(super) unwatched: Option<String>,
    /// Walks since the collector was made.
    pub(super) walks: u64,
    /// One buffer for every file of a tick.
    pub(super) buf: Vec<u8>,
    /// Files that read badly at the last tick: each costs only its own
    /// fields of its own cgroup's row.
    pub(super) errors: Vec<ParseError>,
}

impl Cgroups {
    /// A cgroups collector reading under `<sysfs>/fs/cgroup`.
    pub fn new(config: &CgroupsConfig, roots: &Roots) -> Self {
        Cgroups {
            root: roots.sys("fs/cgroup"),
            selection: Selection::new(config),
            hz: super::super::user_hz(),
            layout: None,
            discovery: Discovery::default(),
            walked_at: None,
            settings_due: true,
            full_read_at: None,
            watch_changes: config.rescan_interval_secs > 0.0,
            watch: None,
            unwatched: None,
            walks: 0,
            buf: vec![0; 8192],
            errors: Vec::new(),
        }
    }

    pub(super) fn rewalk(&mut self, time_us: i64) -> anyhow::Result<()> {
        if self.layout.is_none() {
            self.layout = Some(detect(&self.root).map_err(anyhow::Error::msg)?);
        }
        let layout = self.layout.as_ref().expect("set above");
        // A fresh watch each walk: closing the old one drops its watches,
        // including those of cgroups gone since.
        self.watch = None;
        let mut watch = None;
        let mut unwatched = None;
        if self.watch_changes {
            match CgroupWatch::new(layout.limit_files()) {
                Ok(w) => watch = Some(w),
                Err(e) => unwatched = Some(e),
            }
        }
        let old = std::mem::take(&mut self.discovery);
        let (discovery, watch_failed) = walk(layout, &self.selection, &mut watch, &old);
        // Workloads left out are said when it starts and ends, not only by
        // the doctor: jobs made while the bound holds are never sampled.
        match (old.skipped, discovery.skipped) {
            (0, 0) => {}
            (0, skipped) => tracing::warn!(
                skipped,
                max_cgroups = self.selection.max_cgroups(),
                "More cgroups than collectors.cgroups.max_cgroups: those over it are not sampled (the ones already sampled are kept, new ones left out) until fewer remain."
            ),
            (_, 0) => tracing::info!(
                max_cgroups = self.selection.max_cgroups(),
                "Every cgroup is sampled again: fewer than collectors.cgroups.max_cgroups remain."
            ),
            _ => {}
        }
        self.discovery = discovery;
        keep_open(&mut self.discovery.targets, old.targets);
        unwatched = unwatched.or(watch_failed);
        if self.watch_changes && unwatched.is_some() && self.unwatched != unwatched {
            tracing::info!(
                reason = unwatched.as_deref().unwrap_or_default(),
                rescan_interval_secs = self.selection.rescan_interval_secs(),
                "Cgroup changes are not watched; the hierarchy is walked every rescan_interval_secs instead."
            );
        }
        self.unwatched = unwatched;
        self.watch = watch;
        self.walked_at = Some(time_us);
        self.settings_due = true;
        self.walks += 1;
        Ok(())
    }

    /// Whether this tick walks: the first, after a cgroup vanished, when the
    /// watch saw a change or has watched for `WATCHED_WALK_INTERVAL_SECS`,
    /// and without a watch every `rescan_interval_secs`.
    pub(super) fn walk_due(&mut self, time_us: i64) -> bool {
        let Some(watch) = self.watch.as_mut() else {
            return self.selection.rescan_due(self.walked_at, time_us);
        };
        let net_us = self
            .selection
            .rescan_us
            .max((WATCHED_WALK_INTERVAL_SECS * 1e6) as i64);
        // Events are read on every tick, so that they do not pile up.
        watch.changed() || due(self.walked_at, time_us, net_us)
    }

    /// Reads every target into a batch; a vanished cgroup forces a walk next
    /// tick. Measurements are read through descriptors kept open; settings only
    /// on the tick after a walk, their values repeated in between. A quiet
    /// cgroup's usage-following files are skipped, their values repeated from
    /// its last full read; the tick after a walk reads every file of every
    /// cgroup, so no repeated value is older than `rescan_interval_secs`. A
    /// file that reads badly costs only its fields of its cgroup's row and is
    /// kept in `errors`; the tick fails only when no cgroup gave a row.
    pub(super) fn read_all(&mut self, time_us: i64) -> Result<Batch, ParseError> {
        let mut builder = BatchBuilder::new(&CGROUP);
        let mut vanished = false;
        let settings = self.settings_due;
        // Quiet cgroups are read whole after each walk and every
        // `rescan_interval_secs`, so that no repeated value is older.
        let full = settings || self.selection.rescan_due(self.full_read_at, time_us);
        if full {
            self.full_read_at = Some(time_us);
        }
        let mut pushed = 0;
        for target in &mut self.discovery.targets {
            let mut row = Row::new();
            // A limit that read badly is read again at the next tick, not at
            // the next walk.
            let settings = settings || target.settings_failed;
            let mut setting_failed = false;
            let errors_before = self.errors.len();
            let errors = &mut self.errors;
            // Outside cgroupfs a deleted file stays readable: one fstat per
            // cgroup per tick, on its first file read through a kept descriptor.
            let mut check = target.check_deleted;
            // The usage (CPU time, memory charge), pressure and settings first:
            // they say whether the rest is worth reading.
            let mut read = |target: &mut Target, row: &mut Row, follows_usage: bool| {
                let slots = target.slots.iter_mut();
                for slot in slots.filter(|s| s.source.follows_usage() == follows_usage) {
                    match read_slot(slot, &mut self.buf, row, self.hz, settings, &mut check) {
                        Ok(true) => return true,
                        Ok(false) => {}
                        // A file that reads badly costs its own fields of
                        // this cgroup's row, not the row nor other cgroups'.
                        Err(e) => {
                            row.forget(slot.source);
                            setting_failed |= slot.source.is_setting();
                            errors.push(e);
                        }
                    }
                }
                false
            };
            let mut gone = read(target, &mut row, false);
            let quiet = !gone && !full && target.quiet(&row);
            if quiet {
                let last = target.last_full.as_mut().expect("quiet needs a full read");
                for slot in target.slots.iter().filter(|s| s.source.follows_usage()) {
                    for (_, fill) in slot.source.fills() {
                        fill.copy(last, &mut row.values);
                    }
                }
            } else if !gone {
                gone = read(target, &mut row, true);
            }
            if gone {
                // A cgroup that went mid-read (its container exited) is no
                // error: what its files held before they went is not kept.
                self.errors.truncate(errors_before);
                // Let go of its files: a walk that finds the path again opens them afresh.
                for slot in &mut target.slots {
                    slot.file.close();
                    slot.kept = false;
                }
                vanished = true;
                continue;
            }
            let failed = self.errors.len() > errors_before;
            if settings {
                if let (Some(quota), Some(period)) = (row.quota_us, row.period_us) {
                    if quota > 0 && period > 0 {
                        row.values.cpu_quota_cpus = Some(quota as f64 / period as f64);
                    }
                }
                target.quota = row.values.cpu_quota_cpus;
                target.limit = row.values.memory_limit_bytes;
                target.quota_read = row.quota_us.is_some();
                target.settings_failed = setting_failed;
            } else {
                row.values.cpu_quota_cpus = target.quota;
                row.values.memory_limit_bytes = target.limit;
            }
            if failed {
                // Nulls are not repeated: the next tick reads every file of it.
                target.last_full = None;
            } else if !quiet {
                target.last_full = Some(row.values.clone());
            }
            if row.values == CgroupRow::default() && !target.quota_read {
                continue; // nothing readable: no row rather than a row of nulls
            }
            let values = CgroupRow {
                path: &target.path,
                workload: target.workload,
                ..row.values
            };
            builder
                .push_row(time_us, &values)
                .map_err(|e| error(Path::new(&target.path), 0, e.to_string()))?;
            pushed += 1;
        }
        if vanished {
            self.walked_at = None;
        }
        self.settings_due = false;
        if pushed == 0 && !self.errors.is_empty() {
            // Nothing read well: the hierarchy is bad, not a file of it.
            return Err(self.errors.remove(0));
        }
        Ok(builder.finish())
    }
}

/// Reads one file of a cgroup into `row`; `Ok(true)` when the cgroup is gone.
/// A setting is read only on a `settings` tick and closed after it; a file
/// absent since the last walk is skipped. `check` asks for one `fstat` on the
/// first file read through a kept descriptor (outside cgroupfs, where a
/// deleted file stays readable) and is cleared once it has been done.
pub(super) fn read_slot(
    slot: &mut Slot,
    buf: &mut Vec<u8>,
    row: &mut Row,
    hz: f64,
    settings: bool,
    check: &mut bool,
) -> Result<bool, ParseError> {
    let setting = slot.source.is_setting();
    if slot.absent || (setting && !settings) {
        return Ok(false);
    }
    let was_kept = slot.kept;
    let mut read = slot.file.read(buf);
    if was_kept && matches!(&read, Err(e) if super::super::kept::is_gone(e)) {
        // The descriptor was of a cgroup removed since; one made again at the
        // same path (a restarted service) is opened afresh.
        read = slot.file.read(buf);
    }
    if setting {
        slot.file.close(); // read again at the next rescan only
    }
    slot.kept = !setting && read.is_ok();
    match read {
        Ok(n) => {
            if *check && was_kept && slot.kept {
                *check = false;
                if slot.file.is_deleted() {
                    return Ok(true);
                }
            }
            let path = slot.file.path();
            let text =
                std::str::from_utf8(&buf[..n]).map_err(|_| error(path, 0, "not UTF-8 text"))?;
            parse(slot.source, text, path, row, hz)?;
            Ok(false)
        }
        Err(e) => match failed_read(&e, || {
            slot.file.path().parent().is_some_and(|d| d.is_dir())
        }) {
            FailedRead::Gone => Ok(true),
            FailedRead::Absent => {
                slot.file.close();
                slot.absent = true;
                Ok(false)
            }
            FailedRead::Error => Err(error(slot.file.path(), 0, e.to_string())),
        },
    }
}

/// What a cgroup file's failed read means.
#[derive(Debug, PartialEq)]
pub(super) enum FailedRead {
    /// The cgroup went (its container exited).
    Gone,
    /// The cgroup is there and this file has nothing to give until the next
    /// walk: skipped, no error.
    Absent,
    /// A fault worth naming among the source errors.
    Error,
}

/// Classes a failed read; `cgroup_is_there` is asked only for a file not
/// found.
pub(super) fn failed_read(e: &std::io::Error, cgroup_is_there: impl FnOnce() -> bool) -> FailedRead {
    if super::super::kept::is_gone(e) {
        // The cgroup is there, this file is not (controller off, no swap
        // accounting), or the cgroup is not.
        if cgroup_is_there() {
            FailedRead::Absent
        } else {
            FailedRead::Gone
        }
    } else if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // The kernel lists the file and refuses to read it: with PSI off
        // (psi=0, CONFIG_PSI_DEFAULT_DISABLED) every cgroup keeps its
        // pressure files and each read fails so. The host collector names
        // psi=0 among its problems; an error for each cgroup's file every
        // tick would say nothing more.
        FailedRead::Absent
    } else {
        FailedRead::Error
    }
}

impl Collector for Cgroups {
    fn name(&self) -> &'static str {
        "cgroups"
    }

    fn probe(&mut self) -> Availability {
        self.layout = None;
        if let Err(e) = self.rewalk(0) {
            return Availability::Absent(e.to_string());
        }
        self.walked_at = None; // the first collect walks again, at its own time
        let layout = self.layout.as_ref().expect("rewalk detected it");
        let found = format!(
            "{} cgroups within depth {}{}",
            self.discovery.targets.len(),
            self.selection.max_depth(),
            if self.discovery.skipped > 0 {
                format!(" ({} over max_cgroups skipped)", self.discovery.skipped)
            } else {
                String::new()
            }
        );
        let walks = match (&self.watch, &self.unwatched) {
            (Some(watch), _) => format!(
                "; walked when inotify reports a change ({} directories watched)",
                watch.watched
            ),
            (None, Some(reason)) => format!(
                "; walked every {} s ({reason})",
                self.selection.rescan_interval_secs()
            ),
            (None, None) => "; walked on every read".to_string(),
        };
        Availability::Available(if layout.unified {
            format!(
                "cgroup v2 (controllers: {}), {found}{walks}",
                layout.controllers
            )
        } else {
            let names: Vec<&str> = layout.hierarchies.iter().map(|h| h.name.as_str()).collect();
            format!("cgroup v1 ({}), {found}{walks}", names.join(" "))
        })
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.errors.clear();
        if self.walk_due(time_us) {
            self.rewalk(time_us)?;
        }
        let batch = self.read_all(time_us)?;
        Ok(if batch.is_empty() {
            Vec::new()
        } else {
            vec![batch]
        })
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }

    fn left_out(&self) -> u64 {
        (self.discovery.skipped + self.discovery.not_utf8) as u64
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(broken) = self.selection.broken() {
            problems.push(format!("{broken}: no cgroup is sampled"));
        }
        if self.discovery.skipped > 0 {
            problems.push(format!(
                "{} cgroups over collectors.cgroups.max_cgroups = {} are not sampled: raise it, or narrow include/exclude or max_depth",
                self.discovery.skipped,
                self.selection.max_cgroups()
            ));
        }
        if self.discovery.not_utf8 > 0 {
            problems.push(format!(
                "{} cgroup directories have names that are not UTF-8: they and the cgroups below them are not sampled (a path is a label, which must be UTF-8); their use counts in their parents' only",
                self.discovery.not_utf8
            ));
        }
        problems
    }
}
