//! Reading the collectors' rows: each batch into per-second victim
//! signals and per-second suspect usage.

use super::*;

impl Detector {
    /// Reads one send of the collectors: its batches, and for a snapshot
    /// (every series its source has now) the end of each table the source
    /// sent before and no longer does, as `/metrics` drops its series: a
    /// collector turned off or failing sends an empty one. The facts read
    /// from an ended table are forgotten rather than kept as the node's.
    pub fn observe_sent(&mut self, sent: &vtax_store::hub::Sent) {
        for batch in &sent.rows {
            self.observe(batch);
        }
        let Some(source) = &sent.snapshot_of else {
            return;
        };
        let now: BTreeSet<&'static str> = sent.rows.iter().map(|b| b.table.name).collect();
        let Some(before) = self.snapshot_tables.insert(source.clone(), now) else {
            return;
        };
        let ended: Vec<&'static str> = before
            .difference(&self.snapshot_tables[source])
            .copied()
            .collect();
        for table in ended {
            self.table_ended(table);
        }
    }

    /// Forgets what the detector knows only from `table`'s latest rows.
    /// Signals and suspects need nothing: their seconds stop.
    fn table_ended(&mut self, table: &str) {
        match table {
            // No GPU is known now: the verdict's GPU facts (NVLink, PCIe,
            // MIG) and the tax's GPU ratios are not carried on. What the
            // transfer probe measured stays, as it would between its runs.
            "gpu_info" => {
                for gpu in self.facts.gpus.values_mut() {
                    *gpu = GpuFacts {
                        probe: gpu.probe,
                        ..GpuFacts::default()
                    };
                }
            }
            "platform_host" => self.facts.host = None,
            // Seconds unwatched are not seconds in which a newcomer was
            // absent: watching starts again with the next rows.
            "gpu" => self.gpus_watched_since = None,
            "cgroup" => self.cgroups_watched_since = None,
            _ => {}
        }
    }

    /// Reads one collector batch.
    pub fn observe(&mut self, batch: &Batch) {
        let view = View::new(batch);
        if view.rows() == 0 {
            return;
        }
        let window_secs = self.config.window_secs.max(1) as i64;
        let second = second_of(view.time_us(0));
        self.observed_windows
            .insert(second.div_euclid(window_secs) * window_secs);
        match batch.table.name {
            "cpu" => self.observe_cpu(&view),
            "cpu_sched" => {
                self.observe_node_mean(
                    &view,
                    "cpu",
                    "run_delay_seconds",
                    Resource::Cpu,
                    "run_delay_ratio",
                );
            }
            "pressure" => self.observe_pressure(&view),
            "cgroup" => self.observe_cgroups(&view),
            "cgroup_perf" => self.observe_cgroup_perf(&view),
            "jitter" => self.observe_jitter(&view),
            "platform_host" => self.facts.observe_host(&view),
            "gpu_info" => {
                self.facts.observe_gpu_info(&view);
                let present: Vec<String> = (0..view.rows())
                    .map(|r| view.tag(r, "gpu").to_string())
                    .collect();
                self.facts.retain_gpus(&present);
            }
            "gpu" => self.observe_gpus(&view),
            "gpu_process" => self.observe_gpu_processes(&view),
            "gpu_probe" => self.facts.observe_gpu_probe(&view),
            "infiniband_port" => self.observe_infiniband(&view),
            _ => {}
        }
    }

    pub(super) fn rate(&mut self, key: String, time_us: i64, value: f64) -> Option<f64> {
        let previous = self.counters.insert(key, (time_us, value));
        let (t0, v0) = previous?;
        let dt = (time_us - t0) as f64 / 1e6;
        // A reset (reboot of the source, a new cgroup under an old name) is no rate.
        (dt > 0.0 && value >= v0).then(|| (value - v0) / dt)
    }

