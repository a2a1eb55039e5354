//! The collector on simulated and scripted GPUs.

use self::config::{DEFAULT_ENERGY_INTERVAL_SECS, DEFAULT_QUIET_ENERGY_INTERVAL_SECS};
use super::*;
use vtax_store::batch::Values;
use vtax_store::schema::TableDef;

pub(crate) fn simulated(scenarios: &[&str]) -> Gpu {
    let config = GpuConfig {
        simulate_gpus: scenarios.len() as u32,
        simulate_scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
        ..GpuConfig::default()
    };
    let roots = Roots {
        procfs: "/nonexistent/proc".into(),
        sysfs: "/nonexistent/sys".into(),
        ..Roots::default()
    };
    let mut gpu = Gpu::new(&config, &roots);
    assert!(matches!(gpu.probe(), Availability::Available(_)));
    gpu
}

fn table<'a>(batches: &'a [Batch], table: &TableDef) -> Option<&'a Batch> {
    batches.iter().find(|b| std::ptr::eq(b.table, table))
}

/// The value of `field` in the row whose first tags are `tags`.
fn value(batches: &[Batch], table_def: &TableDef, tags: &[&str], field: &str) -> Option<f64> {
    let batch = table(batches, table_def)?;
    let column = &batch.fields[table_def.field_index(field).expect("field exists")];
    let row = (0..batch.len()).find(|&r| {
        tags.iter().enumerate().all(|(t, want)| {
            let c = &batch.tags[t];
            c.dict[c.codes[r] as usize] == *want
        })
    })?;
    column.is_valid(row).then(|| match &column.values {
        Values::F64(v) => v[row],
        Values::I64(v) => v[row] as f64,
        Values::U64(v) => v[row] as f64,
    })
}

#[test]
fn a_lost_gpu_is_reported_and_the_others_go_on() {
    let mut gpu = simulated(&["training", "gpu-lost", "training"]);
    let batches = gpu.collect(1_000_000).unwrap();
    let rows = table(&batches, &GPU).unwrap();
    assert_eq!(rows.tags[0].dict, vec!["0", "2"], "GPU 1 has no sample row");
    assert_eq!(value(&batches, &HEALTH, &["1"], "up"), Some(0.0));
    assert_eq!(value(&batches, &HEALTH, &["2"], "up"), Some(1.0));
    assert_eq!(
        value(&batches, &XID, &["1", &gpu.gpus[1].uuid, "79"], "errors"),
        Some(1.0)
    );
    let events = table(&batches, &EVENT).unwrap();
    let kinds: Vec<&str> = events.tags[2]
        .codes
        .iter()
        .map(|&c| events.tags[2].dict[c as usize].as_str())
        .collect();
    assert_eq!(kinds, vec!["lost", "xid"]);
    // The info row stays, so the operator knows which board to pull.
    assert_eq!(table(&batches, &INFO).unwrap().len(), 3);
    assert!(gpu
        .problems()
        .iter()
        .any(|p| p.contains("GPU 1") && p.contains("lost")));

    // The next tick: still down, counted, but no second "lost" event.
    let batches = gpu.collect(2_000_000).unwrap();
    assert_eq!(value(&batches, &HEALTH, &["1"], "sample_errors"), Some(2.0));
    assert!(table(&batches, &EVENT).is_none());
}

#[test]
fn scenarios_show_in_the_metrics_that_reveal_them() {
    let mut gpu = simulated(&[
        "training",
        "thermal-throttle",
        "pcie-degraded",
        "nvlink-hidden",
        "power-throttle",
    ]);
    gpu.collect(0).unwrap();
    // The replay counter is a slow read: the tick of its second read.
    let b = gpu.collect(30_000_000).unwrap();
    // Training: HBM bytes/s is the DRAM ratio times the H100's 3.35 TB/s peak.
    let ratio = value(&b, &GPU, &["0"], "dram_bandwidth_ratio").unwrap();
    let hbm = value(&b, &GPU, &["0"], "hbm_bytes_per_second").unwrap();
    assert!((hbm - ratio * 3.35232e12).abs() < 1e6, "{hbm} vs {ratio}");
    assert_eq!(value(&b, &GPU, &["0"], "clock_event_reasons"), Some(0.0));
    // Thermal: both thermal reasons, and the SM clock below its maximum.
    let uuid1 = gpu.gpus[1].uuid.clone();
    for reason in ["sw_thermal_slowdown", "hw_thermal_slowdown"] {
        assert_eq!(
            value(&b, &CLOCK_EVENT, &["1", &uuid1, reason], "active"),
            Some(1.0)
        );
    }
    assert_eq!(
        value(&b, &CLOCK_EVENT, &["1", &uuid1, "sw_power_cap"], "active"),
        Some(0.0)
    );
    assert!(
        value(&b, &GPU, &["1"], "sm_clock_hertz")
            < value(&b, &GPU, &["1"], "sm_clock_max_hertz")
    );
    // PCIe trained down under load, and replays counting.
    assert_eq!(value(&b, &GPU, &["2"], "pcie_link_gen"), Some(3.0));
    assert_eq!(value(&b, &GPU, &["2"], "pcie_link_width"), Some(8.0));
    assert!(value(&b, &GPU, &["2"], "pcie_replays").unwrap() > 0.0);
    // NVLink hidden: 0 links up of the product's 18, passthrough.
    assert_eq!(value(&b, &GPU, &["3"], "nvlink_links_up"), Some(0.0));
    assert_eq!(value(&b, &GPU, &["3"], "nvlink_links_product"), Some(18.0));
    assert_eq!(
        value(&b, &GPU, &["3"], "nvlink_total_rx_bytes_per_second"),
        None
    );
    // Power: at the limit with the power-cap reason.
    assert_eq!(
        value(&b, &GPU, &["4"], "power_watts"),
        value(&b, &GPU, &["4"], "power_limit_watts")
    );
    let problems = gpu.problems().join("\n");
    for needle in [
        "GPU 1 (",
        "sw_thermal_slowdown",
        "Gen3 x8 under load",
        "0 of 18 NVLink links up",
        "sw_power_cap",
    ] {
        assert!(problems.contains(needle), "{needle} in:\n{problems}");
    }
    assert!(
        !problems.contains("GPU 0 ("),
        "a healthy GPU has no problem:\n{problems}"
    );
}

/// Every counter series of `batches` as (table, tags, field) → value.
fn counters(batches: &[Batch]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for b in batches.iter().filter(|b| b.table.exported) {
        for (f, field) in b.table.fields.iter().enumerate() {
            if field.kind != vtax_store::MetricKind::Counter {
                continue;
            }
            for row in (0..b.len()).filter(|&r| b.fields[f].is_valid(r)) {
                let tags: Vec<&str> = b
                    .tags
                    .iter()
                    .map(|c| c.dict[c.codes[row] as usize].as_str())
                    .collect();
                let v = match &b.fields[f].values {
                    Values::F64(v) => v[row],
                    Values::I64(v) => v[row] as f64,
                    Values::U64(v) => v[row] as f64,
                };
                out.insert(format!("{} {tags:?} {}", b.table.name, field.name), v);
            }
        }
    }
    out
}

