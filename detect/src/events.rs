//! Judging each window: events opened and closed, suspects ranked, and
//! the rows the detector writes.

use super::*;

impl Detector {
    /// Judges every window that has ended; returns the rows to store and export.
    pub fn tick(&mut self, now_us: i64) -> Vec<Batch> {
        self.run_canary(now_us);
        let window_secs = self.config.window_secs as i64;
        let now_second = now_us.div_euclid(1_000_000);
        let current = now_second.div_euclid(window_secs) * window_secs;
        let mut next = *self.next_window.get_or_insert(current);
        // After a long stall, judge only the last window that has ended.
        if current - next > 100 * window_secs {
            next = current - window_secs;
        }
        // The clock went back (stepped by NTP, or set right after running
        // ahead): the next window would wait until the clock came back to
        // it, the detector silent meanwhile. Judge from now instead.
        if next > current + window_secs {
            tracing::warn!(
                seconds_back = next - current,
                "The clock went back: the detector judges windows from now."
            );
            next = current;
            // Seconds summed for windows of the time the clock ran ahead
            // would be mixed into those windows when the clock reaches them.
            self.gpu_tax
                .retain(|&window, _| window <= current + window_secs);
        }
        let mut out = Vec::new();
        while next + window_secs + WINDOW_GRACE_SECS <= now_second {
            out.extend(self.judge_window(next));
            next += window_secs;
        }
        self.next_window = Some(next);
        out
    }

