//! Tests of the module.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::*;
use crate::testutil::{f64s, tags, u64s};

/// What the scripted counters answer, shared with the test.
#[derive(Default)]
struct Script {
    readings: HashMap<(String, usize, HwEvent), Reading>,
    /// Every open of this event fails with this errno.
    refuse: HashMap<HwEvent, i32>,
    /// Reads of this cgroup's counters fail.
    unreadable: HashSet<String>,
    /// Counters open now.
    open: usize,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Script>>);

impl Fake {
    fn set(
        &self,
        path: &str,
        cpu: usize,
        event: HwEvent,
        count: u64,
        enabled: u64,
        running: u64,
    ) {
        self.0.lock().unwrap().readings.insert(
            (path.into(), cpu, event),
            Reading {
                count,
                enabled_ns: enabled,
                running_ns: running,
            },
        );
    }

    fn open(&self) -> usize {
        self.0.lock().unwrap().open
    }
}

struct FakeCounter {
    key: (String, usize, HwEvent),
    script: Arc<Mutex<Script>>,
}

impl EventCounter for FakeCounter {
    fn read(&mut self) -> io::Result<Reading> {
        let script = self.script.lock().unwrap();
        if script.unreadable.contains(&self.key.0) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(script.readings.get(&self.key).copied().unwrap_or_default())
    }
}

impl Drop for FakeCounter {
    fn drop(&mut self) {
        self.script.lock().unwrap().open -= 1;
    }
}

impl CounterSource for Fake {
    fn open(
        &mut self,
        path: &str,
        _dir: &File,
        cpu: usize,
        event: HwEvent,
    ) -> io::Result<Box<dyn EventCounter>> {
        let mut script = self.0.lock().unwrap();
        if let Some(&errno) = script.refuse.get(&event) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        script.open += 1;
        Ok(Box::new(FakeCounter {
            key: (path.into(), cpu, event),
            script: self.0.clone(),
        }))
    }
}

/// A cgroup v2 tree on two CPUs with `/system.slice/{a,b}.service` and
/// `/user.slice`, and perf_event_paranoid 2.
fn tree() -> (tempfile::TempDir, Roots) {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = dir.path().join("sys/fs/cgroup");
    for d in [
        "system.slice/a.service",
        "system.slice/b.service",
        "user.slice",
    ] {
        std::fs::create_dir_all(cgroup.join(d)).unwrap();
    }
    std::fs::write(cgroup.join("cgroup.controllers"), "cpu memory\n").unwrap();
    let cpu = dir.path().join("sys/devices/system/cpu");
    std::fs::create_dir_all(&cpu).unwrap();
    std::fs::write(cpu.join("online"), "0-1\n").unwrap();
    let kernel = dir.path().join("proc/sys/kernel");
    std::fs::create_dir_all(&kernel).unwrap();
    std::fs::write(kernel.join("perf_event_paranoid"), "2\n").unwrap();
    let roots = Roots {
        procfs: dir.path().join("proc"),
        sysfs: dir.path().join("sys"),
        ..Roots::default()
    };
    (dir, roots)
}

fn collector(roots: &Roots, config: &PerfConfig, cgroups: &CgroupsConfig, fake: &Fake) -> Perf {
    let mut perf = Perf::with_source(config, cgroups, roots, Box::new(fake.clone()));
    perf.require_cgroupfs = false; // a temporary directory stands in for cgroupfs
    perf
}

/// A collector with the default settings over `roots`, probed, and what
/// the probe found.
fn probed(roots: &Roots, fake: &Fake) -> (Perf, String) {
    let mut perf = collector(
        roots,
        &PerfConfig::default(),
        &CgroupsConfig::default(),
        fake,
    );
    match perf.probe() {
        Availability::Available(summary) => (perf, summary),
        Availability::Absent(reason) | Availability::Failed(reason) => {
            panic!("absent with a working PMU: {reason}")
        }
    }
}

fn collect_one(perf: &mut Perf, time_us: i64) -> Batch {
    let mut batches = perf.collect(time_us).unwrap();
    assert_eq!(batches.len(), 1);
    batches.pop().unwrap()
}

fn row_of(batch: &Batch, path: &str) -> usize {
    let paths = tags(batch, "path");
    paths
        .iter()
        .position(|p| p == path)
        .unwrap_or_else(|| panic!("no row for {path}: {paths:?}"))
}

fn count(batch: &Batch, path: &str, field: &str) -> Option<u64> {
    u64s(batch, field)[row_of(batch, path)]
}

const A: &str = "/system.slice/a.service";
const B: &str = "/system.slice/b.service";
const USER: &str = "/user.slice";