/// A reload that changes the collector's settings builds it anew; the
/// new one carries on the counts of the old, so none goes back or
/// leaves (an XID counter once fell from 6 to 1 on SIGHUP).
#[test]
fn a_rebuilt_collector_takes_over_the_counts_of_the_old() {
    let mut old = simulated(&["xid", "gpu-lost", "training"]);
    old.collect(1_000_000).unwrap();
    let before = counters(&old.collect(122_000_000).unwrap());
    assert_eq!(
        before
            .iter()
            .filter(|(k, _)| k.starts_with("gpu_xid "))
            .count(),
        3,
        "31 and 13 on GPU 0, 79 on GPU 1: {before:?}"
    );
    let roots = Roots {
        procfs: "/nonexistent/proc".into(),
        sysfs: "/nonexistent/sys".into(),
        ..Roots::default()
    };
    // The same backend settings (the backend goes on), then other ones
    // (a new simulator, whose clock starts again).
    let changes: [fn(&mut GpuConfig); 2] = [
        |c| c.processes = false,
        |c| c.simulate_profile = "h200".into(),
    ];
    for change in changes {
        let mut config = old.config.clone();
        change(&mut config);
        let mut new = Gpu::new(&config, &roots);
        new.take_over(Box::new(old));
        assert!(matches!(new.probe(), Availability::Available(_)));
        let after = counters(&new.collect(123_000_000).unwrap());
        for (series, value) in &before {
            let now = after.get(series);
            // The driver's own counters, which a new simulator starts
            // again as a reloaded driver would.
            let kept_by_the_backend =
                series.starts_with("gpu ") || series.starts_with("gpu_nvlink ");
            if kept_by_the_backend && config.simulate_profile == "h200" {
                continue;
            }
            assert!(
                now.is_some_and(|now| now >= value),
                "{series}: {value} before, {now:?} after ({config:?})"
            );
        }
        old = new;
    }
}

/// A PCIe board's name gives it no NVLink; bridged, its links are up, and
/// they are the board's: counted, with the peak over them (it read 0 links
/// of its product and a peak of 0 beside 18 links up).
#[test]
fn a_bridged_pcie_boards_links_up_are_its_own() {
    let mut gpu = simulated(&["training"]);
    gpu.gpus[0].nvlink_links_product = Some(0);
    let batches = gpu.collect(1_000_000).unwrap();
    let uuid = gpu.gpus[0].uuid.clone();
    let field = |name: &str| value(&batches, &GPU, &["0", &uuid], name);
    assert_eq!(field("nvlink_links_up"), Some(18.0));
    assert_eq!(field("nvlink_links_product"), Some(18.0));
    assert_eq!(field("nvlink_peak_bytes_per_second"), Some(900e9));
}

/// At the agent's start the XID counts go on from the store's latest rows
/// (by GPU UUID), so a code counted once before a restart reads 2 at its
/// next XID, not 1 again: `increase()` saw no XID in a count of 1 born
/// again at 1, and the alert on it stayed silent.
#[test]
fn a_started_collector_takes_its_xid_counts_up_from_the_store() {
    let first = simulated(&["xid"]);
    let uuid = first.gpus[0].uuid.clone();
    let config = first.config.clone();
    let roots = Roots {
        procfs: "/nonexistent/proc".into(),
        sysfs: "/nonexistent/sys".into(),
        ..Roots::default()
    };
    let mut gpu = Gpu::new(&config, &roots);
    assert_eq!(gpu.resumes_from().map(|t| t.name), Some("gpu_xid"));
    let stored = |uuid: &str, code: &str, errors: f64| crate::LatestRow {
        time_us: 0,
        tags: vec!["0".into(), uuid.into(), code.into()],
        fields: vec![Some(errors)],
    };
    gpu.resume(&[
        stored(&uuid, "31", 1.0),
        stored(&uuid, "48", 3.0),
        // Another GPU's, and rows that do not read: left alone.
        stored("GPU-elsewhere", "79", 1.0),
        stored(&uuid, "x", 9.0),
    ]);
    assert!(matches!(gpu.probe(), Availability::Available(_)));
    let batches = gpu.collect(1_000_000).unwrap();
    // XID 31 again at the simulator's first tick: 1 before, 2 now.
    assert_eq!(value(&batches, &XID, &["0", &uuid, "31"], "errors"), Some(2.0));
    assert_eq!(value(&batches, &XID, &["0", &uuid, "48"], "errors"), Some(3.0));
    assert_eq!(table(&batches, &XID).unwrap().len(), 2);
}

/// Simulated GPUs with the collector's settings changed by `change`.
fn simulated_with(scenarios: &[&str], change: impl FnOnce(&mut GpuConfig)) -> Gpu {
    let mut config = GpuConfig {
        simulate_gpus: scenarios.len() as u32,
        simulate_scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
        ..GpuConfig::default()
    };
    change(&mut config);
    let roots = Roots {
        procfs: "/nonexistent/proc".into(),
        sysfs: "/nonexistent/sys".into(),
        ..Roots::default()
    };
    let mut gpu = Gpu::new(&config, &roots);
    assert!(matches!(gpu.probe(), Availability::Available(_)));
    gpu
}

/// The simulated training GPU draws 615 + 25 sin(2πt/60 + i) W and its
/// counter is that power's exact integral. Read every 30 s (the idle GPU,
/// quiet, every 300 s) and integrated by 1 s trapezoids in between, the
/// exported counter must be
/// the exact one at each exact read (or, where the integration ran
/// ahead, hold above it by no more than that error), never go back, and
/// stay within the trapezoid's bound in between: L Δt² max|P''| / 12 =
/// 30 s × (1 s)² × 25 W × (2π/60 s)² / 12 = 0.69 J.
#[test]
fn energy_is_exact_at_each_exact_read_and_within_the_bound_between() {
    let scenarios = ["training", "memory-bound", "idle", "training"];
    let mut spaced = simulated(&scenarios);
    let mut exact = simulated_with(&scenarios, |c| c.energy_interval_secs = 0.0);
    let omega = std::f64::consts::TAU / sim::WOBBLE_PERIOD_SECONDS;
    let bound = DEFAULT_ENERGY_INTERVAL_SECS * 25.0 * omega * omega / 12.0;
    let mut before: Vec<Option<f64>> = vec![None; scenarios.len()];
    let (mut exact_reads, mut held, mut largest_gap) = (0, 0, 0.0f64);
    // Ticks a second apart, each a little late, as a loaded node's are.
    for second in 0..=300i64 {
        let time_us = 1_000_000 * second + 7_000 * (second % 3);
        let a = spaced.collect(time_us).unwrap();
        let b = exact.collect(time_us).unwrap();
        for (gpu, previous) in before.iter_mut().enumerate() {
            let gpu = gpu.to_string();
            let get = |batches, field| value(batches, &GPU, &[&gpu], field).unwrap();
            let (ours, truth) = (get(&a, "energy_joules"), get(&b, "energy_joules"));
            assert_eq!(get(&b, "energy_exact_age_seconds"), 0.0);
            if let Some(previous) = *previous {
                assert!(
                    ours >= previous,
                    "GPU {gpu} at {second} s: {ours} after {previous}"
                );
            }
            if get(&a, "energy_exact_age_seconds") == 0.0 {
                exact_reads += 1;
                if ours != truth {
                    // Held where the integration ran ahead of the counter.
                    held += 1;
                    assert_eq!(Some(ours), *previous, "GPU {gpu} at {second} s");
                    assert!(ours > truth && ours - truth <= bound, "{ours} vs {truth}");
                }
            } else {
                // The idle GPU is quiet: its cadence is the quiet one.
                let interval = if scenarios[gpu.parse::<usize>().unwrap()] == "idle" {
                    DEFAULT_QUIET_ENERGY_INTERVAL_SECS
                } else {
                    DEFAULT_ENERGY_INTERVAL_SECS
                };
                assert!(get(&a, "energy_exact_age_seconds") < interval + 1.0);
            }
            largest_gap = largest_gap.max((ours - truth).abs());
            assert!(
                (ours - truth).abs() <= bound,
                "GPU {gpu} at {second} s: {ours} against the exact {truth}, bound {bound} J"
            );
            *previous = Some(ours);
        }
    }
    // 0, 30, ..., 300 s on each of the three GPUs at work; 0 and 300 s on
    // the idle one.
    assert_eq!(exact_reads, 11 * 3 + 2);
    assert!(held < exact_reads, "most exact reads are met exactly");
    // A wrong rule (a rectangle, or the power not integrated) is off by
    // tens to thousands of joules: the comparison is not vacuous.
    assert!(largest_gap > 0.0 && largest_gap <= bound, "{largest_gap}");
    let errors = value(
        &spaced.collect(301_000_000).unwrap(),
        &GPU,
        &["0"],
        "energy_integration_error_joules",
    )
    .unwrap();
    assert!(errors.abs() <= bound, "{errors}");
}