    pub(super) fn judge_window(&mut self, window: i64) -> Vec<Batch> {
        let config = self.config.clone();
        let window_end = window + config.window_secs as i64;
        let time_us = window_end * 1_000_000;
        let mut signal_rows = BatchBuilder::new(&tables::DETECTOR_SIGNAL);
        let mut event_rows = BatchBuilder::new(&tables::NEIGHBOR_EVENTS);
        let mut resource_scores: BTreeMap<Resource, f64> = BTreeMap::new();
        // The window's steal for the tax: the mean of its seconds, as the
        // signal judges it. The latest second alone missed steal that came
        // in bursts between the seconds it happened to be read.
        let mut window_steal = None;
        let mut opened = Vec::new();
        let mut closed = Vec::new();
        for (key, state) in self.signals.iter_mut() {
            let judged = state.judge(window, &config);
            let Some(judged) = judged else { continue };
            if key.victim == "node" && key.signal == "steal_ratio" {
                window_steal = Some(judged.value);
            }
            let score = resource_scores.entry(key.resource).or_insert(0.0);
            *score = score.max(judged.score.max(0.0));
            let summary = judged.summary;
            let row = tables::DetectorSignalRow {
                resource: key.resource.name(),
                victim: &key.victim,
                signal: key.signal,
                value: judged.value,
                baseline_median: summary.map(|s| s.median),
                baseline_mad: summary.map(|s| s.mad),
                z: judged.score,
                abnormal: i64::from(judged.abnormal),
            };
            signal_rows
                .push_row(time_us, &row)
                .expect("a signal row is for the detector_signal table");
            let open = match self.open.get_mut(key) {
                Some(event) => {
                    event.last_judged_second = window_end;
                    true
                }
                None => false,
            };
            if !open && state.abnormal_run >= config.open_windows {
                let start_second = state.abnormal_since.unwrap_or(window);
                opened.push((
                    key.clone(),
                    start_second,
                    judged.score,
                    evidence(key, state, &judged),
                ));
            } else if open && state.normal_run >= config.close_windows {
                let end_second =
                    window_end - i64::from(config.close_windows) * config.window_secs as i64;
                closed.push((
                    key.clone(),
                    end_second,
                    "the signal returned to its baseline",
                ));
            } else if let Some(event) = self.open.get_mut(key) {
                event.peak_score = event.peak_score.max(judged.score);
            }
        }
        for (key, start_second, score, evidence) in opened {
            let since_second = start_second - PRE_ONSET_SECS;
            // Judged once a run: retried at every abnormal window, the test
            // lost the onset once the look-back passed it, and a workload's
            // own rise opened an event 90 s later.
            let judged_before = self
                .signals
                .get(&key)
                .is_some_and(|s| s.self_inflicted_since == Some(start_second));
            if judged_before || self.self_inflicted(&key, since_second) {
                if let Some(state) = self.signals.get_mut(&key) {
                    state.self_inflicted_since = Some(start_second);
                }
                tracing::debug!(victim = %key.victim, signal = key.signal, "Not an event: the cgroup's own usage rose with its stall.");
                continue;
            }
            let mut suspects = self.rank(&key, since_second);
            // Who is named at the open was busy as the stall began: in its
            // first two windows (the first may turn abnormal by chance just
            // before the antagonist starts). A workload that arrived later
            // correlates with the stall's later seconds (it added to it, or
            // a spike fell on its seconds) and was named as its cause, 23 s
            // after the stall began; it is named by an update if it stands
            // out, as any that arrives while the event is open.
            let onset = start_second..start_second + 2 * config.window_secs as i64;
            for suspect in &mut suspects {
                if suspect.score > 0.0
                    && !self.busy_during(&suspect.name, onset.clone(), key.resource)
                {
                    suspect.score = 0.0;
                }
            }
            rank::sort(&mut suspects);
            tracing::warn!(
                resource = key.resource.name(),
                victim = %key.victim,
                signal = key.signal,
                suspect = top_suspect(&suspects),
                score = format!("{score:.1}"),
                %evidence,
                "Noisy-neighbour event opened."
            );
            let event = OpenEvent {
                start_second,
                peak_score: score,
                named: named_first(&suspects),
                suspects,
                evidence,
                last_judged_second: window_end,
            };
            push_event_row(&mut event_rows, time_us, &key, &event, "open", None);
            self.open.insert(key, event);
        }
        // Suspects are ranked again every window: the more seconds of the
        // event the look-back holds, the clearer the correlation, and an
        // antagonist that arrives while the event is open is seen too.
        let keys: Vec<SignalKey> = self.open.keys().cloned().collect();
        for key in keys {
            let Some(since_second) = self.open.get(&key).map(|e| e.start_second - PRE_ONSET_SECS)
            else {
                continue;
            };
            let suspects = self.rank(&key, since_second);
            // Only a suspect that stands out and is busy now is named anew:
            // an event held open across several antagonists (the node's
            // pressure under one job after another) ranks over a look-back
            // that still holds the one before, and a neighbour that merely
            // flickers along scores by chance.
            // The load outside the cgroups is never named anew: it is no
            // workload that arrives, has no usual use to rise above, and in a
            // CPU stall it moves with the victim as the antagonist's load
            // takes room from it (it was named with r 0.97 where it fell).
            let nameable = standing_out(&suspects).filter(|&i| {
                let s = &suspects[i];
                s.name != OUTSIDE_SUSPECT && self.busy_now(&s.name, window, key.resource)
            });
            let Some(event) = self.open.get_mut(&key) else {
                continue;
            };
            if suspects.is_empty() || event.start_second >= window {
                continue;
            }
            let before = top_suspect(&event.suspects).to_string();
            for suspect in &suspects {
                if event.named.contains_key(&suspect.name) {
                    keep_best(&mut event.named, suspect.clone());
                }
            }
            event.suspects = suspects;
            let new_name = nameable.filter(|&i| !event.named.contains_key(&event.suspects[i].name));
            if let Some(i) = new_name {
                // The one named anew leads its row, as the log line names it.
                let named = event.suspects.remove(i);
                event.suspects.insert(0, named);
            }
            let now = top_suspect(&event.suspects).to_string();
            if new_name.is_some() {
                // Those it named before, not the top-ranked one before: a
                // suspect ranked first but not yet nameable is no one named.
                let named_before = match event.named.keys().map(String::as_str).collect::<Vec<_>>()
                {
                    named if named.is_empty() => "none".to_string(),
                    named => named.join(","),
                };
                event.named.insert(now.clone(), event.suspects[0].clone());
                // A suspect this event has not named before: an operator
                // reading the log or the events table must not wait for the
                // close to learn of it.
                tracing::warn!(
                    resource = key.resource.name(),
                    victim = %key.victim,
                    signal = key.signal,
                    suspect = now.as_str(),
                    named_before = named_before.as_str(),
                    score = format!("{:.2}", event.suspects[0].score),
                    "Noisy-neighbour event names a new suspect."
                );
                push_event_row(&mut event_rows, time_us, &key, event, "updated", None);
            } else if before != now {
                tracing::info!(
                    resource = key.resource.name(),
                    victim = %key.victim,
                    signal = key.signal,
                    was = before.as_str(),
                    suspect = now.as_str(),
                    "Noisy-neighbour event's top suspect changed."
                );
            }
        }
        // A victim that stopped reporting (its cgroup was removed, its GPU
        // fell off the bus) cannot return to normal: close its event where
        // it was last judged.
        let silent_since = window_end - 2 * config.lookback_secs as i64;
        for (key, event) in &self.open {
            if event.last_judged_second < silent_since {
                closed.push((
                    key.clone(),
                    event.last_judged_second,
                    "the victim signal stopped reporting",
                ));
            }
        }
        for (key, end_second, why) in closed {
            let Some(event) = self.open.remove(&key) else {
                continue;
            };
            let suspects = closing_suspects(&event);
            tracing::info!(
                resource = key.resource.name(),
                victim = %key.victim,
                signal = key.signal,
                duration_secs = end_second - event.start_second,
                suspect = top_suspect(&suspects),
                why,
                "Noisy-neighbour event closed."
            );
            let event = OpenEvent { suspects, ..event };
            push_event_row(
                &mut event_rows,
                time_us,
                &key,
                &event,
                "closed",
                Some(end_second),
            );
        }
        self.learn_usual(window);
        self.forget_stale(window);

        let mut out = vec![signal_rows.finish(), event_rows.finish()];
        // Seconds of windows never judged (a stall skipped them) go too.
        let later = self.gpu_tax.split_off(&(window + 1));
        let gpu_tax = std::mem::replace(&mut self.gpu_tax, later)
            .remove(&window)
            .unwrap_or_default();
        let later = self.observed_windows.split_off(&(window + 1));
        let observed = std::mem::replace(&mut self.observed_windows, later).contains(&window);
        // A window no row fell in was not measured: its tax, verdict and
        // scores would be the last ones carried on (the last jitter, no
        // NVLink missing) as if they had been.
        if observed {
            out.push(self.neighbor_rows(time_us));
            out.push(self.resource_rows(time_us, &resource_scores));
            out.push(self.tax_row(time_us, window_steal, gpu_tax));
            out.push(self.platform_row(time_us));
        }
        out.retain(|b| !b.is_empty());
        out
    }