#[test]
fn the_table_follows_the_naming_rules() {
    CGROUP_PERF.validate().unwrap();
    let names: Vec<&str> = CGROUP_PERF.fields.iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        [
            "cycles",
            "instructions",
            "llc_misses",
            "counter_running_ratio"
        ]
    );
    assert_eq!(
        CGROUP_PERF.metric_name(&CGROUP_PERF.fields[0]),
        "vtax_cgroup_perf_cycles_total"
    );
}

/// A reload that changes the perf settings rebuilds the collector: the
/// new one opens its counters afresh and carries on each cgroup's totals.
#[test]
fn a_rebuilt_collector_carries_on_the_totals() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    let (mut old, _) = probed(&roots, &fake);
    collect_one(&mut old, 0);
    fake.set(A, 0, HwEvent::Cycles, 1000, 100, 100);
    let before = collect_one(&mut old, 1_000_000);
    assert_eq!(count(&before, A, "cycles"), Some(1000));
    let mut new = collector(
        &roots,
        &PerfConfig {
            max_counters: 4096,
            ..PerfConfig::default()
        },
        &CgroupsConfig::default(),
        &fake,
    );
    new.take_over(Box::new(old));
    assert!(matches!(new.probe(), Availability::Available(_)));
    // The fake's counters read their script's value since they opened:
    // the new ones count 1000 on top of the 1000 carried, not from 0.
    let after = collect_one(&mut new, 2_000_000);
    assert_eq!(count(&after, A, "cycles"), Some(2000));
    fake.set(A, 0, HwEvent::Cycles, 1500, 200, 200);
    let later = collect_one(&mut new, 3_000_000);
    assert_eq!(count(&later, A, "cycles"), Some(2500));
}

#[test]
fn leaf_cgroups_sum_their_cpus_and_scale_for_multiplexing() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    let (mut perf, summary) = probed(&roots, &fake);
    assert!(
        summary
            .ends_with("3 leaf cgroups x 2 CPUs x 3 events = 18 counters (max_counters 8192)"),
        "{summary}"
    );
    assert_eq!(fake.open(), 0, "the probe's own counters are closed");
    let first = collect_one(&mut perf, 0);
    assert_eq!(
        tags(&first, "path"),
        [A, B, USER],
        "leaves only, in path order"
    );
    assert_eq!(tags(&first, "workload"), ["service", "service", "slice"]);
    assert_eq!(fake.open(), 18);
    assert_eq!(count(&first, A, "cycles"), Some(0));
    assert_eq!(f64s(&first, "counter_running_ratio"), [None, None, None]);

    // CPU 0 counted all the time; CPU 1 had the PMU half of it.
    fake.set(A, 0, HwEvent::Cycles, 1000, 100, 100);
    fake.set(A, 1, HwEvent::Cycles, 500, 100, 50);
    fake.set(A, 0, HwEvent::Instructions, 2000, 100, 100);
    fake.set(A, 0, HwEvent::LlcMisses, 7, 100, 100);
    let second = collect_one(&mut perf, 1_000_000);
    assert_eq!(count(&second, A, "cycles"), Some(2000));
    assert_eq!(count(&second, A, "instructions"), Some(2000));
    assert_eq!(count(&second, A, "llc_misses"), Some(7));
    let ratio = f64s(&second, "counter_running_ratio")[row_of(&second, A)].unwrap();
    assert!((ratio - 350.0 / 400.0).abs() < 1e-12, "{ratio}");
    assert_eq!(count(&second, B, "cycles"), Some(0));

    // The next increase is scaled by its own times: 300 counted in 50 of 100 ns.
    fake.set(A, 1, HwEvent::Cycles, 800, 200, 100);
    let third = collect_one(&mut perf, 2_000_000);
    assert_eq!(count(&third, A, "cycles"), Some(2600));
    assert_eq!(count(&third, A, "instructions"), Some(2000));
    assert!(perf.problems().is_empty(), "{:?}", perf.problems());
}