/// One sentinel power reading between exact reads would run the
/// integrated counter 4.3 MJ ahead, and the counter, which never goes
/// back, would then stand still for hours. Left out, it costs the
/// integration one reading: the counter stays within the trapezoid's bound
/// of the exact one, and the value is named while it lasts.
#[test]
fn a_value_no_gpu_can_have_is_left_out_and_named() {
    let garbled_us = 10_000_000;
    let mut garbled = simulated(&["training"]);
    // What a driver's sentinel looks like, once, on GPU 0: `u32::MAX`
    // milliwatts and a percentage past 100.
    garbled.backend = Some(Box::new(Tapped {
        inner: garbled.backend.take().expect("probed"),
        tap: move |gpu: &GpuIdentity, time_us, _, s: &mut GpuSample| {
            if gpu.index == 0 && time_us == garbled_us {
                s.power_watts = Some(f64::from(u32::MAX) / 1e3);
                s.utilization_gpu_ratio = Some(2.55);
            }
            // A slow read, made at the first tick and every 30 s: held
            // between, and so left out between too.
            if gpu.index == 0 && s.power_limit_watts.is_some() {
                s.power_limit_watts = Some(f64::from(u32::MAX) / 1e3);
            }
        },
    }));
    let mut exact = simulated_with(&["training"], |c| c.energy_interval_secs = 0.0);
    let omega = std::f64::consts::TAU / sim::WOBBLE_PERIOD_SECONDS;
    // One interval of two ticks where the reading is missing: 2³ s³ in place
    // of 2 × 1 s³ in the trapezoid's error term.
    let bound = (DEFAULT_ENERGY_INTERVAL_SECS + 6.0) * 25.0 * omega * omega / 12.0;
    let mut before = None;
    for second in 0..=60i64 {
        let time_us = 1_000_000 * second;
        let a = garbled.collect(time_us).unwrap();
        let b = exact.collect(time_us).unwrap();
        let get = |batches, field| value(batches, &GPU, &["0"], field);
        let (ours, truth) = (get(&a, "energy_joules"), get(&b, "energy_joules"));
        let (ours, truth) = (ours.unwrap(), truth.unwrap());
        if time_us == garbled_us {
            // Without the tick's reading the counter holds, and takes the
            // two seconds in at the next reading.
            assert_eq!(Some(ours), before, "at {second} s");
        } else {
            assert!(
                (ours - truth).abs() <= bound,
                "at {second} s: {ours} J against the exact {truth} J, bound {bound} J"
            );
        }
        before = Some(ours);
        let named: Vec<String> = garbled
            .problems()
            .into_iter()
            .filter(|p| p.contains("no GPU can") && !p.contains("power_limit_watts"))
            .collect();
        assert_eq!(get(&a, "power_limit_watts"), None, "at {second} s");
        assert!(
            garbled
                .problems()
                .iter()
                .any(|p| p.contains("power_limit_watts = 4294967.295")),
            "at {second} s"
        );
        if time_us == garbled_us {
            assert_eq!(get(&a, "power_watts"), None);
            assert_eq!(get(&a, "utilization_ratio"), None);
            // The lone process's share, taken from the GPU's utilisation,
            // is left out with it.
            assert_eq!(named.len(), 3, "{named:?}");
            assert!(named[0].contains("utilization_ratio = 2.55"), "{named:?}");
            assert!(named[1].contains("power_watts = 4294967.295"), "{named:?}");
            assert!(named[2].contains("process sm_utilization_ratio = 2.55"), "{named:?}");
        } else {
            assert!(get(&a, "power_watts").is_some_and(|w| w > 500.0));
            assert_eq!(get(&a, "utilization_ratio"), get(&b, "utilization_ratio"));
            assert!(named.is_empty(), "at {second} s: {named:?}");
        }
    }
}

/// An exact energy read a terajoule past the one before (a driver's glitch
/// within what a counter can hold) is doubted:
/// the counter carries on from the power readings, stays within the
/// trapezoid's bound of the exact counter, and the read is named on its
/// tick; the next exact read, which follows from the one before the glitch,
/// makes the counter exact again.
#[test]
fn an_exact_energy_read_that_does_not_follow_is_doubted_and_named() {
    let glitch_us = 1_000_000 * DEFAULT_ENERGY_INTERVAL_SECS as i64;
    let mut glitched = simulated(&["training"]);
    glitched.backend = Some(Box::new(Tapped {
        inner: glitched.backend.take().expect("probed"),
        tap: move |_: &GpuIdentity, time_us, _, s: &mut GpuSample| {
            if time_us == glitch_us {
                let read = s.energy_joules.expect("an exact read is due");
                s.energy_joules = Some(read + 1e12);
            }
        },
    }));
    let mut exact = simulated_with(&["training"], |c| c.energy_interval_secs = 0.0);
    let omega = std::f64::consts::TAU / sim::WOBBLE_PERIOD_SECONDS;
    // Two intervals with no exact read between: the one doubted.
    let bound = (2.0 * DEFAULT_ENERGY_INTERVAL_SECS + 6.0) * 25.0 * omega * omega / 12.0;
    let mut before: Option<f64> = None;
    for second in 0..=70i64 {
        let time_us = 1_000_000 * second;
        let a = glitched.collect(time_us).unwrap();
        let b = exact.collect(time_us).unwrap();
        let get = |batches, field| value(batches, &GPU, &["0"], field);
        let (ours, truth) = (get(&a, "energy_joules").unwrap(), get(&b, "energy_joules").unwrap());
        assert!(
            (ours - truth).abs() <= bound,
            "at {second} s: {ours} J against the exact {truth} J, bound {bound} J"
        );
        assert!(before.is_none_or(|b| ours >= b), "at {second} s: went back");
        before = Some(ours);
        let age = get(&a, "energy_exact_age_seconds").unwrap();
        let left_out = value(&a, &HEALTH, &["0"], "values_left_out");
        assert_eq!(left_out, Some(if time_us < glitch_us { 0.0 } else { 1.0 }), "at {second} s");
        let named: Vec<String> = glitched
            .problems()
            .into_iter()
            .filter(|p| p.contains("energy_joules"))
            .collect();
        if time_us == glitch_us {
            assert_eq!(named.len(), 1, "{named:?}");
            assert!(
                named[0].contains("which does not follow from the exact read before it; left out"),
                "{named:?}"
            );
            assert_eq!(age, DEFAULT_ENERGY_INTERVAL_SECS);
        } else {
            assert!(named.is_empty(), "at {second} s: {named:?}");
        }
        if second == 2 * DEFAULT_ENERGY_INTERVAL_SECS as i64 {
            assert_eq!(age, 0.0, "exact again");
            let error = get(&a, "energy_integration_error_joules").expect("an exact read");
            assert!(error.abs() <= bound, "{error} J");
        }
    }
}

