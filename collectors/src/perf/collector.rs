//! The collector: which cgroups' counters are open, and their reads each
//! tick into rates.

use super::*;

/// At most this many problems of one kind are kept for `vtax doctor`.
pub(super) const PROBLEMS_KEPT: usize = 5;

/// The perf collector.
pub struct Perf {
    pub(super) cgroup_root: PathBuf,
    pub(super) cpus_online: PathBuf,
    pub(super) paranoid: PathBuf,
    pub(super) selection: Selection,
    pub(super) max_counters: usize,
    pub(super) source: Box<dyn CounterSource>,
    /// Whether the hierarchy must be a cgroup filesystem (not in the tests'
    /// temporary trees; a fixture tree never gets counters opened).
    pub(super) require_cgroupfs: bool,
    pub(super) hierarchy: Option<PathBuf>,
    /// What the probe found, for the doctor.
    pub(super) layout: String,
    /// The events the probe could open.
    pub(super) events: Vec<HwEvent>,
    /// Why last-level cache misses are not counted, when they are not.
    pub(super) llc_unavailable: Option<String>,
    pub(super) cpus: Vec<usize>,
    pub(super) targets: Vec<Target>,
    pub(super) walked_at: Option<i64>,
    /// Leaf cgroups the last walk left out for `max_counters`.
    pub(super) over_max_counters: usize,
    /// Cgroups whose counters did not open at the last walk, and why.
    pub(super) open_failures: Vec<String>,
    /// Readings skipped as impossible, and the last few.
    pub(super) bad_readings: u64,
    pub(super) bad_reading_examples: Vec<String>,
    /// The totals of the collector this one replaced at a reload, by cgroup
    /// path with the inode they were counted for: taken up at the first
    /// walk that opens the same cgroup.
    pub(super) carried_totals: BTreeMap<String, (u64, [u64; 3])>,
}

impl Perf {
    /// A perf collector counting through `perf_event_open`.
    pub fn new(config: &PerfConfig, cgroups: &CgroupsConfig, roots: &Roots) -> Self {
        Perf::with_source(config, cgroups, roots, Box::new(PerfEventSource))
    }

    /// A perf collector counting through `source`.
    pub fn with_source(
        config: &PerfConfig,
        cgroups: &CgroupsConfig,
        roots: &Roots,
        source: Box<dyn CounterSource>,
    ) -> Self {
        Perf {
            cgroup_root: roots.sys("fs/cgroup"),
            cpus_online: roots.sys("devices/system/cpu/online"),
            paranoid: roots.proc("sys/kernel/perf_event_paranoid"),
            selection: Selection::new(cgroups),
            max_counters: config.max_counters.max(1) as usize,
            source,
            require_cgroupfs: true,
            hierarchy: None,
            layout: String::new(),
            events: Vec::new(),
            llc_unavailable: None,
            cpus: Vec::new(),
            targets: Vec::new(),
            walked_at: None,
            over_max_counters: 0,
            open_failures: Vec::new(),
            bad_readings: 0,
            bad_reading_examples: Vec::new(),
            carried_totals: BTreeMap::new(),
        }
    }