#[test]
fn a_refused_pmu_disables_the_collector_with_the_errno_and_the_remedy() {
    let cases: [(i32, &[&str]); 5] = [
        (
            libc::ENOENT,
            &["CPU cycles", "ENOENT", "no hardware PMU", "pmu=on"],
        ),
        (libc::EOPNOTSUPP, &["EOPNOTSUPP", "no hardware PMU"]),
        (
            libc::EACCES,
            &[
                "EACCES",
                "CAP_PERFMON",
                "kernel.perf_event_paranoid",
                "(it is 2)",
            ],
        ),
        (libc::EPERM, &["EPERM", "CAP_PERFMON", "seccomp"]),
        (libc::ENOSYS, &["ENOSYS", "CONFIG_PERF_EVENTS"]),
    ];
    for (errno, words) in cases {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        fake.0.lock().unwrap().refuse.insert(HwEvent::Cycles, errno);
        let mut perf = collector(
            &roots,
            &PerfConfig::default(),
            &CgroupsConfig::default(),
            &fake,
        );
        let Availability::Absent(reason) = perf.probe() else {
            panic!("available although cycles fail with {errno}");
        };
        for word in words {
            assert!(reason.contains(word), "{word:?} not in {reason:?}");
        }
        assert_eq!(fake.open(), 0);
        assert!(
            perf.collect(0).is_err(),
            "an unprobed collector reads nothing"
        );
    }
}

#[test]
fn without_an_llc_event_the_rest_is_counted_and_llc_misses_are_null() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    fake.0
        .lock()
        .unwrap()
        .refuse
        .insert(HwEvent::LlcMisses, libc::ENOENT);
    let (mut perf, summary) = probed(&roots, &fake);
    assert!(
        summary.contains("x 2 events = 12 counters")
            && summary.ends_with("last-level cache misses not counted"),
        "{summary}"
    );
    fake.set(A, 0, HwEvent::Instructions, 10, 1, 1);
    let batch = collect_one(&mut perf, 0);
    assert_eq!(count(&batch, A, "llc_misses"), None);
    assert_eq!(count(&batch, A, "instructions"), Some(10));
    assert_eq!(fake.open(), 12);
    let problems = perf.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("last-level cache misses are not counted: perf_event_open for last-level cache misses failed with ENOENT"), "{problems:?}");
}

#[test]
fn cgroups_that_come_go_or_are_made_again_are_followed() {
    let (_dir, roots) = tree();
    let cgroup = roots.sys("fs/cgroup");
    let fake = Fake::default();
    let cgroups = CgroupsConfig {
        rescan_interval_secs: 10.0,
        ..CgroupsConfig::default()
    };
    let mut perf = collector(&roots, &PerfConfig::default(), &cgroups, &fake);
    assert!(matches!(perf.probe(), Availability::Available(_)));
    assert_eq!(collect_one(&mut perf, 0).len(), 3);

    // A new cgroup waits for the rescan; a new child makes its parent no leaf.
    std::fs::create_dir_all(cgroup.join("user.slice/session-1.scope")).unwrap();
    assert_eq!(collect_one(&mut perf, 5_000_000).len(), 3);
    let rescanned = collect_one(&mut perf, 10_000_000);
    assert_eq!(
        tags(&rescanned, "path"),
        [A, B, "/user.slice/session-1.scope"]
    );
    assert_eq!(fake.open(), 18, "the parent's counters were closed");

    // A cgroup removed between ticks loses its row and its counters at once.
    fake.set(A, 0, HwEvent::Cycles, 40, 1, 1);
    assert_eq!(
        count(&collect_one(&mut perf, 11_000_000), A, "cycles"),
        Some(40)
    );
    std::fs::remove_dir(cgroup.join("system.slice/b.service")).unwrap();
    let after = collect_one(&mut perf, 12_000_000);
    assert_eq!(tags(&after, "path"), [A, "/user.slice/session-1.scope"]);
    assert_eq!(fake.open(), 12);
    collect_one(&mut perf, 12_500_000); // the walk the vanished cgroup asked for

    // a.service made again at its path (a restarted unit): its old counters
    // watch a cgroup that is gone, so they are dropped and opened afresh.
    let fresh = cgroup.join("system.slice/a.service.new");
    std::fs::create_dir(&fresh).unwrap();
    std::fs::remove_dir(cgroup.join("system.slice/a.service")).unwrap();
    std::fs::rename(&fresh, cgroup.join("system.slice/a.service")).unwrap();
    let gap = collect_one(&mut perf, 13_000_000);
    assert_eq!(tags(&gap, "path"), ["/user.slice/session-1.scope"]);
    let again = collect_one(&mut perf, 14_000_000);
    assert_eq!(tags(&again, "path"), [A, "/user.slice/session-1.scope"]);
    // The script still answers 40 for a.service's CPU 0: the new counter
    // counts from its own start, which the totals take as a fresh series.
    assert_eq!(count(&again, A, "cycles"), Some(40));
    assert_eq!(fake.open(), 12);
}