/// A value left out is back once it is read in range again: a tick that
/// did not read it (the read failed, the GPU did not give it) says nothing
/// of it, so the log does not say it is back while it may still be wrong.
#[test]
fn a_value_left_out_is_back_only_when_read_in_range_again() {
    let mut gpu = simulated(&["training"]);
    gpu.backend = Some(Box::new(Tapped {
        inner: gpu.backend.take().expect("probed"),
        tap: |gpu: &GpuIdentity, time_us, _, s: &mut GpuSample| match (gpu.index, time_us) {
            (0, 1_000_000) => s.sm_clock_hz = Some(f64::from(u32::MAX) * 1e6),
            (0, 2_000_000) => s.sm_clock_hz = None,
            _ => {}
        },
    }));
    let named = |gpu: &Gpu| gpu.states[0].implausible_named.clone();
    gpu.collect(0).unwrap();
    assert!(named(&gpu).is_empty());
    gpu.collect(1_000_000).unwrap();
    assert_eq!(named(&gpu), ["sm_clock_hertz"]);
    gpu.collect(2_000_000).unwrap();
    assert_eq!(named(&gpu), ["sm_clock_hertz"], "not read: not back");
    assert!(gpu.problems().iter().all(|p| !p.contains("sm_clock_hertz")));
    gpu.collect(3_000_000).unwrap();
    assert!(named(&gpu).is_empty(), "read in range: back");
}

/// A quiet GPU reads the exact energy counter every
/// `quiet_energy_interval_secs`, a GPU at work every
/// `energy_interval_secs`; the first tick of work reads it when the work's
/// interval has passed, and the counter stays within the integration's
/// bound of the exact one throughout.
#[test]
fn a_quiet_gpu_reads_the_exact_energy_counter_once_per_quiet_interval() {
    let (scenarios, turns) = (WORK_ON_GPU_0, work_on_gpu_0(400.0, 450.0));
    let (mut spaced, counts) = simulated_counting(&scenarios, |_| {}, turns);
    let (mut exact, _) = simulated_counting(&scenarios, |c| c.energy_interval_secs = 0.0, turns);
    let (mut unstretched, _) =
        simulated_counting(&scenarios, |c| c.quiet_energy_interval_secs = 0.0, turns);
    assert_eq!(DEFAULT_QUIET_ENERGY_INTERVAL_SECS, 300.0);
    let omega = std::f64::consts::TAU / sim::WOBBLE_PERIOD_SECONDS;
    let wobble_bound = DEFAULT_ENERGY_INTERVAL_SECS * 25.0 * omega * omega / 12.0;
    // The idle GPU's 72 ± 1.5 W over a quiet interval: L Δt² max|P''| / 12.
    let quiet_bound = DEFAULT_QUIET_ENERGY_INTERVAL_SECS * 1.5 * omega * omega / 12.0;
    // Work that stops between two readings: the trapezoid takes half of
    // the step from training's 615 ± 25 W to idle's 72 ± 1.5 W for one second.
    let step_bound = (615.0 + 25.0 - 72.0 + 1.5) / 2.0 + wobble_bound;
    let mut largest_quiet_gap = 0.0f64;
    let mut reads_at: Vec<Vec<i64>> = vec![Vec::new(); scenarios.len()];
    let mut unstretched_reads = 0;
    let mut before: Vec<Option<f64>> = vec![None; scenarios.len()];
    for second in 0..=700i64 {
        let time_us = 1_000_000 * second;
        let reads_before = reads_of(&counts, "total_energy_consumption");
        let a = spaced.collect(time_us).unwrap();
        let b = exact.collect(time_us).unwrap();
        let c = unstretched.collect(time_us).unwrap();
        let mut read_now = 0;
        for (gpu, previous) in before.iter_mut().enumerate() {
            let name = gpu.to_string();
            let get = |batches, field| value(batches, &GPU, &[&name], field).unwrap();
            let (ours, truth) = (get(&a, "energy_joules"), get(&b, "energy_joules"));
            if get(&a, "energy_exact_age_seconds") == 0.0 {
                reads_at[gpu].push(second);
                read_now += 1;
            }
            if get(&c, "energy_exact_age_seconds") == 0.0 {
                unstretched_reads += 1;
            }
            if let Some(previous) = *previous {
                assert!(ours >= previous, "GPU {gpu} at {second} s: {ours} after {previous}");
            }
            *previous = Some(ours);
            let bound = if gpu == 0 && (450..460).contains(&second) {
                step_bound
            } else if gpu == 1 {
                largest_quiet_gap = largest_quiet_gap.max((ours - truth).abs());
                quiet_bound
            } else {
                wobble_bound
            };
            assert!(
                (ours - truth).abs() <= bound,
                "GPU {gpu} at {second} s: {ours} against the exact {truth}, bound {bound} J"
            );
        }
        assert_eq!(
            reads_of(&counts, "total_energy_consumption") - reads_before,
            read_now,
            "at {second} s: each exact read is one read of the driver"
        );
    }
    // GPU 0: quiet from 0 (read at 300), the first tick of work (400),
    // work's cadence (430), the first read after the work stopped (460),
    // quiet again from there (760 is after the end).
    assert_eq!(reads_at[0], vec![0, 300, 400, 430, 460]);
    assert_eq!(reads_at[1], vec![0, 300, 600]);
    assert_eq!(reads_at[2], (0..=690).step_by(30).collect::<Vec<i64>>());
    // Not stretched: every GPU on work's cadence, 0 to 690 s.
    assert_eq!(unstretched_reads, 3 * 24);
    // The quiet GPU's counter did drift from the exact one between its
    // reads, within the bound: the check above is not vacuous.
    assert!(
        largest_quiet_gap > 0.0 && largest_quiet_gap <= quiet_bound,
        "{largest_quiet_gap} J against {quiet_bound} J"
    );
}