    /// Ranks the suspects of `key` over the seconds from `since_second`.
    pub(super) fn rank(&self, key: &SignalKey, since_second: i64) -> Vec<Suspect> {
        let Some(state) = self.signals.get(key) else {
            return Vec::new();
        };
        let guest = !state.spec.outside_guest;
        // A leaf cgroup, or one that is gone: a job that ended (its cgroup
        // removed) may well be who stalled the victim, and the event's
        // closing row must still say so. One that gained children stopped
        // being a suspect of its own when it did (its usage holds theirs).
        let cgroup_eligible = |name: &str| {
            self.leaf_cgroups.contains(name) || !self.present_cgroups.contains_key(name)
        };
        let eligible = |name: &str, pool: Pool| match pool {
            Pool::GpuProcess => {
                guest && key.resource == Resource::Gpu && !same_lineage(name, &key.victim)
            }
            Pool::Cgroup => {
                guest
                    && !matches!(key.resource, Resource::Gpu | Resource::Io)
                    && cgroup_eligible(name)
                    && !same_lineage(name, &key.victim)
            }
            Pool::CgroupIo => {
                guest
                    && key.resource == Resource::Io
                    && cgroup_eligible(name)
                    && !same_lineage(name, &key.victim)
            }
            Pool::Hypervisor => key.resource == Resource::Cpu,
            Pool::Outside => guest && key.resource == Resource::Cpu,
        };
        let victim = state.seconds_since(since_second);
        let pool = match key.resource {
            Resource::Io => &self.io_suspects,
            _ => &self.suspects,
        };
        let mut suspects: BTreeMap<String, BTreeMap<i64, f64>> = pool
            .iter()
            .filter(|(name, s)| eligible(name, s.pool))
            .map(|(name, s)| (name.clone(), self.observed_usage(name, s, &victim)))
            .collect();
        if eligible(OUTSIDE_SUSPECT, Pool::Outside) {
            suspects.insert(OUTSIDE_SUSPECT.to_string(), self.outside_usage());
        }
        let scale = key.resource.usage_scale();
        let mut ranked = rank::rank(&victim, &suspects, scale);
        for suspect in &mut ranked {
            if suspect.name == HYPERVISOR_SUSPECT {
                if !self.steal_is_material(suspect, key) {
                    suspect.score = 0.0;
                }
            } else if self
                .usual_usage(&suspect.name, key.resource)
                .is_some_and(|usual| {
                    suspect.busy_usage - usual < MIN_RISE_OVER_USUAL_SCALES * scale
                })
            {
                suspect.score = 0.0;
            }
        }
        rank::sort(&mut ranked);
        ranked
    }