    pub(super) fn paranoid(&self) -> Option<i32> {
        std::fs::read_to_string(&self.paranoid)
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    pub(super) fn online_cpus(&self) -> Result<Vec<usize>, String> {
        let text = std::fs::read_to_string(&self.cpus_online)
            .map_err(|e| format!("{}: {e}", self.cpus_online.display()))?;
        parse_cpu_list(&text).map_err(|e| format!("{}: {e}", self.cpus_online.display()))
    }

    /// Finds the hierarchy and the online CPUs, and opens each event once on
    /// the hierarchy's root: the PMU answers here, before any cgroup is walked.
    pub(super) fn check(&mut self) -> Result<(), String> {
        let (hierarchy, layout) = perf_hierarchy(&self.cgroup_root)?;
        if self.require_cgroupfs && !on_cgroupfs(&hierarchy) {
            return Err(format!(
                "{} is not a cgroup filesystem: perf counts cgroups only there",
                hierarchy.display()
            ));
        }
        let cpus = self.online_cpus()?;
        let dir = File::open(&hierarchy).map_err(|e| format!("{}: {e}", hierarchy.display()))?;
        let mut events = Vec::new();
        self.llc_unavailable = None;
        for event in HwEvent::ALL {
            match self.source.open("/", &dir, cpus[0], event) {
                Ok(_counter) => events.push(event),
                Err(e) => {
                    let reason = unavailable_reason(event, &e, self.paranoid());
                    if event != HwEvent::LlcMisses {
                        return Err(reason);
                    }
                    self.llc_unavailable = Some(reason);
                }
            }
        }
        self.hierarchy = Some(hierarchy);
        self.layout = layout;
        self.events = events;
        self.cpus = cpus;
        Ok(())
    }

    /// The leaf cgroups to count, in the selection's order, and how many the
    /// selection itself left out.
    pub(super) fn select(&self, hierarchy: &Path) -> (Vec<String>, usize) {
        let counted: std::collections::BTreeSet<&str> = self.targets.iter().map(|t| t.path.as_str()).collect();
        let (selected, skipped) = self.selection.bound(
            self.selection.list(&[hierarchy], &mut |_| {}).0,
            |path| counted.contains(path),
        );
        let paths: Vec<&str> = selected.iter().map(|(p, _)| p.as_str()).collect();
        let leaves = leaves(&paths);
        let chosen = selected
            .iter()
            .filter(|(p, _)| leaves.contains(p))
            .map(|(p, _)| p.clone())
            .collect();
        (chosen, skipped)
    }

    pub(super) fn counters_per_cgroup(&self) -> usize {
        (self.events.len() * self.cpus.len()).max(1)
    }

    /// Walks the hierarchy: keeps the counters of cgroups found again, opens
    /// them for new ones (up to `max_counters`), closes those of the rest.
    pub(super) fn rewalk(&mut self, time_us: i64) -> anyhow::Result<()> {
        let hierarchy = self.hierarchy.clone().expect("probed before collecting");
        let cpus = self.online_cpus().map_err(anyhow::Error::msg)?;
        if cpus != self.cpus {
            // CPUs came or went: every cgroup's counters are opened again on
            // the new set; the totals go on.
            self.cpus = cpus;
            for target in &mut self.targets {
                target.slots.clear();
            }
        }
        let (chosen, _) = self.select(&hierarchy);
        let room = self.max_counters / self.counters_per_cgroup();
        self.over_max_counters = chosen.len().saturating_sub(room);
        let mut old: BTreeMap<String, Target> = std::mem::take(&mut self.targets)
            .into_iter()
            .map(|t| (t.path.clone(), t))
            .collect();
        self.open_failures.clear();
        let mut refused: Option<String> = None;
        for path in chosen.into_iter().take(room) {
            let dir = hierarchy.join(path.trim_start_matches('/'));
            // The same cgroup (same inode) keeps its counters, or when the
            // CPUs changed, at least its totals.
            let previous = old
                .remove(&path)
                .filter(|t| std::fs::metadata(&t.dir).is_ok_and(|m| m.ino() == t.inode));
            let carried = match previous {
                Some(target) if !target.slots.is_empty() => {
                    self.targets.push(target);
                    continue;
                }
                Some(target) => Some((target.inode, target.totals)),
                None => self.carried_totals.remove(&path),
            };
            match self.open_target(&path, &dir) {
                Ok(Some(mut target)) => {
                    if let Some((_, totals)) = carried.filter(|(inode, _)| *inode == target.inode) {
                        target.totals = totals;
                    }
                    self.targets.push(target);
                }
                Ok(None) => {} // gone since it was listed
                Err(e) => {
                    let reason = match e.raw_os_error() {
                        Some(_) => unavailable_reason(e.event, &e.error, self.paranoid()),
                        None => e.error.to_string(),
                    };
                    if self.open_failures.len() < PROBLEMS_KEPT {
                        self.open_failures.push(format!("{path}: {reason}"));
                    }
                    let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    refused.get_or_insert(reason);
                    if out_of_fds {
                        break; // every further cgroup would fail the same way
                    }
                }
            }
        }
        self.targets.sort_by(|a, b| a.path.cmp(&b.path));
        self.walked_at = Some(time_us);
        match refused {
            // Nothing could be counted for a reason that is not churn: the
            // tick fails with it (the PMU was taken away, the limit lowered).
            Some(reason) if self.targets.is_empty() => anyhow::bail!("{reason}"),
            _ => Ok(()),
        }
    }

    /// Opens every event on every CPU for one cgroup; `None` when its
    /// directory is gone.
    pub(super) fn open_target(&mut self, path: &str, dir: &Path) -> Result<Option<Target>, OpenError> {
        let file = match File::open(dir) {
            Ok(f) => f,
            Err(e) if super::super::kept::is_gone(&e) => return Ok(None),
            Err(error) => {
                return Err(OpenError {
                    event: HwEvent::Cycles,
                    error,
                })
            }
        };
        let inode = match file.metadata() {
            Ok(m) => m.ino(),
            Err(error) => {
                return Err(OpenError {
                    event: HwEvent::Cycles,
                    error,
                })
            }
        };
        let mut slots = Vec::with_capacity(self.counters_per_cgroup());
        for &event in &self.events {
            for &cpu in &self.cpus {
                match self.source.open(path, &file, cpu, event) {
                    Ok(counter) => slots.push(Slot {
                        event,
                        cpu,
                        counter,
                        last: Reading::default(),
                    }),
                    // Removed between the listing and the open.
                    Err(_) if !dir.is_dir() => return Ok(None),
                    Err(error) => return Err(OpenError { event, error }),
                }
            }
        }
        Ok(Some(Target {
            path: path.to_string(),
            workload: classify(path),
            dir: dir.to_path_buf(),
            inode,
            slots,
            totals: [0; 3],
        }))
    }

    pub(super) fn bad_reading(&mut self, what: String) {
        self.bad_readings += 1;
        if self.bad_reading_examples.len() >= PROBLEMS_KEPT {
            self.bad_reading_examples.remove(0);
        }
        self.bad_reading_examples.push(what);
    }

    /// Reads every counter into one row per cgroup. A cgroup gone (or made
    /// again) since its counters opened loses them and forces a walk.
    pub(super) fn read_all(&mut self, time_us: i64) -> Batch {
        let mut builder = BatchBuilder::new(&CGROUP_PERF);
        let mut vanished = false;
        let mut bad = Vec::new();
        let events = &self.events;
        self.targets.retain_mut(|target| {
            let here = std::fs::metadata(&target.dir).is_ok_and(|m| m.ino() == target.inode);
            if !here {
                vanished = true;
                return false;
            }
            let (mut enabled, mut running) = (0u64, 0u64);
            for slot in &mut target.slots {
                let reading = match slot.counter.read() {
                    Ok(r) => r,
                    Err(e) => {
                        // A counter that cannot be read: the cgroup's counters
                        // are opened afresh at the next walk (its totals restart).
                        bad.push(format!(
                            "{}: reading {} on CPU {} failed: {e}",
                            target.path,
                            slot.event.describe(),
                            slot.cpu
                        ));
                        vanished = true;
                        return false;
                    }
                };
                match advance(slot, reading, &mut target.totals) {
                    Ok((e, r)) => {
                        enabled = enabled.saturating_add(e);
                        running = running.saturating_add(r);
                    }
                    Err(what) => bad.push(format!(
                        "{}: {} on CPU {} {what}; skipped",
                        target.path,
                        slot.event.describe(),
                        slot.cpu
                    )),
                }
            }
            // An event the CPU cannot count is null, not 0.
            let total = |event: HwEvent| {
                events
                    .contains(&event)
                    .then_some(target.totals[event.index()])
            };
            let row = CgroupPerfRow {
                path: &target.path,
                workload: target.workload,
                cycles: total(HwEvent::Cycles),
                instructions: total(HwEvent::Instructions),
                llc_misses: total(HwEvent::LlcMisses),
                counter_running_ratio: (enabled > 0).then(|| running as f64 / enabled as f64),
            };
            builder
                .push_row(time_us, &row)
                .expect("a perf row is for the cgroup_perf table");
            true
        });
        for what in bad {
            self.bad_reading(what);
        }
        if vanished {
            self.walked_at = None;
        }
        builder.finish()
    }
}

/// A counter that would not open, and for which event.
pub(super) struct OpenError {
    pub(super) event: HwEvent,
    pub(super) error: io::Error,
}

impl OpenError {
    pub(super) fn raw_os_error(&self) -> Option<i32> {
        self.error.raw_os_error()
    }
}

impl Collector for Perf {
    fn name(&self) -> &'static str {
        "perf"
    }