/// A reload hands the integrated counter to the new collector: it does
/// not read the exact counter again at once, nor start over.
#[test]
fn the_energy_counter_carries_over_a_reload() {
    let mut old = simulated(&["training"]);
    let mut last = 0.0;
    for second in 0..12 {
        let b = old.collect(second * 1_000_000).unwrap();
        last = value(&b, &GPU, &["0"], "energy_joules").unwrap();
    }
    let config = GpuConfig {
        processes: false,
        ..old.config.clone()
    };
    let mut new = Gpu::new(&config, &Roots::default());
    new.take_over(Box::new(old));
    assert!(matches!(new.probe(), Availability::Available(_)));
    let b = new.collect(12_000_000).unwrap();
    assert_eq!(
        value(&b, &GPU, &["0"], "energy_exact_age_seconds"),
        Some(12.0)
    );
    let now = value(&b, &GPU, &["0"], "energy_joules").unwrap();
    assert!(now > last && now - last < 700.0, "{last} then {now}");
}

/// The shares of each GPU's processes at `batches`, by pid.
fn shares(batches: &[Batch], gpu: &str) -> BTreeMap<String, (Option<f64>, Option<f64>)> {
    let Some(b) = table(batches, &PROCESS) else {
        return BTreeMap::new();
    };
    let f = |name| match &b.fields[PROCESS.field_index(name).unwrap()].values {
        Values::F64(v) => v.clone(),
        _ => unreachable!("f64"),
    };
    let valid = |name, row| b.fields[PROCESS.field_index(name).unwrap()].is_valid(row);
    let (sm, memory) = (f("sm_utilization_ratio"), f("memory_utilization_ratio"));
    let tag = |t: usize, row: usize| b.tags[t].dict[b.tags[t].codes[row] as usize].clone();
    (0..b.len())
        .filter(|&row| tag(0, row) == gpu)
        .map(|row| {
            (
                tag(2, row),
                (
                    valid("sm_utilization_ratio", row).then_some(sm[row]),
                    valid("memory_utilization_ratio", row).then_some(memory[row]),
                ),
            )
        })
        .collect()
}

/// Wraps a backend, handing each sample to `tap` (which may change it)
/// before the collector takes it.
struct Tapped<F> {
    inner: Box<dyn GpuBackend>,
    tap: F,
}

/// Each sample's GPU, plan, and whether the shares were read.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(u32, ReadPlan, bool)>>>;

impl<F> GpuBackend for Tapped<F>
where
    F: FnMut(&GpuIdentity, i64, ReadPlan, &mut GpuSample) + Send,
{
    fn kind(&self) -> &'static str {
        "tapped"
    }
    fn driver_version(&self) -> String {
        self.inner.driver_version()
    }
    fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
        self.inner.identities()
    }
    fn sample(
        &mut self,
        gpu: &GpuIdentity,
        time_us: i64,
        plan: ReadPlan,
    ) -> Result<GpuSample, SampleError> {
        let mut s = self.inner.sample(gpu, time_us, plan)?;
        (self.tap)(gpu, time_us, plan, &mut s);
        Ok(s)
    }
    fn take_xids(&mut self) -> Vec<backend::XidEvent> {
        self.inner.take_xids()
    }
}

/// The collector with its backend keeping each sample's plan and whether
/// the shares were read.
fn with_plans(mut gpu: Gpu) -> (Gpu, Seen) {
    let seen: Seen = std::sync::Arc::default();
    let kept = std::sync::Arc::clone(&seen);
    gpu.backend = Some(Box::new(Tapped {
        inner: gpu.backend.take().expect("probed"),
        tap: move |gpu: &GpuIdentity, _, plan, s: &mut GpuSample| {
            let read = s.process_shares_read;
            kept.lock().unwrap().push((gpu.index, plan, read));
        },
    }));
    (gpu, seen)
}

#[test]
fn shared_gpus_read_shares_on_their_cadence_and_hold_them_between() {
    // GPU 0: one training process; GPU 1: MIG, three processes.
    let (mut gpu, seen) = with_plans(simulated(&["training", "mig"]));
    let mut read_at = BTreeMap::new();
    for second in 0..25 {
        let b = gpu.collect(second * 1_000_000).unwrap();
        let (one, mig) = (shares(&b, "0"), shares(&b, "1"));
        // The lone process has the GPU's utilisation, fresh each tick.
        let utilization = value(&b, &GPU, &["0"], "utilization_ratio");
        assert_eq!(one.len(), 1);
        assert_eq!(one.values().next().unwrap().0, utilization);
        assert_eq!(mig.len(), 3);
        assert!(mig
            .values()
            .all(|(sm, memory)| sm.is_some() && memory.is_some()));
        let reads = seen.lock().unwrap();
        let (_, _, read) = *reads.iter().rev().find(|(i, _, _)| *i == 1).unwrap();
        if read {
            read_at.insert(second, mig);
        } else {
            let (_, last) = read_at.iter().next_back().expect("read at 0 s");
            assert_eq!(&mig, last, "held at {second} s");
        }
    }
    assert_eq!(read_at.keys().copied().collect::<Vec<_>>(), [0, 10, 20]);
    // The shares did move between reads (so holding them is seen).
    assert_ne!(read_at[&0], read_at[&10]);
    let reads = seen.lock().unwrap();
    assert!(
        reads
            .iter()
            .filter(|(i, _, _)| *i == 0)
            .all(|(_, _, read)| !read),
        "a lone process's shares never need the driver"
    );
}

#[test]
fn every_read_every_tick_when_asked() {
    let (mut gpu, seen) = with_plans(simulated_with(&["training"], |c| {
        c.energy_interval_secs = 0.0;
        c.process_shares_interval_secs = 0.0;
        c.slow_reads_interval_secs = 0.0;
        c.loaded_link_interval_secs = 0.0;
        c.single_process_shares_from_utilization = false;
    }));
    for second in 0..5 {
        let b = gpu.collect(second * 1_000_000).unwrap();
        assert_eq!(
            value(&b, &GPU, &["0"], "energy_exact_age_seconds"),
            Some(0.0)
        );
    }
    let reads = seen.lock().unwrap();
    assert_eq!(reads.len(), 5);
    // Every read, with the MIG mode of the tick before carried along.
    assert!(reads.iter().enumerate().all(|(tick, (_, plan, read))| {
        *plan
            == ReadPlan {
                mig_enabled: (tick > 0).then_some(false),
                ..ReadPlan::ALL
            }
            && *read
    }));
    // And none with processes off.
    let (mut gpu, seen) = with_plans(simulated_with(&["mig"], |c| c.processes = false));
    gpu.collect(0).unwrap();
    assert!(seen.lock().unwrap().iter().all(|(_, _, read)| !read));
}

/// Simulated GPUs (settings changed by `change`) on a simulator that
/// `sim` sets up, and the simulator's count of its reads.
fn simulated_counting(
    scenarios: &[&str],
    change: impl FnOnce(&mut GpuConfig),
    sim: impl FnOnce(sim::SimBackend) -> sim::SimBackend,
) -> (Gpu, sim::ReadCounts) {
    let mut gpu = simulated_with(scenarios, change);
    let played = scenarios
        .iter()
        .map(|s| sim::Scenario::parse(s).expect("a scenario"))
        .collect();
    let backend = sim(sim::SimBackend::new(
        scenarios.len() as u32,
        sim::PROFILES[0],
        played,
    ));
    let counts = backend.read_counts();
    gpu.backend = Some(Box::new(backend));
    (gpu, counts)
}