    /// A suspect's per-second usage, with the seconds before it
    /// appeared, while the detector was already watching its kind, as zero:
    /// a container or job started at the onset did not exist before it, so
    /// it used nothing then. Counting only the seconds it existed would see
    /// a newcomer busy throughout, flat, and uncorrelated with the onset.
    pub(super) fn observed_usage(
        &self,
        name: &str,
        suspect: &SuspectSeries,
        victim: &BTreeMap<i64, f64>,
    ) -> BTreeMap<i64, f64> {
        let mut usage: BTreeMap<i64, f64> = suspect.seconds.iter().copied().collect();
        let watched_since = match suspect.pool {
            Pool::Cgroup | Pool::CgroupIo => self.cgroups_watched_since,
            Pool::GpuProcess => self.gpus_watched_since,
            Pool::Hypervisor | Pool::Outside => None,
        };
        if let Some(watched) = watched_since {
            // The second it appeared is unknown (a usage is a rate, first
            // known a second later); before it, it did not exist. A cgroup
            // that became a leaf later (its children gone, or left out of
            // the rows) existed, as their parent: nothing is known of its
            // own usage before, so nothing is filled in.
            for &second in victim.keys() {
                if second > watched && second < suspect.appeared {
                    usage.insert(second, 0.0);
                }
            }
        }
        // Nor while it was gone before it came back under its path: left
        // out, a job run again in the same cgroup had its quiet seconds
        // between runs unranked, and its correlation taken over its busy
        // seconds only.
        for &(gone, back) in &suspect.absences {
            for (&second, _) in victim.range(gone..back) {
                usage.entry(second).or_insert(0.0);
            }
        }
        // A cgroup that is gone (its job ended) uses nothing from then on:
        // without those seconds, once the look-back has passed its onset, it
        // would look busy throughout, flat, and lose the event it caused.
        let gone = matches!(suspect.pool, Pool::Cgroup | Pool::CgroupIo)
            && !self.present_cgroups.contains_key(name);
        if let (true, Some(&last)) = (gone, usage.keys().next_back()) {
            for &second in victim.keys() {
                if second > last {
                    usage.insert(second, 0.0);
                }
            }
        }
        usage
    }

    /// CPUs busy outside every leaf cgroup, per second both are known.
    pub(super) fn outside_usage(&self) -> BTreeMap<i64, f64> {
        let leaves: BTreeMap<i64, f64> = self.leaf_busy.iter().copied().collect();
        self.node_busy
            .iter()
            .filter_map(|(second, busy)| leaves.get(second).map(|l| (*second, (busy - l).max(0.0))))
            .collect()
    }

