//! The collector: one thread per target on its own interval, what each
//! scraped shared with the collector's tick, and the log of their failures.

use super::*;

/// What a target's thread shares with the collector.
#[derive(Default)]
pub(super) struct TargetShared {
    /// Rows for the store, oldest first.
    pub(super) pending: Vec<Arc<Batch>>,
    /// The last status row and the last window's rows, for `/metrics`.
    pub(super) status: Option<Arc<Batch>>,
    pub(super) latency: Option<Arc<Batch>>,
    /// Histogram families asked for but absent from the last valid scrape.
    pub(super) missing: Vec<String>,
    /// The failure the target is in, if any.
    pub(super) failing: Option<Failure>,
    /// The target's counters as of its last scrape.
    pub(super) counts: Counts,
}

/// A target's counters since the agent started: scrapes, and failures by
/// reason.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Counts {
    pub(super) scrapes: u64,
    pub(super) failures: [u64; 5],
    /// Scrapes made but dropped before the collector harvested them.
    pub(super) dropped: u64,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) stopper: Stopper,
    /// Seconds between the collector's harvests (`[collectors.scrape]
    /// interval_secs`): how many scrapes a target makes between two.
    pub(super) harvest_interval_secs: f64,
    pub(super) targets: Mutex<BTreeMap<String, TargetShared>>,
    /// Counters a target's thread starts from, by target name: those of the
    /// collector this one replaced at a reload.
    pub(super) carried: Mutex<BTreeMap<String, Counts>>,
    /// The newest time stored of each series, by target name, that a
    /// target's thread starts from: taken from the store at the agent's
    /// start ([`Collector::resume`]), or left by the threads of the
    /// collector this one replaced at a reload. Without it a sample carrying
    /// its own timestamp was stored again by the first scrape after either.
    pub(super) resumed: Mutex<BTreeMap<String, Timestamps>>,
}

/// The scrape collector.
pub struct Scrape {
    pub(super) config: ScrapeConfig,
    pub(super) shared: Arc<Shared>,
    pub(super) started: bool,
}

impl Scrape {
    /// A collector whose targets' threads start at `probe`.
    pub fn new(config: &ScrapeConfig, _roots: &Roots) -> Self {
        Scrape {
            config: config.clone(),
            shared: Arc::new(Shared {
                harvest_interval_secs: config.interval_secs,
                ..Shared::default()
            }),
            started: false,
        }
    }
}

impl Drop for Scrape {
    fn drop(&mut self) {
        // The threads are not joined: one blocked on a hung target would hold
        // up a stop or reload for its timeout. They see the flag and exit.
        self.shared.stopper.stop();
    }
}