/// Three simulated GPUs: GPU 0 idle but for training from `from` to `to`
/// seconds ([`work_on_gpu_0`]), GPU 1 idle throughout, GPU 2 training
/// throughout.
const WORK_ON_GPU_0: [&str; 3] = ["idle", "idle", "training"];

/// GPU 0's turns to training at `from` seconds and back to idle at `to`.
fn work_on_gpu_0(from: f64, to: f64) -> impl Fn(sim::SimBackend) -> sim::SimBackend + Copy {
    move |s| {
        s.turning(0, from, sim::Scenario::Training)
            .turning(0, to, sim::Scenario::Idle)
    }
}

/// How many times the simulator made `read`.
fn reads_of(counts: &sim::ReadCounts, read: &str) -> u64 {
    counts.lock().unwrap().get(read).copied().unwrap_or(0)
}

/// Tag `tag` of GPU `gpu`'s info row.
fn info_tag(batches: &[Batch], gpu: &str, tag: &str) -> String {
    let b = table(batches, &INFO).expect("info rows");
    let t = INFO.tags.iter().position(|t| t.name == tag).expect("a tag");
    let row = (0..b.len())
        .find(|&r| b.tags[0].dict[b.tags[0].codes[r] as usize] == gpu)
        .expect("the GPU's row");
    b.tags[t].dict[b.tags[t].codes[row] as usize].clone()
}

/// The fields of the `gpu` row that come from the slow reads.
const SLOW_FIELDS: [&str; 8] = [
    "power_limit_watts",
    "ecc_corrected_errors",
    "ecc_uncorrected_errors",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapping_pending",
    "remapping_failed",
    "pcie_replays",
];

#[test]
fn slow_reads_are_made_once_per_interval_and_held_between() {
    // GPU 0's replays grow 3 a second, GPU 1's corrected ECC errors one
    // every 10 s; GPU 2 has its NVLink links up with their rates moving.
    let scenarios = ["pcie-degraded", "xid", "training"];
    let (mut spaced, counts) = simulated_counting(&scenarios, |_| {}, |s| s);
    let (mut every, every_counts) =
        simulated_counting(&scenarios, |c| c.slow_reads_interval_secs = 0.0, |s| s);
    let mut read_at: Vec<i64> = Vec::new();
    let mut last_read: BTreeMap<(usize, &str), Option<f64>> = BTreeMap::new();
    for second in 0..=95i64 {
        // A little late now and then, as a loaded node's ticks are.
        let time_us = 1_000_000 * second + 7_000 * (second % 3);
        let reads_before = reads_of(&counts, "pcie_replay_counter");
        let a = spaced.collect(time_us).unwrap();
        let b = every.collect(time_us).unwrap();
        let read_now = reads_of(&counts, "pcie_replay_counter") > reads_before;
        if read_now {
            read_at.push(second);
        }
        for gpu in 0..scenarios.len() {
            let index = gpu.to_string();
            for field in SLOW_FIELDS {
                let ours = value(&a, &GPU, &[&index], field);
                let truth = value(&b, &GPU, &[&index], field);
                assert!(ours.is_some(), "{field} of GPU {gpu} null at {second} s");
                if read_now {
                    assert_eq!(ours, truth, "{field} of GPU {gpu} at {second} s");
                    last_read.insert((gpu, field), truth);
                } else {
                    assert_eq!(
                        Some(&ours),
                        last_read.get(&(gpu, field)),
                        "{field} of GPU {gpu} held at {second} s"
                    );
                }
            }
            for tag in ["virtualization_mode", "mig"] {
                assert_eq!(info_tag(&a, &index, tag), info_tag(&b, &index, tag));
            }
            // Each tick's own values stay fresh.
            for field in ["power_watts", "pcie_link_gen", "nvlink_links_up"] {
                assert_eq!(
                    value(&a, &GPU, &[&index], field),
                    value(&b, &GPU, &[&index], field),
                    "{field} of GPU {gpu} at {second} s"
                );
            }
        }
        // The links of GPU 2 keep their rows, state and counters, with
        // this tick's rates.
        let uuid = spaced.gpus[2].uuid.clone();
        for link in ["0", "17"] {
            for field in [
                "up",
                "rx_bytes_per_second",
                "tx_bytes_per_second",
                "crc_errors",
            ] {
                let ours = value(&a, &NVLINK, &["2", &uuid, link], field);
                assert!(ours.is_some(), "link {link} {field} at {second} s");
                assert_eq!(ours, value(&b, &NVLINK, &["2", &uuid, link], field));
            }
        }
        assert_eq!(
            table(&a, &NVLINK).map(Batch::len),
            table(&b, &NVLINK).map(Batch::len)
        );
    }
    assert_eq!(read_at, [0, 30, 60, 90]);
    // Once per interval on each GPU, every slow read; the rest each tick.
    for read in costs::SLOW {
        assert_eq!(reads_of(&counts, read), 4 * 3, "{read}");
        assert_eq!(reads_of(&every_counts, read), 96 * 3, "{read}");
    }
    for read in costs::EVERY_TICK {
        // Under load a link at its maximum is held for
        // `loaded_link_interval_secs` (5 s: GPUs 1 and 2); GPU 0's, below
        // it, is read every tick.
        let expected = if costs::PCIE_LINK_READS.contains(read) {
            96 + 20 * 2
        } else {
            96 * 3
        };
        assert_eq!(reads_of(&counts, read), expected, "{read}");
    }
    // The values did change between reads, so holding them was seen.
    assert_eq!(
        last_read[&(0, "pcie_replays")],
        Some(270.0),
        "read at 90 s: 3 a second"
    );
    let ecc = last_read[&(1, "ecc_corrected_errors")];
    assert_eq!(ecc, Some(9.0), "read at 90 s: one every 10 s");
}