#[test]
fn cpus_coming_online_reopen_the_counters_and_the_totals_go_on() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    let (mut perf, _) = probed(&roots, &fake);
    fake.set(A, 1, HwEvent::Cycles, 500, 10, 10);
    assert_eq!(count(&collect_one(&mut perf, 0), A, "cycles"), Some(500));
    std::fs::write(roots.sys("devices/system/cpu/online"), "0-2\n").unwrap();
    // At the rescan: three CPUs' counters, the old ones closed; the new
    // counter on CPU 1 starts from nothing, its script still says 500.
    let batch = collect_one(&mut perf, 10_000_000);
    assert_eq!(fake.open(), 27);
    assert_eq!(count(&batch, A, "cycles"), Some(1000));
    fake.set(A, 2, HwEvent::Cycles, 70, 10, 10);
    let batch = collect_one(&mut perf, 11_000_000);
    assert_eq!(count(&batch, A, "cycles"), Some(1070));
}

#[test]
fn max_counters_bounds_the_open_counters_and_says_so() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    let config = PerfConfig {
        max_counters: 12,
        ..PerfConfig::default()
    };
    let mut perf = collector(&roots, &config, &CgroupsConfig::default(), &fake);
    let Availability::Available(summary) = perf.probe() else {
        panic!("absent");
    };
    assert!(
        summary.contains("2 leaf cgroups x 2 CPUs x 3 events = 12 counters"),
        "{summary}"
    );
    let batch = collect_one(&mut perf, 0);
    // Shallowest first, as the cgroups collector bounds its own.
    assert_eq!(tags(&batch, "path"), [A, USER]);
    assert_eq!(fake.open(), 12);
    assert_eq!(
        perf.problems(),
        ["1 leaf cgroups over collectors.perf.max_counters = 12 (6 counters each: 3 events x 2 CPUs) are not counted: raise it, or narrow [collectors.cgroups] include/exclude"]
    );
    assert_eq!(perf.left_out(), 1, "vtax_collector_left_out");
}

#[test]
fn impossible_readings_are_skipped_and_reported() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    let (mut perf, _) = probed(&roots, &fake);
    fake.set(A, 0, HwEvent::Cycles, 1000, 100, 100);
    collect_one(&mut perf, 0);
    // Backwards, then running longer than enabled: neither moves the total.
    fake.set(A, 0, HwEvent::Cycles, 400, 150, 150);
    assert_eq!(
        count(&collect_one(&mut perf, 1_000_000), A, "cycles"),
        Some(1000)
    );
    fake.set(A, 0, HwEvent::Cycles, 900, 200, 300);
    assert_eq!(
        count(&collect_one(&mut perf, 2_000_000), A, "cycles"),
        Some(1000)
    );
    // Sound again: counted from the last sound reading (400, 150, 150) on.
    fake.set(A, 0, HwEvent::Cycles, 1100, 250, 250);
    assert_eq!(
        count(&collect_one(&mut perf, 3_000_000), A, "cycles"),
        Some(1700)
    );
    let problems = perf.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("2 counter readings were impossible and skipped"),
        "{problems:?}"
    );
    assert!(
        problems[0].contains("CPU cycles on CPU 0 went backwards"),
        "{problems:?}"
    );
    assert!(
        problems[0].contains("ran 300 ns of 200 ns enabled"),
        "{problems:?}"
    );
}

#[test]
fn a_counter_that_cannot_be_read_is_opened_again() {
    let (_dir, roots) = tree();
    let fake = Fake::default();
    let (mut perf, _) = probed(&roots, &fake);
    collect_one(&mut perf, 0);
    fake.0.lock().unwrap().unreadable.insert(B.into());
    let batch = collect_one(&mut perf, 1_000_000);
    assert_eq!(tags(&batch, "path"), [A, USER]);
    assert_eq!(fake.open(), 12, "b.service's counters were closed");
    assert!(perf.problems()[0].contains("reading CPU cycles on CPU 0 failed"));
    fake.0.lock().unwrap().unreadable.clear();
    let batch = collect_one(&mut perf, 2_000_000);
    assert_eq!(tags(&batch, "path"), [A, B, USER]);
    assert_eq!(fake.open(), 18);
}