    /// A counter's rate as a sample of `signal` (the first reading and a
    /// reset give none).
    pub(super) fn sample_rate(
        &mut self,
        key: String,
        (resource, victim, signal): (Resource, &str, &'static str),
        time_us: i64,
        counter: Option<f64>,
    ) {
        let Some(counter) = counter else {
            return;
        };
        if let Some(rate) = self.rate(key, time_us, counter) {
            self.sample(resource, victim, signal, time_us, rate);
        }
    }

    /// One sample of `signal` of `victim` at `time_us`: what the collectors'
    /// rows give, or a recorded sample a replay feeds back.
    pub fn sample(
        &mut self,
        resource: Resource,
        victim: &str,
        signal: &'static str,
        time_us: i64,
        value: f64,
    ) {
        if !value.is_finite() {
            return;
        }
        let Some(spec) = spec(resource, signal) else {
            debug_assert!(false, "undeclared signal {signal}");
            return;
        };
        let capacity = self.config.baseline_windows as usize;
        let (window_secs, lookback) = (
            self.config.window_secs as i64,
            self.config.lookback_secs as i64,
        );
        let key = SignalKey {
            resource,
            victim: victim.to_string(),
            signal: spec.signal,
        };
        let state = self
            .signals
            .entry(key)
            .or_insert_with(|| SignalState::new(spec, capacity));
        let second = second_of(time_us);
        push_second(&mut state.seconds, second, value, lookback);
        let window = second.div_euclid(window_secs) * window_secs;
        state.pending.entry(window).or_default().push(value);
        state.last_second = state.last_second.max(second);
    }

    pub(super) fn usage(&mut self, name: &str, pool: Pool, time_us: i64, value: f64) {
        let lookback = self.config.lookback_secs as i64;
        let window_secs = self.config.window_secs as i64;
        let second = second_of(time_us);
        let watched_since = match pool {
            Pool::Cgroup | Pool::CgroupIo => self.cgroups_watched_since,
            Pool::GpuProcess => self.gpus_watched_since,
            Pool::Hypervisor | Pool::Outside => None,
        };
        let present_cgroups = &self.present_cgroups;
        let suspects = match pool {
            Pool::CgroupIo => &mut self.io_suspects,
            _ => &mut self.suspects,
        };
        let series = suspects.entry(name.to_string()).or_insert_with(|| {
            // A usage is a rate, first known a second after the first sight;
            // a cgroup may have been seen long before, as a parent whose
            // usage was its children's.
            let appeared = match pool {
                Pool::Cgroup | Pool::CgroupIo => present_cgroups.get(name).copied(),
                _ => None,
            }
            .unwrap_or(second - 1)
            .min(second - 1);
            let mut usual = RollingBaseline::new(USUAL_WINDOWS);
            // One present when watching began has none missing.
            let absent_windows = watched_since
                .map_or(0, |watched| (appeared - watched).div_euclid(window_secs))
                .clamp(0, USUAL_WINDOWS as i64);
            for _ in 0..absent_windows {
                usual.push(0.0);
            }
            SuspectSeries {
                pool,
                appeared,
                seconds: VecDeque::new(),
                usual,
                absences: Vec::new(),
            }
        });
        push_second(&mut series.seconds, second, value, lookback);
        if let Some(&(oldest, _)) = series.seconds.front() {
            series.absences.retain(|&(_, back)| back > oldest);
        }
    }

    /// Teaches each suspect its usual usage from `window`'s seconds, unless
    /// an event is open (and younger than the time after which a signal's
    /// baseline learns an abnormal level): an antagonist's busy minutes are
    /// not its usual, and a victim's starved ones are not its own.
    pub(super) fn learn_usual(&mut self, window: i64) {
        let window_secs = self.config.window_secs as i64;
        let learns_abnormal_after =
            i64::from(self.config.learn_abnormal_after_windows) * window_secs;
        let judged_by_baseline =
            |state: &SignalState| matches!(state.spec.rule, Rule::Baseline { .. });
        let holding = self.open.iter().any(|(key, event)| {
            window - event.start_second < learns_abnormal_after
                && self.signals.get(key).is_some_and(judged_by_baseline)
        }) || self.signals.values().any(|s| {
            s.abnormal_run > 0
                && s.abnormal_run < self.config.learn_abnormal_after_windows
                && judged_by_baseline(s)
        });
        if holding {
            return;
        }
        for series in self
            .suspects
            .values_mut()
            .chain(self.io_suspects.values_mut())
        {
            if let Some(mean) = mean_over(&series.seconds, window..window + window_secs) {
                series.usual.push(mean);
            }
        }
    }

    /// The usage series of suspect `name` that `resource`'s signals rank:
    /// a cgroup's block I/O for I/O, else its CPU time (or the process's SM
    /// share, the steal, the load outside the cgroups).
    pub(super) fn suspect_series(&self, name: &str, resource: Resource) -> Option<&SuspectSeries> {
        match resource {
            Resource::Io => self.io_suspects.get(name),
            _ => self.suspects.get(name),
        }
    }

    /// A suspect's usual usage of what `resource`'s signals rank, once known.
    pub(super) fn usual_usage(&self, name: &str, resource: Resource) -> Option<f64> {
        self.suspect_series(name, resource)?
            .usual
            .summary()
            .filter(|s| s.windows >= MIN_USUAL_WINDOWS)
            .map(|s| s.median)
    }

    /// Whether `name` used more than its usual (zero until known) by the
    /// rise a suspect must show, over its seconds from `window` on. A
    /// suspect the detector keeps no usage of (the unattributed load)
    /// counts as busy.
    pub(super) fn busy_now(&self, name: &str, window: i64, resource: Resource) -> bool {
        self.busy_during(name, window..i64::MAX, resource)
    }

    /// [`Self::busy_now`] over the seconds of `seconds` it has: none (it did
    /// not exist then) is not busy.
    pub(super) fn busy_during(
        &self,
        name: &str,
        seconds: std::ops::Range<i64>,
        resource: Resource,
    ) -> bool {
        let Some(series) = self.suspect_series(name, resource) else {
            return true;
        };
        let scale = resource.usage_scale();
        mean_over(&series.seconds, seconds).is_some_and(|mean| {
            mean - self.usual_usage(name, resource).unwrap_or(0.0)
                >= MIN_RISE_OVER_USUAL_SCALES * scale
        })
    }

    /// Mean over the rows (CPUs) of a counter's rate, as one node signal;
    /// returns the mean and the number of rows it was taken over.
    pub(super) fn observe_node_mean(
        &mut self,
        view: &View,
        key_tag: &str,
        field: &str,
        resource: Resource,
        signal: &'static str,
    ) -> Option<(f64, usize)> {
        let (tag, column) = (view.tag_column(key_tag)?, view.field_column(field)?);
        let (mut sum, mut n) = (0.0, 0usize);
        let time_us = view.time_us(0);
        for row in 0..view.rows() {
            let Some(v) = view.value_at(column, row) else {
                continue;
            };
            let key = format!("{}|{}|{field}", view.table_name(), view.tag_at(tag, row));
            if let Some(r) = self.rate(key, view.time_us(row), v) {
                sum += r;
                n += 1;
            }
        }
        if n == 0 {
            return None;
        }
        let mean = sum / n as f64;
        self.sample(resource, "node", signal, time_us, mean);
        Some((mean, n))
    }

    pub(super) fn observe_cpu(&mut self, view: &View) {
        self.observe_node_busy(view);
        if let Some((steal, cpus)) =
            self.observe_node_mean(view, "cpu", "steal_seconds", Resource::Cpu, "steal_ratio")
        {
            self.node_cpus = Some(cpus);
            self.usage(
                HYPERVISOR_SUSPECT,
                Pool::Hypervisor,
                view.time_us(0),
                steal * cpus as f64,
            );
        }
    }

    /// The node's busy CPUs this second: the rate of every CPU's non-idle,
    /// non-stolen time, summed. Seconds where any CPU lacks a field are left
    /// out rather than undercounted.
    pub(super) fn observe_node_busy(&mut self, view: &View) {
        // user_seconds holds guest time already.
        const BUSY: [&str; 5] = [
            "user_seconds",
            "nice_seconds",
            "system_seconds",
            "irq_seconds",
            "softirq_seconds",
        ];
        let Some(cpu) = view.tag_column("cpu") else {
            return;
        };
        let (mut total, mut complete) = (0.0, true);
        for row in 0..view.rows() {
            let busy: Option<f64> = BUSY.iter().map(|f| view.value(row, f)).sum();
            let key = format!("cpu|{}|busy", view.tag_at(cpu, row));
            match busy.and_then(|b| self.rate(key, view.time_us(row), b)) {
                Some(r) => total += r,
                None => complete = false,
            }
        }
        if complete {
            let lookback = self.config.lookback_secs as i64;
            push_second(
                &mut self.node_busy,
                second_of(view.time_us(0)),
                total,
                lookback,
            );
        }
    }

    pub(super) fn observe_pressure(&mut self, view: &View) {
        for row in 0..view.rows() {
            let resource = match view.tag(row, "resource") {
                "cpu" => Resource::Cpu,
                "memory" => Resource::Memory,
                "io" => Resource::Io,
                _ => continue,
            };
            self.sample_rate(
                format!("pressure|{}", resource.name()),
                (resource, "node", "pressure_some_ratio"),
                view.time_us(row),
                view.value(row, "some_stalled_seconds"),
            );
        }
    }

    pub(super) fn observe_cgroups(&mut self, view: &View) {
        let Some((paths, workloads)) = cgroup_rows(view) else {
            return;
        };
        self.leaf_cgroups = leaves(&paths);
        if self.present_cgroups.len() != paths.len()
            || paths.iter().any(|p| !self.present_cgroups.contains_key(*p))
        {
            let now = second_of(view.time_us(0));
            let before = std::mem::take(&mut self.present_cgroups);
            self.present_cgroups = paths
                .iter()
                .map(|p| (p.to_string(), before.get(*p).copied().unwrap_or(now)))
                .collect();
            // A path back after it was gone: the seconds between, it used
            // nothing. Its series' last second says when it was last read.
            for path in paths.iter().filter(|p| !before.contains_key(**p)) {
                for suspects in [&mut self.suspects, &mut self.io_suspects] {
                    if let Some(series) = suspects.get_mut(*path) {
                        if let Some(&(last, _)) = series.seconds.back() {
                            if last + 1 < now {
                                series.absences.push((last + 1, now));
                            }
                        }
                    }
                }
            }
        }
        self.cgroups_watched_since
            .get_or_insert(second_of(view.time_us(0)));
        let mut leaf_busy = Some(0.0);
        const PRESSURES: [(&str, Resource); 3] = [
            ("cpu_pressure_some_seconds", Resource::Cpu),
            ("memory_pressure_some_seconds", Resource::Memory),
            ("io_pressure_some_seconds", Resource::Io),
        ];
        for (row, path) in paths.iter().enumerate() {
            let time_us = view.time_us(row);
            let key = format!("cgroup|{path}|cpu");
            let usage = view.value(row, "cpu_usage_seconds");
            // A cgroup never read with a CPU counter has none (cgroup v1: a
            // path in the memory hierarchy only): its tasks' CPU time is
            // counted where their cpu cgroup is, and it holds none of it.
            let has_cpu_counter = usage.is_some() || self.counters.contains_key(&key);
            let rate = usage.and_then(|usage| self.rate(key, time_us, usage));
            if self.leaf_cgroups.contains(*path) {
                let bytes = view
                    .value(row, "io_read_bytes")
                    .zip(view.value(row, "io_write_bytes"))
                    .map(|(read, written)| read + written);
                let io_rate =
                    bytes.and_then(|b| self.rate(format!("cgroup|{path}|io"), time_us, b));
                if let Some(bytes_per_second) = io_rate {
                    self.usage(path, Pool::CgroupIo, time_us, bytes_per_second / MIB);
                }
                match rate {
                    Some(r) => {
                        self.usage(path, Pool::Cgroup, time_us, r);
                        leaf_busy = leaf_busy.map(|sum| sum + r);
                    }
                    None if !has_cpu_counter => {}
                    // A leaf seen for the first time (no rate yet) or
                    // without its usage this time: the sum is unknown this
                    // second.
                    None => leaf_busy = None,
                }
            }
            if !is_victim(path, workloads[row], &self.leaf_cgroups) {
                continue;
            }
            for (field, resource) in PRESSURES {
                self.sample_rate(
                    format!("cgroup|{path}|{field}"),
                    (resource, path, "pressure_some_ratio"),
                    time_us,
                    view.value(row, field),
                );
            }
        }
        if let Some(sum) = leaf_busy {
            let lookback = self.config.lookback_secs as i64;
            push_second(
                &mut self.leaf_busy,
                second_of(view.time_us(0)),
                sum,
                lookback,
            );
        }
    }

    /// CPI and LLC misses per thousand instructions of each leaf workload
    /// cgroup, from the perf collector's counters: ratios of two rates over
    /// the same second, sampled only when the cgroup ran enough instructions.
    pub(super) fn observe_cgroup_perf(&mut self, view: &View) {
        let Some((paths, workloads)) = cgroup_rows(view) else {
            return;
        };
        let leaf = leaves(&paths);
        for (row, path) in paths.iter().enumerate() {
            let time_us = view.time_us(row);
            // Every counter's rate is taken each row, so the next second's
            // rate spans one second whatever this one decided.
            let mut rate = |field: &str| {
                let counter = view.value(row, field)?;
                self.rate(format!("cgroup_perf|{path}|{field}"), time_us, counter)
            };
            let (cycles, instructions, llc_misses) =
                (rate("cycles"), rate("instructions"), rate("llc_misses"));
            if !is_victim(path, workloads[row], &leaf) {
                continue;
            }
            let Some(instructions) = instructions.filter(|i| *i >= PMU_MIN_INSTRUCTIONS_PER_SECOND)
            else {
                continue;
            };
            if let Some(cycles) = cycles {
                self.sample(Resource::Cpu, path, "cpi", time_us, cycles / instructions);
            }
            if let Some(misses) = llc_misses {
                self.sample(
                    Resource::Memory,
                    path,
                    "llc_misses_per_kilo_instruction",
                    time_us,
                    1000.0 * misses / instructions,
                );
            }
        }
    }

    pub(super) fn observe_jitter(&mut self, view: &View) {
        let mut p99: Option<f64> = None;
        let (mut interrupted, mut unexplained, mut busy) = (Vec::new(), Vec::new(), Vec::new());
        for row in 0..view.rows() {
            if let Some(v) = view.value(row, "wakeup_p99_seconds") {
                p99 = Some(p99.map_or(v, |p: f64| p.max(v)));
            }
            interrupted.extend(view.value(row, "interrupted_ratio"));
            unexplained.extend(view.value(row, "unexplained_ratio"));
            busy.extend(view.value(row, "busy_ratio"));
        }
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let time_us = view.time_us(0);
        if let Some(p99) = p99 {
            self.sample(Resource::Cpu, "node", "jitter_p99_seconds", time_us, p99);
            // The shortest spacing seen: windows have one length, and a gap
            // (the probe off for a while) only lengthens a spacing.
            let length_us = match self.jitter {
                Some(j) if time_us > j.end_us && time_us - j.end_us <= JITTER_WINDOW_MAX_US => {
                    let spacing = time_us - j.end_us;
                    Some(j.length_us.map_or(spacing, |l| l.min(spacing)))
                }
                Some(j) => j.length_us,
                None => None,
            };
            self.jitter = Some(JitterWindow {
                p99_seconds: p99,
                interrupted_ratio: mean(&interrupted),
                unexplained_ratio: mean(&unexplained),
                busy_ratio: mean(&busy),
                end_us: time_us,
                length_us,
            });
        }
        if let Some(u) = mean(&unexplained) {
            self.sample(
                Resource::Cpu,
                "node",
                "jitter_unexplained_ratio",
                time_us,
                u,
            );
        }
    }

    pub(super) fn observe_gpus(&mut self, view: &View) {
        self.gpus_watched_since
            .get_or_insert(second_of(view.time_us(0)));
        let seen = self.facts.observe_gpu(view);
        let time_us = view.time_us(0);
        let window_secs = self.config.window_secs as i64;
        let window = second_of(time_us).div_euclid(window_secs) * window_secs;
        let facts = &self.facts;
        let sums = self.gpu_tax.entry(window).or_default();
        sums.hbm_peak.add(facts.hbm_peak_ratio());
        sums.nvlink_peak.add(facts.nvlink_peak_ratio());
        sums.pcie_bandwidth_loss
            .add(facts.worst(GpuFacts::pcie_bandwidth_loss_ratio));
        sums.clock_throttle
            .add(facts.worst(GpuFacts::clock_throttle_ratio));
        type Derived = fn(&GpuFacts) -> Option<f64>;
        const DERIVED: [(&str, Derived); 5] = [
            ("clock_throttle_ratio", GpuFacts::clock_throttle_ratio),
            ("sm_activity_loss_ratio", GpuFacts::sm_activity_loss_ratio),
            (
                "dram_activity_loss_ratio",
                GpuFacts::dram_activity_loss_ratio,
            ),
            (
                "pcie_bandwidth_loss_ratio",
                GpuFacts::pcie_bandwidth_loss_ratio,
            ),
            (
                "nvlink_links_missing_ratio",
                GpuFacts::nvlink_links_missing_ratio,
            ),
        ];
        for index in seen {
            let Some(gpu) = self.facts.gpus.get(&index) else {
                continue;
            };
            let values: Vec<(&'static str, f64)> = DERIVED
                .iter()
                .filter_map(|(signal, f)| f(gpu).map(|v| (*signal, v)))
                .collect();
            let victim = format!("gpu{index}");
            for (signal, v) in values {
                self.sample(Resource::Gpu, &victim, signal, time_us, v);
            }
        }
    }

    pub(super) fn observe_gpu_processes(&mut self, view: &View) {
        for row in 0..view.rows() {
            let Some(sm) = view.value(row, "sm_utilization_ratio") else {
                continue;
            };
            let name = gpu_process_name(view, row);
            self.usage(&name, Pool::GpuProcess, view.time_us(row), sm);
        }
    }

    pub(super) fn observe_infiniband(&mut self, view: &View) {
        const ERRORS: [&str; 7] = [
            "symbol_error",
            "rcv_errors",
            "link_error_recovery",
            "local_link_integrity_errors",
            "excessive_buffer_overrun_errors",
            "xmit_discards",
            "rcv_remote_physical_errors",
        ];
        for row in 0..view.rows() {
            let port = format!("{}/{}", view.tag(row, "device"), view.tag(row, "port"));
            let time_us = view.time_us(row);
            let errors: Option<f64> = ERRORS.iter().map(|f| view.value(row, f)).sum();
            for (what, signal, counter) in [
                (
                    "xmit_wait",
                    "xmit_wait_ticks_per_second",
                    view.value(row, "xmit_wait"),
                ),
                ("errors", "errors_per_second", errors),
                (
                    "link_downed",
                    "link_downed_per_second",
                    view.value(row, "link_downed"),
                ),
            ] {
                self.sample_rate(
                    format!("ib|{port}|{what}"),
                    (Resource::Network, &port, signal),
                    time_us,
                    counter,
                );
            }
        }
    }

    /// Runs the cache canary once per second; the main loop calls this on
    /// each of its ticks.
    pub(super) fn run_canary(&mut self, now_us: i64) {
        let second = second_of(now_us);
        if second == self.last_canary_second {
            return;
        }
        let Some(canary) = self.canary.as_mut() else {
            return;
        };
        self.last_canary_second = second;
        let seconds_per_load = canary.sample();
        self.sample(
            Resource::Memory,
            "node",
            "cache_latency_seconds",
            now_us,
            seconds_per_load,
        );
    }
}

/// The `path` and `workload` tags of a batch of per-cgroup rows, row by row.
pub(super) fn cgroup_rows<'a>(view: &View<'a>) -> Option<(Vec<&'a str>, Vec<&'a str>)> {
    let (path, workload) = (view.tag_column("path")?, view.tag_column("workload")?);
    let rows = 0..view.rows();
    Some((
        rows.clone().map(|r| view.tag_at(path, r)).collect(),
        rows.map(|r| view.tag_at(workload, r)).collect(),
    ))
}

/// Whether a cgroup's signals are a victim's. Slices and job steps aggregate
/// or subdivide a workload, and a parent's stall holds its children's: the
/// workload's own leaf cgroup is the victim. A Slurm job is the workload
/// its steps subdivide, and never a leaf (its steps are under it): it is
/// the victim, its steps are not.
pub(super) fn is_victim(path: &str, workload: &str, leaves: &BTreeSet<String>) -> bool {
    match workload {
        "slurm_job" => true,
        "slice" | "slurm_step" => false,
        _ => leaves.contains(path),
    }
}

/// A GPU process as a suspect: its workload when it has one, else its pid.
pub(super) fn gpu_process_name(view: &View, row: usize) -> String {
    for (tag, label) in [
        ("pod_uid", "pod"),
        ("container", "container"),
        ("slurm_job", "slurm_job"),
    ] {
        let v = view.tag(row, tag);
        if !v.is_empty() {
            return format!("{label}:{v}");
        }
    }
    format!("pid:{}/{}", view.tag(row, "pid"), view.tag(row, "command"))
}