/// A quiet GPU (no process, no kernel) reads GPM and its PCIe link once
/// per `slow_reads_interval_secs` and holds them in between; the first
/// tick anything runs reads them again, without GPM figures that would
/// spread the new work over the quiet seconds GPM's sample spans.
#[test]
fn a_quiet_gpu_reads_gpm_and_its_link_once_per_interval() {
    let (scenarios, turns) = (WORK_ON_GPU_0, work_on_gpu_0(40.0, 70.0));
    let (mut spaced, counts) = simulated_counting(&scenarios, |_| {}, turns);
    let (mut every, _) =
        simulated_counting(&scenarios, |c| c.slow_reads_interval_secs = 0.0, turns);
    let gpm_read = "gpm_sample, gpm_metrics_get";
    let mut gpm_reads_at: Vec<i64> = Vec::new();
    for second in 0..=110i64 {
        let time_us = 1_000_000 * second;
        let before = (reads_of(&counts, gpm_read), reads_of(&counts, "current_pcie_link_gen"));
        let a = spaced.collect(time_us).unwrap();
        let b = every.collect(time_us).unwrap();
        let after = (reads_of(&counts, gpm_read), reads_of(&counts, "current_pcie_link_gen"));
        // The link with GPM, but for the GPUs under load that hold it
        // (`a_loaded_link_is_held_while_at_its_maximum`): GPU 2 but at its
        // reads every 5 s, GPU 0 through its work but at those.
        let holding = u64::from(second % 5 != 0)
            + u64::from((41..70).contains(&second) && second % 5 != 0);
        assert_eq!(
            after.1 - before.1,
            after.0 - before.0 - holding,
            "GPM and the link together at {second} s"
        );
        // GPU 2 is read every tick; what is left is GPUs 0 and 1.
        assert!(after.0 - before.0 >= 1, "GPU 2 at {second} s");
        for _ in 1..after.0 - before.0 {
            gpm_reads_at.push(second);
        }
        for gpu in ["0", "1", "2"] {
            for field in [
                "sm_active_ratio",
                "dram_bandwidth_ratio",
                "pcie_rx_bytes_per_second",
                "pcie_link_gen",
                "pcie_link_width",
            ] {
                let ours = value(&a, &GPU, &[gpu], field);
                let truth = value(&b, &GPU, &[gpu], field);
                if gpu == "0" && second == 40 && field != "pcie_link_gen" && field != "pcie_link_width" {
                    // GPM's interval spans the skipped quiet ticks.
                    assert_eq!(ours, None, "{field} of GPU 0 as the work starts");
                    assert!(truth.is_some());
                } else {
                    assert!(ours.is_some(), "{field} of GPU {gpu} null at {second} s");
                    assert_eq!(ours, truth, "{field} of GPU {gpu} at {second} s");
                }
            }
        }
        assert_eq!(
            value(&a, &GPU, &["0"], "pcie_link_gen"),
            Some(if (40..70).contains(&second) { 5.0 } else { 1.0 }),
            "at {second} s: the link is read again the tick the work starts"
        );
    }
    // GPU 0: its first two ticks (the second is the first it may hold),
    // 31; the work from 40 to 69; 70 (the tick after work is not held)
    // and 71; 101. GPU 1: 0, 1, 31, 61, 91.
    let mut expected: Vec<i64> = [0, 1, 31]
        .into_iter()
        .chain(40..=71)
        .chain([101])
        .chain([0, 1, 31, 61, 91])
        .collect();
    expected.sort();
    assert_eq!(gpm_reads_at, expected);
}

/// A GPU under load whose link read found it at its maximum holds that
/// read while the load lasts, for `loaded_link_interval_secs`; a link below
/// its maximum under load is read every tick, and a tick off load reads it.
#[test]
fn a_loaded_link_is_held_while_at_its_maximum() {
    use sim::Scenario::{Idle, PcieDegraded, Training};
    // Training; the link trains down to Gen3 x8 under load at 47 s and back
    // at 75 s; idle from 85 s; training again from 95 s.
    let turns = |s: sim::SimBackend| {
        s.turning(0, 47.0, PcieDegraded)
            .turning(0, 75.0, Training)
            .turning(0, 85.0, Idle)
            .turning(0, 95.0, Training)
    };
    let (mut held, counts) = simulated_counting(&["training"], |_| {}, turns);
    let every_tick = |c: &mut GpuConfig| {
        c.slow_reads_interval_secs = 0.0;
        c.loaded_link_interval_secs = 0.0;
    };
    let (mut every, every_counts) = simulated_counting(&["training"], every_tick, turns);
    let link = |b: &[Batch]| {
        (
            value(b, &GPU, &["0"], "pcie_link_gen"),
            value(b, &GPU, &["0"], "pcie_link_width"),
        )
    };
    let mut reads_at = Vec::new();
    for second in 0..=110i64 {
        let before = reads_of(&counts, "current_pcie_link_gen");
        let ours = held.collect(second * 1_000_000).unwrap();
        let truth = every.collect(second * 1_000_000).unwrap();
        if reads_of(&counts, "current_pcie_link_gen") > before {
            reads_at.push(second);
        }
        let degraded_reported = held
            .problems()
            .iter()
            .any(|p| p.contains("PCIe link at Gen3 x8 under load"));
        if (47..50).contains(&second) {
            // Held from the read at 45 s: the downtrain shows at the next
            // read, less than `loaded_link_interval_secs` late.
            assert_eq!(link(&ours), (Some(5.0), Some(16.0)), "at {second} s");
            assert_eq!(link(&truth), (Some(3.0), Some(8.0)), "at {second} s");
            assert!(!degraded_reported, "at {second} s");
        } else {
            assert_eq!(link(&ours), link(&truth), "at {second} s");
            assert_eq!(degraded_reported, (50..75).contains(&second), "at {second} s");
        }
    }
    // Every 5 s at the maximum, held in between; 50-74 below it, each
    // tick; 75 back at the maximum, 80; 85 and 86 off load (86 is the
    // quiet tick that the quiet ticks after it hold); under load again
    // from 95.
    let expected: Vec<i64> = (0..=45)
        .step_by(5)
        .chain(50..=75)
        .chain([80, 85, 86, 95, 100, 105, 110])
        .collect();
    assert_eq!(reads_at, expected);
    assert_eq!(reads_of(&every_counts, "current_pcie_link_gen"), 111);
    assert_eq!(
        reads_of(&counts, "current_pcie_link_width"),
        expected.len() as u64,
        "the width with the generation"
    );
}

#[test]
fn a_change_shows_at_the_next_slow_read() {
    // MIG turned on at 40 s on GPU 0.
    let (mut gpu, counts) = simulated_counting(
        &["training", "pcie-degraded"],
        |_| {},
        |s| s.turning(0, 40.0, sim::Scenario::Mig),
    );
    for second in 0..=65i64 {
        let b = gpu.collect(second * 1_000_000).unwrap();
        let mig = info_tag(&b, "0", "mig");
        let instances = table(&b, &MIG).map_or(0, Batch::len);
        if second < 60 {
            assert_eq!(mig, "off", "at {second} s");
            assert_eq!(instances, 0, "at {second} s");
        } else {
            assert_eq!(mig, "on", "at {second} s");
            assert_eq!(instances, 3, "at {second} s");
        }
        // The replay counter grows 3 a second; it shows 3 × the last
        // slow read's second.
        let read = second / 30 * 30;
        assert_eq!(
            value(&b, &GPU, &["1"], "pcie_replays"),
            Some((read * 3) as f64),
            "at {second} s"
        );
    }
    assert_eq!(reads_of(&counts, "mig_mode"), 3 * 2);
    assert!(reads_of(&counts, "mig instances") > 0);
}

#[test]
fn a_gpu_that_answers_again_is_read_in_full() {
    // GPU 0 falls off the bus from 10 s to 20 s.
    let (mut gpu, counts) = simulated_counting(
        &["training"],
        |_| {},
        |s| {
            s.turning(0, 10.0, sim::Scenario::Lost)
                .turning(0, 20.0, sim::Scenario::Training)
        },
    );
    for second in 0..20 {
        gpu.collect(second * 1_000_000).unwrap();
    }
    assert_eq!(reads_of(&counts, "mig_mode"), 1, "the first tick only");
    let exact_before = reads_of(&counts, "total_energy_consumption");
    let b = gpu.collect(20_000_000).unwrap();
    assert_eq!(value(&b, &HEALTH, &["0"], "up"), Some(1.0));
    assert_eq!(
        reads_of(&counts, "mig_mode"),
        2,
        "read again when it answers"
    );
    assert_eq!(
        reads_of(&counts, "total_energy_consumption"),
        exact_before + 1
    );
    assert_eq!(
        value(&b, &GPU, &["0"], "energy_exact_age_seconds"),
        Some(0.0)
    );
    // GPM's previous sample is from before the silence: no figures from
    // an average over it, and this tick's own from the next.
    assert_eq!(value(&b, &GPU, &["0"], "sm_active_ratio"), None);
    assert!(value(&b, &GPU, &["0"], "power_watts").is_some());
    let next = gpu.collect(21_000_000).unwrap();
    assert!(value(&next, &GPU, &["0"], "sm_active_ratio").is_some());
    // And then on its cadence from there: 50 s, not 30 s.
    for second in 22..50 {
        gpu.collect(second * 1_000_000).unwrap();
    }
    assert_eq!(reads_of(&counts, "mig_mode"), 2);
    gpu.collect(50_000_000).unwrap();
    assert_eq!(reads_of(&counts, "mig_mode"), 3);
}