    /// Whether the host's steal is a material cause of `key`'s signal, as
    /// the hypervisor's ranking found it: the steal, in the seconds it was
    /// high, reaches [`MIN_HYPERVISOR_STEAL_RATIO`] of the node's CPU time,
    /// and for a ratio signal its rise is at least [`MIN_HYPERVISOR_SHARE`]
    /// of the signal's. Steal that merely rises a little with the guest's
    /// own load (a busy loop makes the host preempt the vCPU more often)
    /// correlates well and explains nothing.
    pub(super) fn steal_is_material(&self, hypervisor: &Suspect, key: &SignalKey) -> bool {
        let Some(series) = self.suspects.get(HYPERVISOR_SUSPECT) else {
            return false;
        };
        let cpus = self.node_cpus.unwrap_or(1).max(1) as f64;
        let stolen: Vec<f64> = series.seconds.iter().map(|(_, v)| v / cpus).collect();
        let Some(peak_quarter) = upper_quartile_mean(&stolen) else {
            return false;
        };
        if peak_quarter < MIN_HYPERVISOR_STEAL_RATIO {
            return false;
        }
        let ratio_signal = key.signal.ends_with("_ratio");
        !ratio_signal || hypervisor.usage_change / cpus >= MIN_HYPERVISOR_SHARE * hypervisor.effect
    }

    /// Whether a cgroup's own usage rose with its signal: a workload that
    /// starts (or starts working harder) stalls on what it now competes for,
    /// and is the neighbour, not the victim.
    ///
    /// Its I/O where its I/O is counted, else its CPU time: a writer without
    /// I/O accounting (cgroup v1) still moves its CPU with its own I/O stall,
    /// and judged on a series it does not have it was its own victim.
    pub(super) fn self_inflicted(&self, key: &SignalKey, since_second: i64) -> bool {
        let own = match self.suspect_series(&key.victim, key.resource) {
            Some(series) => Some((series, key.resource.usage_scale())),
            None => self
                .suspects
                .get(&key.victim)
                .map(|series| (series, Resource::Cpu.usage_scale())),
        };
        let (Some(state), Some((own, scale))) = (self.signals.get(key), own) else {
            return false;
        };
        let victim = state.seconds_since(since_second);
        let own: BTreeMap<String, BTreeMap<i64, f64>> =
            [(key.victim.clone(), own.seconds.iter().copied().collect())].into();
        rank::rank(&victim, &own, scale)
            .first()
            .is_some_and(|s| s.correlation > 0.5 && s.usage_change > scale)
    }

    /// Drops the state of victims and suspects that left (a finished
    /// container's cgroup), unless an event still refers to them.
    pub(super) fn forget_stale(&mut self, window: i64) {
        let horizon = window - 2 * self.config.lookback_secs as i64;
        let open = &self.open;
        self.signals.retain(|key, state| {
            state.last_second >= horizon || open.contains_key(key) || key.victim == "node"
        });
        for suspects in [&mut self.suspects, &mut self.io_suspects] {
            suspects.retain(|_, s| {
                s.seconds
                    .back()
                    .is_some_and(|(second, _)| *second >= horizon)
            });
        }
        self.counters
            .retain(|_, (time_us, _)| second_of(*time_us) >= horizon);
    }

    /// One row per resource, victim and suspect of the open events: where
    /// two events of a victim's resource (the node's CPU pressure and its
    /// jitter tail) rank the same suspect, its higher score. A row per
    /// event gave `/metrics` two samples of one series, and the table two
    /// rows of one key.
    pub(super) fn neighbor_rows(&self, time_us: i64) -> Batch {
        let mut best: BTreeMap<(Resource, &str, &str), &Suspect> = BTreeMap::new();
        for (key, event) in &self.open {
            for suspect in event
                .suspects
                .iter()
                .filter(|s| s.score > 0.0)
                .take(SUSPECTS_EXPORTED)
            {
                best.entry((key.resource, key.victim.as_str(), suspect.name.as_str()))
                    .and_modify(|kept| {
                        if suspect.score > kept.score {
                            *kept = suspect;
                        }
                    })
                    .or_insert(suspect);
            }
        }
        let mut rows = BatchBuilder::new(&tables::NEIGHBOR);
        for ((resource, victim, name), suspect) in best {
            let row = tables::NeighborRow {
                resource: resource.name(),
                victim,
                suspect: name,
                suspected: suspect.score,
                correlation: suspect.correlation,
            };
            rows.push_row(time_us, &row)
                .expect("a suspect row is for the neighbor table");
        }
        rows.finish()
    }