#[test]
fn cpu_lists_read_like_the_kernels() {
    assert_eq!(parse_cpu_list("0-3,8\n").unwrap(), [0, 1, 2, 3, 8]);
    assert_eq!(parse_cpu_list("5").unwrap(), [5]);
    for bad in ["", "\n", "a", "3-1", "0-", "1,x"] {
        assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_hierarchy_is_v2_the_v1_perf_event_mount_or_unified() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    assert!(perf_hierarchy(&root.join("none"))
        .unwrap_err()
        .contains("no cgroup filesystem"));
    std::fs::create_dir_all(root.join("memory")).unwrap();
    assert!(perf_hierarchy(root)
        .unwrap_err()
        .contains("nor a v1 perf_event mount"));
    std::fs::create_dir_all(root.join("unified")).unwrap();
    std::fs::write(root.join("unified/cgroup.controllers"), "").unwrap();
    assert_eq!(perf_hierarchy(root).unwrap().0, root.join("unified"));
    std::fs::create_dir_all(root.join("net_cls,perf_event")).unwrap();
    assert_eq!(
        perf_hierarchy(root).unwrap().0,
        root.join("net_cls,perf_event")
    );
    std::fs::write(root.join("cgroup.controllers"), "cpu\n").unwrap();
    assert_eq!(perf_hierarchy(root).unwrap().0, root);
}

#[test]
fn max_counters_below_one_cgroups_worth_is_refused() {
    let bad = PerfConfig {
        max_counters: 2,
        ..PerfConfig::default()
    };
    let (key, message) = bad.validate().unwrap_err();
    assert_eq!(key, "collectors.perf.max_counters");
    assert!(
        message.starts_with("collectors.perf.max_counters = 2"),
        "{message}"
    );
    assert!(PerfConfig::default().validate().is_ok());
}

/// Whether sysfs lists a core PMU (x86 `cpu`, hybrid `cpu_core`, Arm `armv8_*`).
fn core_pmu_listed() -> bool {
    std::fs::read_dir("/sys/bus/event_source/devices").is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name == "cpu" || name.starts_with("cpu_") || name.starts_with("armv")
        })
    })
}

/// The real `perf_event_open` on this machine: counters, or the clean
/// reason. Without a core PMU (this project's VM) it must be the reason.
#[test]
fn the_real_opener_counts_or_says_why() {
    let mut perf = Perf::new(
        &PerfConfig::default(),
        &CgroupsConfig::default(),
        &Roots::default(),
    );
    match perf.probe() {
        Availability::Available(summary) => {
            assert!(
                core_pmu_listed(),
                "counting without a PMU in sysfs: {summary}"
            );
            let batches = perf.collect(crate::ticks::now_us()).unwrap();
            assert!(batches.iter().all(|b| std::ptr::eq(b.table, &CGROUP_PERF)));
        }
        Availability::Absent(reason) => {
            eprintln!("perf on this machine: {reason}");
            let clean = [
                "failed with ENOENT",
                "failed with EOPNOTSUPP",
                "failed with ENODEV",
                "refused with EACCES",
                "refused with EPERM",
                "no cgroup",
                "is not a cgroup filesystem",
            ];
            assert!(clean.iter().any(|c| reason.contains(c)), "{reason}");
            if !core_pmu_listed() && reason.starts_with("perf_event_open") {
                assert!(
                    ["ENOENT", "EOPNOTSUPP", "ENODEV", "EACCES", "EPERM"]
                        .iter()
                        .any(|e| reason.contains(e)),
                    "{reason}"
                );
            }
        }
        Availability::Failed(reason) => panic!("perf never reports a failed source: {reason}"),
    }
}

/// The real opener's plumbing (cgroup directory, one counter per CPU,
/// enable, the three-word read) with a software event, which needs no
/// PMU: the hierarchy's root cgroup holds this test, so its busy loop counts.
#[test]
fn a_software_event_on_the_root_cgroup_counts_this_process() {
    let roots = Roots::default();
    let Ok((hierarchy, _)) = perf_hierarchy(&roots.sys("fs/cgroup")) else {
        panic!("no cgroup hierarchy on this machine to count in");
    };
    let dir = File::open(&hierarchy).unwrap();
    let cpus = parse_cpu_list(
        &std::fs::read_to_string(roots.sys("devices/system/cpu/online")).unwrap(),
    )
    .unwrap();
    let mut counters = Vec::new();
    for &cpu in &cpus {
        match PerfEventSource::open_event(&dir, cpu, perf_event::events::Software::CPU_CLOCK) {
            Ok(c) => counters.push(c),
            Err(e) => {
                // Not privileged: the refusal must be the one the probe explains.
                let errno = e.raw_os_error();
                assert!(matches!(errno, Some(libc::EACCES | libc::EPERM)), "{e}");
                return;
            }
        }
    }
    let start = std::time::Instant::now();
    let mut x = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(50) {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    let mut ns = 0;
    for counter in &mut counters {
        let r = counter.read().unwrap();
        assert!(r.running_ns <= r.enabled_ns, "{r:?}");
        ns += r.count;
    }
    assert!(
        ns >= 40_000_000,
        "the root cgroup ran {ns} ns of CPU clock in 50 ms of spinning"
    );
}