/// A reload hands the values of the last slow read to the new collector:
/// it neither reads them again at once nor exports them null or reset.
#[test]
fn slow_values_carry_over_a_reload() {
    let (mut old, counts) = simulated_counting(&["pcie-degraded", "mig"], |_| {}, |s| s);
    for second in 0..=40 {
        old.collect(second * 1_000_000).unwrap();
    }
    assert_eq!(reads_of(&counts, "pcie_replay_counter"), 2 * 2);
    let config = GpuConfig {
        processes: false,
        ..old.config.clone()
    };
    let mut new = Gpu::new(&config, &Roots::default());
    new.take_over(Box::new(old));
    assert!(matches!(new.probe(), Availability::Available(_)));
    let b = new.collect(41_000_000).unwrap();
    assert_eq!(reads_of(&counts, "pcie_replay_counter"), 2 * 2);
    assert_eq!(value(&b, &GPU, &["0"], "pcie_replays"), Some(90.0));
    assert_eq!(value(&b, &GPU, &["0"], "power_limit_watts"), Some(700.0));
    assert_eq!(info_tag(&b, "1", "mig"), "on");
    assert_eq!(table(&b, &MIG).map(Batch::len), Some(3));
    let b = new.collect(60_000_000).unwrap();
    assert_eq!(reads_of(&counts, "pcie_replay_counter"), 3 * 2);
    assert_eq!(value(&b, &GPU, &["0"], "pcie_replays"), Some(180.0));
}

/// A reload hands a quiet GPU's held GPM figures and link to the new
/// collector, which goes on skipping those reads until they are due.
#[test]
fn quiet_reads_carry_over_a_reload() {
    let gpm_read = "gpm_sample, gpm_metrics_get";
    let (mut old, counts) = simulated_counting(&["idle"], |_| {}, |s| s);
    for second in 0..=10 {
        old.collect(second * 1_000_000).unwrap();
    }
    assert_eq!(reads_of(&counts, gpm_read), 2, "the first two ticks");
    let mut new = Gpu::new(&old.config.clone(), &Roots::default());
    new.take_over(Box::new(old));
    assert!(matches!(new.probe(), Availability::Available(_)));
    let b = new.collect(11_000_000).unwrap();
    assert_eq!(reads_of(&counts, gpm_read), 2);
    assert_eq!(value(&b, &GPU, &["0"], "sm_active_ratio"), Some(0.0));
    assert_eq!(value(&b, &GPU, &["0"], "pcie_link_gen"), Some(1.0));
    for second in 12..=31 {
        new.collect(second * 1_000_000).unwrap();
    }
    assert_eq!(reads_of(&counts, gpm_read), 3, "due 30 s after the second tick");
}

#[test]
fn counters_are_monotonic_across_ticks() {
    let mut gpu = simulated(&["xid"]);
    let a = gpu.collect(0).unwrap();
    let b = gpu.collect(61_000_000).unwrap();
    for field in ["energy_joules", "ecc_corrected_errors"] {
        assert!(
            value(&b, &GPU, &["0"], field) > value(&a, &GPU, &["0"], field),
            "{field}"
        );
    }
    let uuid = gpu.gpus[0].uuid.clone();
    assert_eq!(value(&b, &XID, &["0", &uuid, "31"], "errors"), Some(1.0));
    assert_eq!(value(&b, &XID, &["0", &uuid, "13"], "errors"), Some(1.0));
    assert_eq!(value(&b, &HEALTH, &["0"], "last_xid"), Some(13.0));
}

#[test]
fn mig_instances_are_rows_of_their_own() {
    let mut gpu = simulated(&["mig"]);
    let b = gpu.collect(0).unwrap();
    let mig = table(&b, &MIG).unwrap();
    assert_eq!(mig.len(), 3);
    assert_eq!(mig.tags[4].dict, vec!["3g.40gb", "2g.20gb", "1g.10gb"]);
    let processes = table(&b, &PROCESS).unwrap();
    assert_eq!(processes.len(), 3, "one process per instance");
}

#[test]
fn without_a_driver_the_collector_is_off_with_the_reason() {
    let mut gpu = Gpu::new(&GpuConfig::default(), &Roots::default());
    // CI has no driver; on a GPU machine the same probe must find NVML.
    match (nvml::load(), gpu.probe()) {
        (Err(_), Availability::Absent(reason)) => {
            assert!(reason.contains("libnvidia-ml"), "{reason}")
        }
        (Ok(_), Availability::Available(found)) => assert!(found.contains("nvml"), "{found}"),
        (Ok(_), Availability::Absent(reason)) => {
            assert!(reason.contains("sees no GPU"), "{reason}")
        }
        (Err(e), Availability::Available(found)) => panic!("found {found} without NVML: {e}"),
        (_, Availability::Failed(reason)) => panic!("a driver read failed: {reason}"),
    }
}

#[test]
fn gpm_is_charged_for_the_links_up_only() {
    // As the NVML backend asks GPM for the rates of the links up: 18 on a
    // training GPU, none where a hypervisor hides NVLink.
    let (mut gpu, counts) = simulated_counting(&["training", "nvlink-hidden"], |_| {}, |s| s);
    for second in 0..5i64 {
        gpu.collect(second * 1_000_000).unwrap();
    }
    assert_eq!(reads_of(&counts, "gpm_sample, gpm_metrics_get"), 5 * 2);
    assert_eq!(reads_of(&counts, costs::GPM_LINK_PAIR), 5 * 18);
}

/// Only a read the counter takes starts a quiet spell: one it throws out
/// (not a number, or below zero) leaves the GPU on work's cadence.
#[test]
fn a_reading_the_counter_throws_out_starts_no_quiet_spell() {
    let sample = |energy: f64| GpuSample {
        quiet: true,
        power_watts: Some(72.0),
        energy_joules: Some(energy),
        ..GpuSample::default()
    };
    let mut state = GpuState::default();
    state.settle_energy(&sample(1000.0), 0);
    assert!(state.quiet_since_exact_energy, "a quiet exact read");
    state.quiet_since_exact_energy = false;
    for (n, bad) in [f64::NAN, -5.0].into_iter().enumerate() {
        state.settle_energy(&sample(bad), (n as i64 + 1) * 1_000_000);
        assert!(!state.quiet_since_exact_energy, "{bad} J is not a read");
    }
}