    pub(super) fn resource_rows(&self, time_us: i64, scores: &BTreeMap<Resource, f64>) -> Batch {
        let mut rows = BatchBuilder::new(&tables::NEIGHBOR_RESOURCE);
        for (resource, score) in scores {
            let open = self.open.keys().filter(|k| k.resource == *resource).count();
            let row = tables::NeighborResourceRow {
                resource: resource.name(),
                score: *score,
                events_open: open as i64,
            };
            rows.push_row(time_us, &row)
                .expect("a resource row is for the neighbor_resource table");
        }
        rows.finish()
    }

    /// The tax of the window ending at `time_us`, its steal and GPU ratios
    /// the means of its seconds (`window_steal`, `gpu`).
    pub(super) fn tax_row(
        &self,
        time_us: i64,
        window_steal: Option<f64>,
        gpu: GpuTaxSums,
    ) -> Batch {
        // The last jitter window, while it is current: once the probe stops
        // (turned off by a reload, failing), its last figures must not stand
        // in for the windows after it.
        let jitter = self.jitter.filter(|j| j.current_at(time_us));
        let facts = &self.facts;
        let row = tables::TaxRow {
            steal_ratio: window_steal,
            interrupted_ratio: jitter.and_then(|j| j.interrupted_ratio),
            unexplained_ratio: jitter.and_then(|j| j.unexplained_ratio),
            jitter_p99_seconds: jitter.map(|j| j.p99_seconds),
            jitter_busy_ratio: jitter.and_then(|j| j.busy_ratio),
            hbm_peak_ratio: gpu.hbm_peak.mean(),
            nvlink_peak_ratio: gpu.nvlink_peak.mean(),
            nvlink_links_missing_ratio: facts.nvlink_links_missing_ratio(),
            pcie_bandwidth_loss_ratio: gpu.pcie_bandwidth_loss.mean(),
            gpu_clock_throttle_ratio: gpu.clock_throttle.mean(),
            probe_host_to_device_ratio: facts.lowest(|g| g.probe.host_to_device.ratio()),
            probe_device_to_host_ratio: facts.lowest(|g| g.probe.device_to_host.ratio()),
            probe_device_to_device_ratio: facts.lowest(|g| g.probe.device_to_device.ratio()),
        };
        let mut rows = BatchBuilder::new(&tables::TAX);
        rows.push_row(time_us, &row)
            .expect("a tax row is for the tax table");
        rows.finish()
    }

    pub(super) fn platform_row(&self, time_us: i64) -> Batch {
        let verdict = self.facts.verdict();
        let mut rows = BatchBuilder::new(&tables::PLATFORM);
        rows.push_row(time_us, &verdict.row())
            .expect("a verdict row is for the platform table");
        rows.finish()
    }
}

/// The first suspect with a positive score, for the log.
/// The mean of the largest quarter of `values` (at least one); `None` when
/// there are none.
pub(super) fn upper_quartile_mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top = &sorted[..sorted.len().div_ceil(4)];
    Some(top.iter().sum::<f64>() / top.len() as f64)
}

/// The suspect an event names first, as the map of the suspects it has
/// named.
pub(super) fn named_first(suspects: &[Suspect]) -> BTreeMap<String, Suspect> {
    suspects
        .first()
        .filter(|s| s.score > 0.0)
        .map(|s| (s.name.clone(), s.clone()))
        .into_iter()
        .collect()
}

/// Keeps `suspect` in `named` unless its name is there at a higher score.
pub(super) fn keep_best(named: &mut BTreeMap<String, Suspect>, suspect: Suspect) {
    match named.get(&suspect.name) {
        Some(best) if best.score >= suspect.score => {}
        _ => {
            named.insert(suspect.name.clone(), suspect);
        }
    }
}