impl Collector for Scrape {
    fn name(&self) -> &'static str {
        "scrape"
    }

    fn probe(&mut self) -> Availability {
        if self.config.targets.is_empty() {
            return Availability::Absent("no [[scrape]] targets configured".into());
        }
        if !self.started {
            self.started = true;
            for target in &self.config.targets {
                self.shared
                    .targets
                    .lock()
                    .expect("not poisoned")
                    .insert(target.name.clone(), TargetShared::default());
                let (target, shared) = (target.clone(), self.shared.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("vtax-scrape-{}", target.name))
                    .spawn(move || target_loop(&target, &shared));
                if let Err(e) = spawned {
                    return Availability::Absent(format!("cannot start a scrape thread: {e}"));
                }
            }
        }
        let names: Vec<&str> = self
            .config
            .targets
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        Availability::Available(format!("{} target(s): {}", names.len(), names.join(", ")))
    }

    /// Carries on each target's scrape and failure counts: the rebuilt
    /// collector's threads would start them from zero, and
    /// `vtax_scrape_target_scrapes_total` would go back on `/metrics`.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<Scrape>() else {
            return;
        };
        let targets = previous.shared.targets.lock().expect("not poisoned");
        let mut carried = self.shared.carried.lock().expect("not poisoned");
        for (name, target) in targets.iter() {
            carried.insert(name.clone(), target.counts);
        }
        // A thread still blocked on a hung target leaves its series later
        // than this: that target's first scrape may store a timestamped
        // sample again.
        let left = std::mem::take(&mut *previous.shared.resumed.lock().expect("not poisoned"));
        self.shared
            .resumed
            .lock()
            .expect("not poisoned")
            .extend(left);
    }

    fn resumes_from(&self) -> Option<&'static vtax_store::TableDef> {
        (!self.config.targets.is_empty()).then_some(&tables::SCRAPED)
    }

    /// Each target's series with the newest time stored (tags: target,
    /// metric, labels), so that a sample that carries its own timestamp and
    /// was stored before the agent stopped is not stored again. At most
    /// `sample_limit` series a target are kept, the newest.
    fn resume(&mut self, latest: &[crate::LatestRow]) {
        let mut resumed = self.shared.resumed.lock().expect("not poisoned");
        type Newest = Vec<((String, String), i64)>;
        let mut by_target: BTreeMap<&str, Newest> = BTreeMap::new();
        for row in latest {
            let [target, metric, labels] = &row.tags[..] else {
                continue;
            };
            by_target
                .entry(target)
                .or_default()
                .push(((metric.clone(), labels.clone()), row.time_us));
        }
        for target in &self.config.targets {
            let Some(series) = by_target.remove(target.name.as_str()) else {
                continue;
            };
            let newest = series.iter().map(|(_, t)| *t).max().unwrap_or(0);
            let known = resumed.entry(target.name.clone()).or_default();
            remember(
                known,
                series,
                newest,
                0,
                usize::try_from(target.sample_limit).unwrap_or(usize::MAX),
            );
        }
    }

    fn collect(&mut self, _time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let mut targets = self.shared.targets.lock().expect("not poisoned");
        let mut out = Vec::new();
        for target in targets.values_mut() {
            out.extend(
                target
                    .pending
                    .drain(..)
                    .map(|b| Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone())),
            );
        }
        Ok(out)
    }

    fn problems(&self) -> Vec<String> {
        let targets = self.shared.targets.lock().expect("not poisoned");
        let mut out = Vec::new();
        for (name, t) in targets.iter() {
            if let Some(f) = &t.failing {
                out.push(format!(
                    "scrape target {name} failing ({}): {}",
                    f.reason.as_str(),
                    f.message
                ));
            }
            for family in &t.missing {
                out.push(format!(
                    "scrape target {name}: histogram {family} not in its last scrape"
                ));
            }
            if t.counts.dropped > 0 {
                out.push(format!(
                    "scrape target {name}: {} scrapes dropped, not harvested in time",
                    t.counts.dropped
                ));
            }
        }
        out
    }

    fn exposed(&self) -> Option<Vec<Arc<Batch>>> {
        let targets = self.shared.targets.lock().expect("not poisoned");
        Some(
            targets
                .values()
                .flat_map(|t| t.status.iter().chain(t.latency.iter()).cloned())
                .collect(),
        )
    }
}