    /// Carries on each cgroup's totals: the rebuilt collector opens its
    /// counters afresh, and `vtax_cgroup_perf_*_total` would start again from
    /// zero. A cgroup made again meanwhile (another inode) starts from zero,
    /// as at a walk.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<Perf>() else {
            return;
        };
        self.carried_totals = previous
            .targets
            .iter()
            .map(|t| (t.path.clone(), (t.inode, t.totals)))
            .collect();
    }

    fn probe(&mut self) -> Availability {
        self.targets.clear();
        self.walked_at = None;
        if let Err(reason) = self.check() {
            return Availability::Absent(reason);
        }
        let hierarchy = self.hierarchy.clone().expect("checked");
        let (chosen, _) = self.select(&hierarchy);
        let per_cgroup = self.counters_per_cgroup();
        let counted = chosen.len().min(self.max_counters / per_cgroup);
        let llc = match &self.llc_unavailable {
            None => String::new(),
            Some(_) => "; last-level cache misses not counted".into(),
        };
        Availability::Available(format!(
            "{} at {}, {counted} leaf cgroups x {} CPUs x {} events = {} counters (max_counters {}){llc}",
            self.layout,
            hierarchy.display(),
            self.cpus.len(),
            self.events.len(),
            counted * per_cgroup,
            self.max_counters,
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        if self.hierarchy.is_none() {
            anyhow::bail!("not probed");
        }
        if self.selection.rescan_due(self.walked_at, time_us) {
            self.rewalk(time_us)?;
        }
        let batch = self.read_all(time_us);
        Ok(if batch.is_empty() {
            Vec::new()
        } else {
            vec![batch]
        })
    }

    fn left_out(&self) -> u64 {
        self.over_max_counters as u64
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(broken) = self.selection.broken() {
            problems.push(format!("{broken}: no cgroup is counted"));
        }
        if let Some(reason) = &self.llc_unavailable {
            problems.push(format!("last-level cache misses are not counted: {reason}"));
        }
        if self.over_max_counters > 0 {
            problems.push(format!(
                "{} leaf cgroups over collectors.perf.max_counters = {} ({} counters each: {} events x {} CPUs) are not counted: raise it, or narrow [collectors.cgroups] include/exclude",
                self.over_max_counters,
                self.max_counters,
                self.counters_per_cgroup(),
                self.events.len(),
                self.cpus.len()
            ));
        }
        for failure in &self.open_failures {
            problems.push(format!("counters did not open for {failure}"));
        }
        if self.bad_readings > 0 {
            problems.push(format!(
                "{} counter readings were impossible and skipped; the last: {}",
                self.bad_readings,
                self.bad_reading_examples.join("; ")
            ));
        }
        problems
    }
}