/// The suspects of an event's closing row: each it named, at its best
/// standing while open, then the rest of the last ranking. The look-back
/// is the last 90 s: an antagonist that left more than that before the
/// close (the victim held above its baseline by other load) had dropped
/// out of it, and the row and the report named only the load that stayed.
pub(super) fn closing_suspects(event: &OpenEvent) -> Vec<Suspect> {
    let mut suspects: Vec<Suspect> = event.named.values().cloned().collect();
    suspects.extend(
        event
            .suspects
            .iter()
            .filter(|s| s.score > 0.0 && !event.named.contains_key(&s.name))
            .cloned(),
    );
    rank::sort(&mut suspects);
    suspects
}

/// Which suspect an open event may name anew: the first, in the ranking's
/// order, whose score reaches [`MIN_NEW_SUSPECT_SCORE`]. Ranked by score,
/// that was the first or none; ranked by standing, a heavier suspect under
/// the bar can come before a lighter one over it, and looking at the first
/// only named no one where the one over the bar stood out.
pub(super) fn standing_out(suspects: &[Suspect]) -> Option<usize> {
    suspects
        .iter()
        .position(|s| s.score >= MIN_NEW_SUSPECT_SCORE)
}

pub(super) fn top_suspect(suspects: &[Suspect]) -> &str {
    suspects
        .first()
        .filter(|s| s.score > 0.0)
        .map_or("none", |s| s.name.as_str())
}

/// Whether one cgroup path is the other or holds it.
pub(super) fn same_lineage(a: &str, b: &str) -> bool {
    let within = |inner: &str, outer: &str| {
        inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    within(a, b) || within(b, a)
}

pub(super) fn evidence(key: &SignalKey, state: &SignalState, judged: &Judged) -> String {
    let q = |value: f64| quantity(key.signal, value);
    match (state.spec.rule, judged.summary) {
        (Rule::Baseline { .. }, Some(s)) => format!(
            "{} {} of {} ({}): {} against a baseline median {} (MAD {}, {} windows), z {:.1}, {} windows in a row",
            key.resource.name(),
            key.signal,
            key.victim,
            state.spec.help,
            q(judged.value),
            q(s.median),
            q(s.mad),
            s.windows,
            judged.score,
            state.abnormal_run
        ),
        (Rule::Above { threshold }, _) | (Rule::Baseline { min_change: threshold, .. }, None) => format!(
            "{} {} of {} ({}): {} above the threshold {}, {} windows in a row",
            key.resource.name(),
            key.signal,
            key.victim,
            state.spec.help,
            q(judged.value),
            q(threshold),
            state.abnormal_run
        ),
    }
}

/// A signal's value for a person: durations in the unit that keeps them
/// readable (a cache load is nanoseconds, a wake-up tail microseconds).
pub(super) fn quantity(signal: &str, value: f64) -> String {
    if !signal.ends_with("_seconds") || value == 0.0 || !value.is_finite() {
        return format!("{value:.4}");
    }
    let magnitude = value.abs();
    let (scale, unit) = if magnitude < 1e-6 {
        (1e9, "ns")
    } else if magnitude < 1e-3 {
        (1e6, "µs")
    } else if magnitude < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    format!("{:.1} {unit}", value * scale)
}

pub(super) fn push_event_row(
    rows: &mut BatchBuilder,
    time_us: i64,
    key: &SignalKey,
    event: &OpenEvent,
    state: &str,
    end_second: Option<i64>,
) {
    let suspects = suspect_text::format(
        event
            .suspects
            .iter()
            .filter(|s| s.score > 0.0)
            .take(SUSPECTS_STORED),
    );
    let top = event.suspects.first().filter(|s| s.score > 0.0);
    let row = tables::NeighborEventRow {
        resource: key.resource.name(),
        victim: &key.victim,
        signal: key.signal,
        state,
        suspects: &suspects,
        evidence: &event.evidence,
        start_time_seconds: event.start_second as f64,
        end_time_seconds: end_second.map(|s| s as f64),
        score: event.peak_score,
        top_correlation: top.map(|s| s.correlation),
        effect_size: top.map(|s| s.effect),
    };
    rows.push_row(time_us, &row)
        .expect("an event row is for the neighbor_events table");
}