/// One target's thread: scrape on its grid until stopped.
pub(super) fn target_loop(target: &ScrapeTarget, shared: &Shared) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs_f64(target.timeout_secs)))
        .http_status_as_error(false)
        .user_agent(format!("vtax/{}", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let interval_us = ((target.interval_secs * 1e6) as i64).max(1);
    let mut windows = Windows::new(target.window_secs);
    let Counts {
        mut scrapes,
        mut failures,
        mut dropped,
    } = shared
        .carried
        .lock()
        .expect("not poisoned")
        .remove(&target.name)
        .unwrap_or_default();
    let mut log = TransitionLog::default();
    let mut last_drop_warning: Option<Instant> = None;
    // Scrapes at the sample limit that may wait for the store: a few, and
    // twice what one harvest gathers, so a target scraped faster than the
    // collector harvests (0.2 s against 1 s) is not cut every harvest.
    let per_harvest = (shared.harvest_interval_secs / target.interval_secs)
        .ceil()
        .clamp(1.0, 1e6) as u64;
    let scrapes_at_limit = MAX_PENDING_SCRAPES_AT_LIMIT.max(2 * per_harvest + 1);
    let max_pending = (MAX_PENDING_PER_TARGET * 3).max(3 * scrapes_at_limit as usize);
    let scale = |family: &str| seconds_per_unit(family);
    let mut last_grid_us = i64::MIN;
    // The series that carried their own timestamps, with the newest stored.
    let mut timestamped = shared
        .resumed
        .lock()
        .expect("not poisoned")
        .remove(&target.name)
        .unwrap_or_default();
    loop {
        let (grid_us, at) = next_grid(interval_us, last_grid_us);
        last_grid_us = grid_us;
        if shared.stopper.sleep_until(at) {
            // For the collector that replaces this one at a reload.
            shared
                .resumed
                .lock()
                .expect("not poisoned")
                .insert(target.name.clone(), timestamped);
            return;
        }
        let time_us = now_us();
        let started = Instant::now();
        let result = scrape(&agent, target, time_us, &timestamped);
        let duration = started.elapsed().as_secs_f64();
        scrapes += 1;
        let mut batches: Vec<Batch> = Vec::new();
        let mut latency = None;
        let mut samples_dropped = None;
        let (up, samples, missing, failure) = match result {
            Ok(scraped) => {
                let samples = scraped.rows.len() as u64;
                samples_dropped = Some(scraped.samples_dropped);
                remember(
                    &mut timestamped,
                    scraped.timestamped,
                    time_us,
                    scrapes,
                    usize::try_from(target.sample_limit).unwrap_or(usize::MAX),
                );
                batches.push(scraped.rows);
                let missing: Vec<String> = target
                    .histograms
                    .iter()
                    .filter(|h| !scraped.histograms.keys().any(|(f, _)| f == *h))
                    .cloned()
                    .collect();
                let closed = windows.advance(grid_us, time_us, scraped.histograms);
                if !closed.is_empty() {
                    let mut rows = BatchBuilder::new(&SERVICE_LATENCY);
                    for (family, labels, delta, span) in &closed {
                        let unit = scale(family);
                        let observations = delta.last().map_or(0.0, |b| b.1);
                        let quantile = |q: f64| bucket_quantile(q, delta).map(|v| v * unit);
                        let row = ServiceLatencyRow {
                            target: &target.name,
                            metric: family,
                            labels,
                            p50_seconds: quantile(0.5),
                            p99_seconds: quantile(0.99),
                            p999_seconds: quantile(0.999),
                            observations,
                            observations_per_second: (*span > 0.0).then(|| observations / span),
                            window_seconds: *span,
                        };
                        rows.push_row(time_us, &row)
                            .expect("a latency row is for the service_latency table");
                    }
                    let rows = rows.finish();
                    latency = Some(rows.clone());
                    batches.push(rows);
                }
                (1, Some(samples), missing, None)
            }
            Err(f) => {
                failures[f.reason.index()] += 1;
                (0, None, Vec::new(), Some(f))
            }
        };
        let mut status = BatchBuilder::new(&SCRAPE_TARGET);
        let failed = |reason: Reason| failures[reason.index()];
        let row = ScrapeTargetRow {
            target: &target.name,
            up,
            duration_seconds: duration,
            samples,
            samples_dropped,
            scrapes,
            scrapes_dropped: dropped,
            failures_connect: failed(Reason::Connect),
            failures_timeout: failed(Reason::Timeout),
            failures_http: failed(Reason::Http),
            failures_invalid: failed(Reason::Invalid),
            failures_limit: failed(Reason::Limit),
        };
        status
            .push_row(time_us, &row)
            .expect("a status row is for the scrape_target table");
        let status = Arc::new(status.finish());

        let mut all = shared.targets.lock().expect("not poisoned");
        let Some(state) = all.get_mut(&target.name) else {
            return;
        };
        log.transition(&target.name, &state.failing, failure.as_ref());
        state.counts = Counts {
            scrapes,
            failures,
            dropped,
        };
        state.failing = failure;
        state.missing = missing;
        state.status = Some(status.clone());
        match latency {
            Some(rows) => state.latency = Some(Arc::new(rows)),
            // A failing target's last quantiles leave /metrics with it.
            None if up == 0 => state.latency = None,
            None => {}
        }
        let this_scrape = batches.len() + 1;
        state.pending.extend(batches.into_iter().map(Arc::new));
        state.pending.push(status);
        // Oldest first, never this scrape's: by count, and by rows so that
        // scrapes at the sample limit cannot pile up in memory.
        let max_rows = target.sample_limit.saturating_mul(scrapes_at_limit);
        let mut rows: u64 = state.pending.iter().map(|b| b.len() as u64).sum();
        let mut excess = 0;
        while state.pending.len() - excess > this_scrape
            && (state.pending.len() - excess > max_pending || rows > max_rows)
        {
            rows -= state.pending[excess].len() as u64;
            excess += 1;
        }
        // Whole scrapes go: each ends with its status row.
        let gone = state.pending[..excess]
            .iter()
            .filter(|b| std::ptr::eq(b.table, &SCRAPE_TARGET))
            .count() as u64;
        state.pending.drain(..excess);
        if gone > 0 {
            dropped += gone;
            state.counts.dropped = dropped;
            if last_drop_warning.is_none_or(|at| at.elapsed() >= LOG_INTERVAL) {
                last_drop_warning = Some(Instant::now());
                tracing::warn!(
                    target_name = %target.name,
                    dropped,
                    "Scrapes dropped before the store took them: the scrape collector is not harvesting in time (scrapes_dropped counts them)."
                );
            }
        }
    }
}

/// A target's log lines: one when its state changes (failing, another
/// reason, recovered), but at most one warning per [`LOG_INTERVAL`] (a target
/// flapping around its sample_limit), the next one saying how many changes
/// went unlogged. A failure that was not logged has no recovery line.
#[derive(Default)]
pub(super) struct TransitionLog {
    pub(super) last_warning: Option<Instant>,
    /// Whether the failure going on was logged.
    pub(super) failure_logged: bool,
    /// Warnings not logged since the last one.
    pub(super) unlogged: u64,
}

impl TransitionLog {
    pub(super) fn transition(&mut self, name: &str, before: &Option<Failure>, now: Option<&Failure>) {
        let f = match (before, now) {
            (Some(_), None) => {
                if self.failure_logged {
                    tracing::info!(target_name = name, "Scrape target recovered.");
                }
                self.failure_logged = false;
                return;
            }
            (None, Some(f)) => f,
            (Some(old), Some(f)) if old.reason != f.reason => f,
            _ => return,
        };
        if self
            .last_warning
            .is_some_and(|at| at.elapsed() < LOG_INTERVAL)
        {
            if before.is_none() {
                self.failure_logged = false;
            }
            self.unlogged += 1;
            return;
        }
        let unlogged = std::mem::take(&mut self.unlogged);
        self.last_warning = Some(Instant::now());
        self.failure_logged = true;
        if before.is_none() {
            tracing::warn!(
                target_name = name,
                reason = f.reason.as_str(),
                error = %f.message,
                unlogged_changes = unlogged,
                "Scrape target failing; counted in vtax_scrape_target_failures_*, retried every interval."
            );
        } else {
            tracing::warn!(
                target_name = name,
                reason = f.reason.as_str(),
                error = %f.message,
                unlogged_changes = unlogged,
                "Scrape target still failing, for another reason."
            );
        }
    }
}
