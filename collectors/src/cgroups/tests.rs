//! Tests of the module.

use super::*;
use crate::testutil::copy_tree;
use vtax_store::batch::Values;
use vtax_store::Value;

fn fixture(node: &str) -> Roots {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(node);
    Roots {
        procfs: base.join("proc"),
        sysfs: base.join("sys"),
        ..Roots::default()
    }
}

fn collector(config: &CgroupsConfig, roots: &Roots) -> Cgroups {
    let mut c = Cgroups::new(config, roots);
    c.hz = 100.0; // USER_HZ on every Linux; fixed so the test does not ask the host
    c
}

fn collect_one(c: &mut Cgroups, time_us: i64) -> Batch {
    let mut batches = c.collect(time_us).unwrap();
    assert_eq!(batches.len(), 1);
    batches.pop().unwrap()
}

fn paths(batch: &Batch) -> Vec<&str> {
    batch.tags[0]
        .codes
        .iter()
        .map(|&c| batch.tags[0].dict[c as usize].as_str())
        .collect()
}

fn row(batch: &Batch, path: &str) -> usize {
    paths(batch)
        .iter()
        .position(|p| *p == path)
        .unwrap_or_else(|| panic!("no row for {path}: {:?}", paths(batch)))
}

fn workload<'a>(batch: &'a Batch, path: &str) -> &'a str {
    let code = batch.tags[1].codes[row(batch, path)];
    &batch.tags[1].dict[code as usize]
}

fn value(batch: &Batch, path: &str, name: &str) -> Value {
    let i = row(batch, path);
    let column = &batch.fields[CGROUP.field_index(name).expect(name)];
    if !column.is_valid(i) {
        return Value::Null;
    }
    match &column.values {
        Values::F64(v) => Value::F64(v[i]),
        Values::I64(v) => Value::I64(v[i]),
        Values::U64(v) => Value::U64(v[i]),
    }
}

fn close(v: Value, want: f64) -> bool {
    matches!(v, Value::F64(x) if (x - want).abs() < 1e-9)
}

const POD: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c9a3d2e_5b1f_4c8e_9a6d_2f1e0b3c4d5a.slice";
const CRI: &str =
    "cri-containerd-8cf99c0bd8a71b2f1b068d6d096278cf4162dbf52d4986c27018e794a8d7befa.scope";
const DOCKER: &str = "/docker/3df9abf61f01116639c75d725819956b13a05e6b04e94e47886de71811ab243a";
const JOB_V2: &str = "/system.slice/slurmstepd.scope/job_77";
const JOB_V1: &str = "/slurm/uid_1000/job_4242";

/// The fields a file fills, by name, from its declaration.
fn filled_by(source: Source) -> Vec<&'static str> {
    source
        .fills()
        .iter()
        .map(|(key, fill)| {
            let mut row = CgroupRow::default();
            fill.set(&mut row, 1, 100.0);
            let names = set_fields(&row);
            assert_eq!(names.len(), 1, "{source:?} {key:?}: {names:?}");
            names[0]
        })
        .collect()
}

/// The fields of `row` that are not null, by name.
fn set_fields(row: &CgroupRow) -> Vec<&'static str> {
    let mut rows = BatchBuilder::new(&CGROUP);
    rows.push_row(0, row).unwrap();
    let batch = rows.finish();
    CGROUP
        .fields
        .iter()
        .zip(&batch.fields)
        .filter(|(_, column)| column.is_valid(0))
        .map(|(field, _)| field.name)
        .collect()
}

const ALL_SOURCES: [Source; 21] = [
    Source::CpuStatV2,
    Source::CpuMax,
    Source::MemoryCurrent,
    Source::MemoryMax,
    Source::MemoryStatV2,
    Source::MemoryEvents,
    Source::SwapCurrent,
    Source::CpuPressure,
    Source::MemoryPressure,
    Source::IoPressure,
    Source::CpuStatV1,
    Source::CfsQuota,
    Source::CfsPeriod,
    Source::CpuacctUsage,
    Source::CpuacctStat,
    Source::MemoryUsage,
    Source::MemoryLimit,
    Source::MemoryStatV1,
    Source::OomControl,
    Source::KmemUsage,
    Source::IoStat,
];

#[test]
fn each_key_fills_a_field_and_every_field_has_a_file() {
    CGROUP.validate().unwrap();
    assert!(CGROUP.name.starts_with("cgroup"));
    let mut filled = BTreeSet::new();
    for source in ALL_SOURCES {
        let names = filled_by(source);
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "{source:?} fills {names:?}");
        let keys: BTreeSet<&str> = source.fills().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), names.len(), "{source:?}: a key twice");
        filled.extend(names);
    }
    let all: BTreeSet<&str> = CGROUP.fields.iter().map(|f| f.name).collect();
    assert_eq!(filled, all);
    // Each layout has its own file for a field, never two of one layout.
    let v1: Vec<&str> = [
        CPU_SOURCES,
        CPUACCT_SOURCES,
        MEMORY_SOURCES,
        PRESSURE_SOURCES,
    ]
    .concat()
    .into_iter()
    .flat_map(filled_by)
    .collect();
    let v2: Vec<&str> = V2_SOURCES.iter().copied().flat_map(filled_by).collect();
    for names in [&v1, &v2] {
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }
}

#[test]
fn v2_tree_with_a_pod_and_a_slurm_job() {
    let roots = fixture("k8s-node");
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let Availability::Available(summary) = c.probe() else {
        panic!("v2 fixture is absent");
    };
    assert_eq!(
        summary,
        "cgroup v2 (controllers: cpuset cpu io memory hugetlb pids rdma misc), 15 cgroups within depth 4; \
         walked when inotify reports a change (16 directories watched)"
    );
    let batch = collect_one(&mut c, 7);
    assert_eq!(batch.len(), 15, "{:?}", paths(&batch));
    assert!(batch.time_us.iter().all(|&t| t == 7));
    let ctr = format!("{POD}/{CRI}");
    assert_eq!(workload(&batch, &ctr), "container");
    assert_eq!(workload(&batch, POD), "pod");
    assert_eq!(workload(&batch, "/kubepods.slice"), "slice");
    assert_eq!(workload(&batch, "/system.slice/kubelet.service"), "service");
    assert_eq!(workload(&batch, JOB_V2), "slurm_job");
    assert_eq!(workload(&batch, &format!("{JOB_V2}/step_0")), "slurm_step");
    assert_eq!(workload(&batch, "/init.scope"), "other");

    let v = |name| value(&batch, &ctr, name);
    assert!(close(v("cpu_usage_seconds"), 98.765432));
    assert!(close(v("cpu_user_seconds"), 80.0));
    assert!(close(v("cpu_system_seconds"), 18.765432));
    assert_eq!(v("cpu_periods"), Value::U64(40_000));
    assert_eq!(v("cpu_throttled_periods"), Value::U64(1_500));
    assert!(close(v("cpu_throttled_seconds"), 61.5));
    assert!(close(v("cpu_quota_cpus"), 1.5));
    assert_eq!(v("memory_usage_bytes"), Value::U64(402_653_184));
    assert_eq!(v("memory_limit_bytes"), Value::U64(536_870_912));
    assert_eq!(v("memory_anon_bytes"), Value::U64(314_572_800));
    assert_eq!(v("memory_file_bytes"), Value::U64(62_914_560));
    assert_eq!(v("memory_kernel_bytes"), Value::U64(20_971_520));
    assert_eq!(v("memory_slab_bytes"), Value::U64(12_582_912));
    assert_eq!(v("memory_swap_bytes"), Value::U64(0));
    assert_eq!(v("memory_page_faults"), Value::U64(2_500_000));
    assert_eq!(v("memory_major_page_faults"), Value::U64(310));
    assert_eq!(v("memory_max_events"), Value::U64(57));
    // io.stat's per-device lines summed; the cost.* keys of io.cost skipped.
    assert_eq!(v("io_read_bytes"), Value::U64(73_400_320 + 4096));
    assert_eq!(v("io_write_bytes"), Value::U64(314_572_800));
    assert_eq!(v("memory_oom_events"), Value::U64(2));
    assert_eq!(v("memory_oom_kills"), Value::U64(1));
    assert!(close(v("cpu_pressure_some_seconds"), 45.0));
    assert!(close(v("cpu_pressure_full_seconds"), 30.0));
    assert!(close(v("memory_pressure_some_seconds"), 1.2));
    assert!(close(v("memory_pressure_full_seconds"), 0.8));
    assert!(close(v("io_pressure_some_seconds"), 0.25));
    assert!(close(v("io_pressure_full_seconds"), 0.1));

    // Unlimited: cpu.max "max 100000" and memory.max "max" are null.
    assert_eq!(value(&batch, POD, "cpu_quota_cpus"), Value::Null);
    assert_eq!(value(&batch, POD, "memory_limit_bytes"), Value::Null);
    assert_eq!(
        value(&batch, JOB_V2, "memory_limit_bytes"),
        Value::U64(34_359_738_368)
    );
    // No cpu controller in user.slice: no throttling, no quota; usage still there.
    assert_eq!(value(&batch, "/user.slice", "cpu_periods"), Value::Null);
    assert!(close(
        value(&batch, "/user.slice", "cpu_usage_seconds"),
        55.0
    ));
    // No memory.swap.current in init.scope.
    assert_eq!(
        value(&batch, "/init.scope", "memory_swap_bytes"),
        Value::Null
    );
    // Rows are in path order, and the same on the next tick.
    let order = paths(&batch)
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
    let again = collect_one(&mut c, 8);
    assert_eq!(paths(&again), order);
    assert!(c.problems().is_empty());
}

#[test]
fn v1_tree_with_slurm_docker_and_a_service() {
    let roots = fixture("baremetal-node");
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let Availability::Available(summary) = c.probe() else {
        panic!("v1 fixture is absent");
    };
    // `cpu` and `cpuacct` link to `cpu,cpuacct`: walked once.
    assert_eq!(
        summary,
        "cgroup v1 (cpu,cpuacct memory unified), 10 cgroups within depth 4; \
         walked when inotify reports a change (26 directories watched)"
    );
    let batch = collect_one(&mut c, 1);
    assert_eq!(
        paths(&batch),
        [
            "/docker",
            DOCKER,
            "/slurm",
            "/slurm/uid_1000",
            JOB_V1,
            "/slurm/uid_1000/job_4242/step_0",
            "/slurm/uid_1000/job_4242/step_batch",
            "/system.slice",
            "/system.slice/docker.service",
            "/system.slice/slurmd.service",
        ]
    );
    assert_eq!(workload(&batch, DOCKER), "container");
    assert_eq!(workload(&batch, "/docker"), "other");
    assert_eq!(workload(&batch, JOB_V1), "slurm_job");
    assert_eq!(
        workload(&batch, "/slurm/uid_1000/job_4242/step_batch"),
        "slurm_step"
    );
    assert_eq!(workload(&batch, "/system.slice/slurmd.service"), "service");

    let v = |name| value(&batch, DOCKER, name);
    assert!(close(v("cpu_usage_seconds"), 123.456789012));
    assert!(close(v("cpu_user_seconds"), 100.0));
    assert!(close(v("cpu_system_seconds"), 23.45));
    assert_eq!(v("cpu_periods"), Value::U64(5_000));
    assert_eq!(v("cpu_throttled_periods"), Value::U64(120));
    assert!(close(v("cpu_throttled_seconds"), 3.5));
    assert!(close(v("cpu_quota_cpus"), 2.0));
    assert_eq!(v("memory_usage_bytes"), Value::U64(1_073_741_824));
    assert_eq!(v("memory_limit_bytes"), Value::U64(2_147_483_648));
    assert_eq!(v("memory_anon_bytes"), Value::U64(805_306_368));
    assert_eq!(v("memory_file_bytes"), Value::U64(201_326_592));
    assert_eq!(v("memory_kernel_bytes"), Value::U64(52_428_800));
    assert_eq!(v("memory_slab_bytes"), Value::Null);
    assert_eq!(v("memory_swap_bytes"), Value::U64(0));
    assert_eq!(v("memory_page_faults"), Value::U64(1_000_000));
    assert_eq!(v("memory_major_page_faults"), Value::U64(42));
    assert_eq!(v("memory_oom_events"), Value::Null);
    assert_eq!(v("memory_oom_kills"), Value::U64(0));
    assert_eq!(v("cpu_pressure_some_seconds"), Value::Null);

    // The job: unlimited CPU (-1), a 64 GiB limit, one OOM kill.
    assert_eq!(value(&batch, JOB_V1, "cpu_quota_cpus"), Value::Null);
    // v1 has no per-cgroup I/O bytes that count (blkio's are 0 without
    // throttle rules on current kernels): null, not zero.
    assert_eq!(value(&batch, JOB_V1, "io_read_bytes"), Value::Null);
    assert_eq!(
        value(&batch, JOB_V1, "memory_limit_bytes"),
        Value::U64(68_719_476_736)
    );
    assert_eq!(value(&batch, JOB_V1, "memory_oom_kills"), Value::U64(1));
    assert!(close(value(&batch, JOB_V1, "cpu_usage_seconds"), 7200.0));
    // slurmd: the v1 "unlimited" 9223372036854771712 is null; pressure from unified/.
    let slurmd = "/system.slice/slurmd.service";
    assert_eq!(value(&batch, slurmd, "memory_limit_bytes"), Value::Null);
    assert!(close(
        value(&batch, slurmd, "cpu_pressure_some_seconds"),
        1.234567
    ));
    assert!(close(
        value(&batch, slurmd, "io_pressure_full_seconds"),
        0.345678
    ));
}

#[test]
fn vm_node_capture_is_hybrid_v1_with_memory_cgroups() {
    let roots = fixture("vm-node");
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let Availability::Available(summary) = c.probe() else {
        panic!("vm fixture is absent");
    };
    assert!(
        summary.starts_with("cgroup v1 (cpu cpuacct memory unified), "),
        "{summary}"
    );
    let batch = collect_one(&mut c, 1);
    let p = "/process_api/509751c12dfd1497b902bf88fa589d7f";
    assert_eq!(workload(&batch, p), "other");
    assert_eq!(
        value(&batch, p, "memory_usage_bytes"),
        Value::U64(12_464_128)
    );
    assert_eq!(value(&batch, p, "memory_limit_bytes"), Value::Null);
    assert_eq!(value(&batch, p, "memory_anon_bytes"), Value::U64(1_855_488));
    assert_eq!(
        value(&batch, p, "memory_kernel_bytes"),
        Value::U64(1_822_720)
    );
    assert_eq!(value(&batch, p, "cpu_usage_seconds"), Value::Null);
}

#[test]
fn depth_bounds_the_walk() {
    let roots = fixture("k8s-node");
    let shallow = CgroupsConfig {
        max_depth: 1,
        ..CgroupsConfig::default()
    };
    let batch = collect_one(&mut collector(&shallow, &roots), 1);
    assert_eq!(
        paths(&batch),
        [
            "/init.scope",
            "/kubepods.slice",
            "/system.slice",
            "/user.slice"
        ]
    );
    let deep = CgroupsConfig {
        max_depth: 8,
        ..CgroupsConfig::default()
    };
    let batch = collect_one(&mut collector(&deep, &roots), 1);
    assert_eq!(batch.len(), 17);
    assert_eq!(
        workload(&batch, &format!("{JOB_V2}/step_0/user/task_0")),
        "slurm_step"
    );
}

#[test]
fn include_and_exclude_patterns() {
    let roots = fixture("k8s-node");
    let config = CgroupsConfig {
        include: vec!["/job_[0-9]+".into(), r"\.service$".into()],
        exclude: vec!["step_batch$".into(), "^/system.slice/kubelet".into()],
        ..CgroupsConfig::default()
    };
    let batch = collect_one(&mut collector(&config, &roots), 1);
    assert_eq!(
        paths(&batch),
        [
            "/system.slice/containerd.service",
            JOB_V2,
            "/system.slice/slurmstepd.scope/job_77/step_0",
        ]
    );
    // Patterns that match nothing: no rows, no batch, no error.
    let none = CgroupsConfig {
        include: vec!["^/nothing$".into()],
        ..CgroupsConfig::default()
    };
    assert!(collector(&none, &roots).collect(1).unwrap().is_empty());
}

#[test]
fn max_cgroups_keeps_the_shallowest_and_reports_the_rest() {
    let roots = fixture("k8s-node");
    let config = CgroupsConfig {
        max_cgroups: 5,
        ..CgroupsConfig::default()
    };
    let mut c = collector(&config, &roots);
    let batch = collect_one(&mut c, 1);
    assert_eq!(
        paths(&batch),
        [
            "/init.scope",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-besteffort.slice",
            "/system.slice",
            "/user.slice",
        ]
    );
    assert_eq!(
        c.problems(),
        ["10 cgroups over collectors.cgroups.max_cgroups = 5 are not sampled: raise it, or narrow include/exclude or max_depth"]
    );
    assert_eq!(c.left_out(), 10, "vtax_collector_left_out");
    let Availability::Available(summary) = c.probe() else {
        panic!()
    };
    assert!(
        summary.contains("5 cgroups within depth 4 (10 over max_cgroups skipped);"),
        "{summary}"
    );
}

/// At the bound, a cgroup made later is left out rather than pushing out one
/// already sampled, though it sorts first: a cut that moved would make a
/// steady pod a leaf with its children's use, or move a steady container's
/// use out of every sampled cgroup. When a sampled one goes, its place is
/// taken again shallowest first.
#[test]
fn at_max_cgroups_a_new_cgroup_does_not_push_out_a_sampled_one() {
    let (_dir, roots) = scratch("k8s-node");
    let config = CgroupsConfig {
        max_cgroups: 5,
        ..CgroupsConfig::default()
    };
    let mut c = collector(&config, &roots);
    let first = [
        "/init.scope",
        "/kubepods.slice",
        "/kubepods.slice/kubepods-besteffort.slice",
        "/system.slice",
        "/user.slice",
    ];
    assert_eq!(paths(&collect_one(&mut c, 1_000_000)), first);
    // A new top-level slice, which a fresh cut would take before the
    // depth-2 slice.
    let new = roots.sys("fs/cgroup/a.slice");
    std::fs::create_dir_all(&new).unwrap();
    std::fs::write(new.join("memory.current"), "4096\n").unwrap();
    assert_eq!(paths(&collect_one(&mut c, 2_000_000)), first);
    assert_eq!(c.walks, 2, "the new slice was walked");
    assert_eq!(
        c.problems(),
        ["11 cgroups over collectors.cgroups.max_cgroups = 5 are not sampled: raise it, or narrow include/exclude or max_depth"]
    );
    assert_eq!(c.left_out(), 11);
    // The sampled user.slice goes: the new slice, shallowest, takes its place.
    std::fs::remove_dir_all(roots.sys("fs/cgroup/user.slice")).unwrap();
    assert_eq!(
        paths(&collect_one(&mut c, 3_000_000)),
        [
            "/a.slice",
            "/init.scope",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-besteffort.slice",
            "/system.slice",
        ]
    );
}

/// A copy of a fixture's cgroup tree that a test may change.
fn scratch(node: &str) -> (tempfile::TempDir, Roots) {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &fixture(node).sysfs.join("fs/cgroup"),
        &dir.path().join("sys/fs/cgroup"),
    );
    let roots = Roots {
        procfs: dir.path().join("proc"),
        sysfs: dir.path().join("sys"),
        ..Roots::default()
    };
    (dir, roots)
}

#[test]
fn a_cgroup_removed_between_ticks_is_dropped_silently() {
    for (node, gone) in [("k8s-node", JOB_V2), ("baremetal-node", JOB_V1)] {
        let (_dir, roots) = scratch(node);
        let config = CgroupsConfig {
            rescan_interval_secs: 3600.0,
            ..CgroupsConfig::default()
        };
        let mut c = collector(&config, &roots);
        let before = collect_one(&mut c, 1_000_000);
        assert!(paths(&before).contains(&gone));
        // The job ends: its whole subtree goes, in every hierarchy.
        let cgroup = roots.sys("fs/cgroup");
        for hierarchy in ["", "cpu,cpuacct", "memory"] {
            let dir = cgroup.join(hierarchy).join(gone.trim_start_matches('/'));
            if dir.exists() {
                std::fs::remove_dir_all(dir).unwrap();
            }
        }
        let after = collect_one(&mut c, 2_000_000);
        assert!(!paths(&after).iter().any(|p| p.starts_with(gone)), "{node}");
        assert_eq!(after.len(), before.len() - 3, "{node}");
        // The vanished job forced a walk: a new cgroup is found on the next tick
        // although the rescan interval is an hour.
        let new = cgroup.join("system.slice/late.service");
        std::fs::create_dir_all(cgroup.join("memory/system.slice/late.service")).unwrap();
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(new.join("memory.current"), "4096\n").unwrap();
        std::fs::write(
            cgroup.join("memory/system.slice/late.service/memory.usage_in_bytes"),
            "4096\n",
        )
        .unwrap();
        let later = collect_one(&mut c, 3_000_000);
        assert_eq!(
            value(&later, "/system.slice/late.service", "memory_usage_bytes"),
            Value::U64(4096),
            "{node}"
        );
    }
}

/// Walks cost 12-15% of the collector's CPU at one every 10 s; with the
/// hierarchy watched, one runs when a cgroup comes or a limit changes,
/// and the change is in the next read instead of up to 10 s later.
#[test]
fn a_new_cgroup_or_a_changed_limit_is_read_at_the_next_tick_and_quiet_ticks_do_not_walk() {
    let (_dir, roots) = scratch("k8s-node");
    let mut c = collector(&CgroupsConfig::default(), &roots);
    assert_eq!(collect_one(&mut c, 0).len(), 15);
    assert!(c.watch.as_ref().is_some_and(|w| w.watched > 15));
    for second in 1..=30 {
        assert_eq!(collect_one(&mut c, second * 1_000_000).len(), 15);
    }
    assert_eq!(c.walks, 1, "nothing changed, nothing to walk for");

    let new = roots.sys("fs/cgroup/system.slice/late.service");
    std::fs::create_dir_all(&new).unwrap();
    std::fs::write(new.join("memory.current"), "4096\n").unwrap();
    let batch = collect_one(&mut c, 31_000_000);
    assert_eq!(batch.len(), 16);
    assert_eq!(
        value(&batch, "/system.slice/late.service", "memory_usage_bytes"),
        Value::U64(4096)
    );
    assert_eq!(c.walks, 2);

    let pods = "/kubepods.slice/kubepods-burstable.slice";
    std::fs::write(
        roots.sys(format!("fs/cgroup{pods}/memory.max")),
        "1073741824\n",
    )
    .unwrap();
    let batch = collect_one(&mut c, 32_000_000);
    assert_eq!(
        value(&batch, pods, "memory_limit_bytes"),
        Value::U64(1 << 30)
    );
    assert_eq!(c.walks, 3);

    // The net under the watch: a walk a minute after the last.
    collect_one(&mut c, 91_000_000);
    assert_eq!(c.walks, 3);
    collect_one(&mut c, 92_000_000);
    assert_eq!(c.walks, 4);
}

#[test]
fn without_a_watch_new_cgroups_are_found_at_the_rescan_interval() {
    let (_dir, roots) = scratch("k8s-node");
    let mut c = collector(&CgroupsConfig::default(), &roots);
    c.watch_changes = false; // as where inotify cannot be had
    assert_eq!(collect_one(&mut c, 0).len(), 15);
    assert!(c.watch.is_none());
    let new = roots.sys("fs/cgroup/system.slice/late.service");
    std::fs::create_dir_all(&new).unwrap();
    std::fs::write(new.join("memory.current"), "4096\n").unwrap();
    assert_eq!(collect_one(&mut c, 9_000_000).len(), 15);
    assert_eq!(collect_one(&mut c, 10_000_000).len(), 16);
}

/// Rewrites the `key value` line of `key` in a cgroup file, in place.
fn set_key(file: &Path, key: &str, value: u64) {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|line| match line.split_once(' ') {
            Some((k, _)) if k == key => format!("{key} {value}"),
            _ => line.to_string(),
        })
        .collect();
    assert!(
        lines.iter().any(|l| l.starts_with(&format!("{key} "))),
        "{key}"
    );
    std::fs::write(file, lines.join("\n") + "\n").unwrap();
}

#[test]
fn a_quiet_cgroup_repeats_what_follows_usage_until_its_usage_moves_or_a_rescan() {
    // (node, cgroup, its directory per hierarchy: cpu, memory, pressure; the
    // memory.stat key behind memory_page_faults)
    for (node, path, cpu_dir, memory_dir, pressure_dir, faults_key) in [
        (
            "k8s-node",
            "/init.scope",
            "init.scope",
            "init.scope",
            "init.scope",
            "pgfault",
        ),
        (
            "baremetal-node",
            "/system.slice/slurmd.service",
            "cpu,cpuacct/system.slice/slurmd.service",
            "memory/system.slice/slurmd.service",
            "unified/system.slice/slurmd.service",
            "total_pgfault",
        ),
    ] {
        let (_dir, roots) = scratch(node);
        let cgroup = roots.sys("fs/cgroup");
        let stat = cgroup.join(memory_dir).join("memory.stat");
        let bump_cpu = |usage: u64| {
            if node == "k8s-node" {
                set_key(&cgroup.join(cpu_dir).join("cpu.stat"), "usage_usec", usage);
            } else {
                let file = cgroup.join(cpu_dir).join("cpuacct.usage");
                std::fs::write(file, format!("{}\n", usage * 1000)).unwrap();
            }
        };
        let bump_memory = |bytes: u64| {
            let file = if node == "k8s-node" {
                "memory.current"
            } else {
                "memory.usage_in_bytes"
            };
            std::fs::write(cgroup.join(memory_dir).join(file), format!("{bytes}\n")).unwrap();
        };
        let mut c = collector(&CgroupsConfig::default(), &roots); // rescans every 10 s
        let faults = |batch: &Batch| match value(batch, path, "memory_page_faults") {
            Value::U64(n) => n,
            other => panic!("{node}: {other:?}"),
        };
        let base = faults(&collect_one(&mut c, 0));

        // Nothing ran and no charge moved: memory.stat is not read again,
        // but pressure (which grows for a blocked task) is.
        set_key(&stat, faults_key, base + 5);
        std::fs::write(
            cgroup.join(pressure_dir).join("cpu.pressure"),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=9000000\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=4000000\n",
        )
        .unwrap();
        let quiet = collect_one(&mut c, 1_000_000);
        assert_eq!(faults(&quiet), base, "{node}");
        assert!(
            close(value(&quiet, path, "cpu_pressure_some_seconds"), 9.0),
            "{node}"
        );

        // Its tasks ran: everything is read.
        bump_cpu(99_000_000);
        assert_eq!(faults(&collect_one(&mut c, 2_000_000)), base + 5, "{node}");
        // Its charge moved (reclaim by someone else, say): everything is read.
        set_key(&stat, faults_key, base + 6);
        assert_eq!(faults(&collect_one(&mut c, 3_000_000)), base + 5, "{node}");
        bump_memory(123_456_789);
        assert_eq!(faults(&collect_one(&mut c, 4_000_000)), base + 6, "{node}");
        // The tick after a walk reads everything, quiet or not.
        set_key(&stat, faults_key, base + 7);
        assert_eq!(faults(&collect_one(&mut c, 9_000_000)), base + 6, "{node}");
        assert_eq!(faults(&collect_one(&mut c, 10_000_000)), base + 7, "{node}");
    }
}

#[test]
fn each_file_fills_only_the_fields_it_declares() {
    // A quiet tick copies a skipped file's declared fields from the last
    // full read: a field it fills but does not declare would go stale.
    let mut seen = BTreeSet::new();
    for node in ["k8s-node", "baremetal-node"] {
        let mut c = collector(&CgroupsConfig::default(), &fixture(node));
        c.rewalk(0).unwrap();
        let buf = &mut c.buf;
        for target in &mut c.discovery.targets {
            for slot in &mut target.slots {
                let Ok(n) = slot.file.read(buf) else {
                    continue; // a file this cgroup lacks
                };
                let mut row = Row::new();
                let text = std::str::from_utf8(&buf[..n]).unwrap();
                parse(slot.source, text, slot.file.path(), &mut row, 100.0).unwrap();
                let declared = filled_by(slot.source);
                for name in set_fields(&row.values) {
                    assert!(
                        declared.contains(&name),
                        "{:?} filled {name} from {}",
                        slot.source,
                        slot.file.path().display()
                    );
                }
                seen.insert(format!("{:?}", slot.source));
            }
        }
    }
    for source in [
        Source::MemoryStatV2,
        Source::MemoryEvents,
        Source::SwapCurrent,
        Source::CpuStatV1,
        Source::CpuacctStat,
        Source::MemoryStatV1,
        Source::OomControl,
        Source::KmemUsage,
    ] {
        assert!(source.follows_usage());
        assert!(
            seen.contains(&format!("{source:?}")),
            "{source:?} not in a fixture"
        );
    }
}

/// io.stat: what the kernel writes adds up, a cgroup that did no I/O (no
/// device line) reads zero, and
/// what it never writes is an error that costs only the file's fields.
#[test]
fn io_byte_files_sum_their_devices_and_refuse_what_the_kernel_never_writes() {
    let path = Path::new("io.stat");
    let read = |source: Source, text: &str| {
        let mut row = Row::new();
        parse(source, text, path, &mut row, 100.0)
            .map(|()| (row.values.io_read_bytes, row.values.io_write_bytes))
    };
    assert_eq!(
        read(Source::IoStat, "8:0 rbytes=10 wbytes=20 rios=1 wios=2\n8:16 rbytes=5 wbytes=0\n"),
        Ok((Some(15), Some(20)))
    );
    assert_eq!(read(Source::IoStat, ""), Ok((Some(0), Some(0))));
    for bad in [
        "8:0 rbytes=ten wbytes=0\n",
        "sda rbytes=1\n",
        "8:0 rbytes=18446744073709551615\n8:16 rbytes=1\n",
    ] {
        assert!(read(Source::IoStat, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn limits_are_read_at_each_walk_and_measurements_on_every_tick() {
    for (node, usage, limit, quota) in [
        (
            "k8s-node",
            "init.scope/memory.current",
            "init.scope/memory.max",
            vec![("init.scope/cpu.max", "50000 100000\n")],
        ),
        (
            "baremetal-node",
            "memory/docker/memory.usage_in_bytes",
            "memory/docker/memory.limit_in_bytes",
            vec![
                ("cpu,cpuacct/docker/cpu.cfs_quota_us", "50000\n"),
                ("cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n"),
            ],
        ),
    ] {
        let (_dir, roots) = scratch(node);
        let cgroup = roots.sys("fs/cgroup");
        let path = if node == "k8s-node" {
            "/init.scope"
        } else {
            "/docker"
        };
        let mut c = collector(&CgroupsConfig::default(), &roots);
        // Without a watch (as where inotify cannot be had) the hierarchy
        // is walked, and limits read, every rescan_interval_secs; the
        // watched case is in the test of the watch.
        c.watch_changes = false;
        let first = collect_one(&mut c, 0);
        let limit_before = value(&first, path, "memory_limit_bytes");
        let quota_before = value(&first, path, "cpu_quota_cpus");
        // Rewritten in place, as the kernel's files are: a measurement is
        // new on the next tick, a limit at the next walk.
        std::fs::write(cgroup.join(usage), "12345\n").unwrap();
        std::fs::write(cgroup.join(limit), "1048576\n").unwrap();
        for (file, text) in &quota {
            std::fs::write(cgroup.join(file), text).unwrap();
        }
        let tick = collect_one(&mut c, 1_000_000);
        let v = |name| value(&tick, path, name);
        assert_eq!(v("memory_usage_bytes"), Value::U64(12345), "{node}");
        assert_eq!(v("memory_limit_bytes"), limit_before, "{node}");
        assert_eq!(v("cpu_quota_cpus"), quota_before, "{node}");
        let rescan = collect_one(&mut c, 10_000_000);
        let v = |name| value(&rescan, path, name);
        assert_eq!(v("memory_usage_bytes"), Value::U64(12345), "{node}");
        assert_eq!(v("memory_limit_bytes"), Value::U64(1_048_576), "{node}");
        assert!(close(v("cpu_quota_cpus"), 0.5), "{node}");
        // The walk kept the descriptors: still fresh values through them.
        std::fs::write(cgroup.join(usage), "23456\n").unwrap();
        let after = collect_one(&mut c, 11_000_000);
        assert_eq!(
            value(&after, path, "memory_usage_bytes"),
            Value::U64(23456),
            "{node}"
        );
        assert_eq!(
            value(&after, path, "memory_limit_bytes"),
            Value::U64(1_048_576),
            "{node}"
        );
    }
}

#[test]
fn a_cgroup_made_again_at_the_same_path_is_read_afresh() {
    let (_dir, roots) = scratch("k8s-node");
    let config = CgroupsConfig {
        rescan_interval_secs: 3600.0,
        ..CgroupsConfig::default()
    };
    let mut c = collector(&config, &roots);
    let path = "/system.slice/kubelet.service";
    let before = collect_one(&mut c, 1_000_000);
    assert!(paths(&before).contains(&path));
    // A restarted service: its directory removed and made again.
    let dir = roots.sys("fs/cgroup").join(path.trim_start_matches('/'));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("memory.current"), "8192\n").unwrap();
    // The walk its removal set off finds a directory other than the one
    // whose files are held (another inode), and reads it afresh at once;
    // without a watch, the held file is noticed as gone (what ENODEV says on
    // cgroupfs) and the next walk finds it again.
    let mut again = collect_one(&mut c, 2_000_000);
    if !paths(&again).contains(&path) {
        again = collect_one(&mut c, 3_000_000);
    }
    assert_eq!(value(&again, path, "memory_usage_bytes"), Value::U64(8192));
    assert_eq!(value(&again, path, "cpu_usage_seconds"), Value::Null);
    assert_eq!(again.len(), before.len());
}

/// A v1 cgroup renamed, and another made under its old name (v1 allows a
/// rename): the new cgroup is read from its own files, not through the
/// descriptors held for the renamed one, which would give it the renamed
/// cgroup's CPU time and memory and count them twice.
#[test]
fn a_cgroup_renamed_and_another_made_at_its_path_is_read_afresh() {
    let (_dir, roots) = scratch("k8s-node");
    let config = CgroupsConfig {
        rescan_interval_secs: 0.0,
        ..CgroupsConfig::default()
    };
    let mut c = collector(&config, &roots);
    let path = "/system.slice/kubelet.service";
    let dir = roots.sys("fs/cgroup").join(path.trim_start_matches('/'));
    std::fs::write(dir.join("memory.current"), "4096\n").unwrap();
    let before = collect_one(&mut c, 1_000_000);
    assert_eq!(value(&before, path, "memory_usage_bytes"), Value::U64(4096));
    let renamed = dir.with_file_name("kubelet-old.service");
    std::fs::rename(&dir, &renamed).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("memory.current"), "8192\n").unwrap();
    let after = collect_one(&mut c, 2_000_000);
    assert_eq!(value(&after, path, "memory_usage_bytes"), Value::U64(8192));
    assert_eq!(
        value(&after, "/system.slice/kubelet-old.service", "memory_usage_bytes"),
        Value::U64(4096)
    );
}

/// Every value of every row of `batch`, by path and field name.
fn all_values(batch: &Batch) -> BTreeMap<(String, &'static str), Value> {
    let mut out = BTreeMap::new();
    for path in paths(batch) {
        for field in CGROUP.fields {
            out.insert(
                (path.to_owned(), field.name),
                value(batch, path, field.name),
            );
        }
    }
    out
}

/// Writes `text` into `file` of a copy of `node`'s tree and reads it once:
/// the tick succeeds, the one error names the file, and every other
/// value of every cgroup is as read from the intact tree. Returns the
/// error after the path.
fn garbage(node: &str, file: &str, text: &str) -> String {
    let (_dir, roots) = scratch(node);
    let intact = collect_one(&mut collector(&CgroupsConfig::default(), &roots), 1);
    let path = roots.sys("fs/cgroup").join(file);
    std::fs::write(&path, text).unwrap();
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let damaged = collect_one(&mut c, 1);
    let errors = c.source_errors();
    assert_eq!(errors.len(), 1, "{file}: {errors:?}");
    let shown = path.display().to_string();
    assert_eq!(errors[0].path, shown, "{file}");
    // The file's own fields of its own cgroup are null; nothing else moved.
    let (want, got) = (all_values(&intact), all_values(&damaged));
    assert_eq!(got.len(), want.len(), "{file}: every cgroup keeps its row");
    let lost: Vec<&(String, &str)> = want.keys().filter(|k| got[*k] != want[*k]).collect();
    for key in &lost {
        assert_eq!(got[*key], Value::Null, "{file}: {key:?}");
    }
    let mut cgroups: Vec<&str> = lost.iter().map(|(p, _)| p.as_str()).collect();
    cgroups.dedup();
    assert!(cgroups.len() <= 1, "{file}: {cgroups:?} lost values");
    errors[0].to_string()[shown.len()..].to_string()
}

#[test]
fn garbage_names_the_file_and_line_and_costs_only_its_fields() {
    let stat = "system.slice/kubelet.service/memory.stat";
    assert_eq!(
        garbage("k8s-node", stat, "anon 1\nfile x\n"),
        ":2: \"x\" is not a number"
    );
    assert_eq!(
        garbage("k8s-node", stat, "anon 1\nfile 99999999999999999999999\n"),
        ":2: \"99999999999999999999999\" is not a number"
    );
    assert_eq!(
        garbage("k8s-node", stat, "anon 1\nfil"),
        ":2: \"fil\" is not \"key value\""
    );
    assert_eq!(
        garbage("k8s-node", "init.scope/cpu.max", "150000\n"),
        ":1: \"150000\" is not \"quota period\""
    );
    assert_eq!(
        garbage("k8s-node", "init.scope/memory.max", "lots\n"),
        ":1: \"lots\" is not a number"
    );
    assert_eq!(
        garbage(
            "k8s-node",
            "init.scope/io.pressure",
            "some avg10=0.00 total=12\nfull avg10=0.00\n"
        ),
        ":2: no total="
    );
    assert_eq!(
        garbage("k8s-node", "init.scope/memory.current", ""),
        ":1: expected one line"
    );
    assert_eq!(
        garbage("baremetal-node", "cpu,cpuacct/docker/cpuacct.usage", "-5\n"),
        ":1: \"-5\" is not a number"
    );
    assert_eq!(
        garbage(
            "baremetal-node",
            "memory/slurm/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill one\n"
        ),
        ":3: \"one\" is not a number"
    );
    assert_eq!(
        garbage(
            "baremetal-node",
            "memory/slurm/memory.stat",
            "total_rss 1 2\n"
        ),
        ":1: \"total_rss 1 2\" is not \"key value\""
    );
    assert_eq!(
        garbage(
            "baremetal-node",
            "cpu,cpuacct/slurm/cpu.cfs_quota_us",
            "x\n"
        ),
        ":1: \"x\" is not a number"
    );
    assert_eq!(
        garbage("k8s-node", "init.scope/cpu.stat", "\u{0}\u{ff}"),
        ":1: \"\\0\u{ff}\" is not \"key value\""
    );
}

/// A pod's `memory.stat` holding junk (issue 36, item 6): that pod keeps
/// its row with every other field, every other cgroup is read as before,
/// the file is named in `source_errors`; once mended, the next tick reads
/// it with no error, without waiting for a walk or a full read.
#[test]
fn one_bad_file_costs_its_own_fields_and_mends_at_the_next_tick() {
    let (_dir, roots) = scratch("k8s-node");
    let config = CgroupsConfig {
        rescan_interval_secs: 3600.0,
        ..CgroupsConfig::default()
    };
    let mut c = collector(&config, &roots);
    let intact = collect_one(&mut c, 1_000_000);
    let walks = c.walks;
    let ctr = format!("{POD}/{CRI}");
    let cgroup = roots.sys("fs/cgroup").join(ctr.trim_start_matches('/'));
    let stat = cgroup.join("memory.stat");
    let good = std::fs::read_to_string(&stat).unwrap();
    std::fs::write(&stat, good.replacen("anon 314572800", "anon 3145x2800", 1)).unwrap();
    // Its usage moves, so the tick reads memory.stat.
    set_key(&cgroup.join("cpu.stat"), "usage_usec", 98_765_433);
    let damaged = collect_one(&mut c, 2_000_000);
    let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(
        errors,
        [format!(
            "{}:1: \"3145x2800\" is not a number",
            stat.display()
        )]
    );
    assert_eq!(
        paths(&damaged),
        paths(&intact),
        "every cgroup keeps its row"
    );
    let (want, got) = (all_values(&intact), all_values(&damaged));
    for ((path, field), v) in &want {
        let now = got[&(path.clone(), *field)];
        if *path != ctr {
            assert_eq!(now, *v, "{path} {field}");
        } else if filled_by(Source::MemoryStatV2).contains(field) {
            assert_eq!(now, Value::Null, "{field} comes from the bad file");
        } else if *field == "cpu_usage_seconds" {
            assert!(close(now, 98.765433));
        } else {
            assert_eq!(now, *v, "{field}");
        }
    }
    // Mended: the cgroup's CPU time does not move, yet its memory.stat is
    // read again (a bad file's nulls are never repeated).
    std::fs::write(&stat, &good).unwrap();
    let mended = collect_one(&mut c, 3_000_000);
    assert_eq!(c.walks, walks, "no walk");
    assert!(c.source_errors().is_empty(), "{:?}", c.source_errors());
    assert_eq!(
        value(&mended, &ctr, "memory_anon_bytes"),
        Value::U64(314_572_800)
    );
}

/// A limit file that reads badly is read again at the next tick, not at
/// the next walk (up to a minute away with the watch, an hour here).
#[test]
fn a_bad_limit_is_read_again_at_the_next_tick() {
    let (_dir, roots) = scratch("k8s-node");
    let config = CgroupsConfig {
        rescan_interval_secs: 3600.0,
        ..CgroupsConfig::default()
    };
    let max = roots.sys("fs/cgroup/init.scope/memory.max");
    std::fs::write(&max, "lots\n").unwrap();
    let mut c = collector(&config, &roots);
    c.watch_changes = false; // no walk when the file is mended
    let first = collect_one(&mut c, 1_000_000);
    assert_eq!(
        value(&first, "/init.scope", "memory_limit_bytes"),
        Value::Null
    );
    assert_eq!(c.source_errors().len(), 1);
    let walks = c.walks;
    std::fs::write(&max, "1073741824\n").unwrap();
    let second = collect_one(&mut c, 2_000_000);
    assert_eq!(c.walks, walks, "no walk");
    assert!(c.source_errors().is_empty(), "{:?}", c.source_errors());
    assert_eq!(
        value(&second, "/init.scope", "memory_limit_bytes"),
        Value::U64(1 << 30)
    );
    // Read well once, it is read at walks only again.
    std::fs::write(&max, "lots\n").unwrap();
    let third = collect_one(&mut c, 3_000_000);
    assert!(c.source_errors().is_empty());
    assert_eq!(
        value(&third, "/init.scope", "memory_limit_bytes"),
        Value::U64(1 << 30)
    );
}

/// Every file of every cgroup bad: the tick fails, naming the first.
#[test]
fn a_tick_fails_only_when_no_cgroup_reads_well() {
    let (_dir, roots) = scratch("k8s-node");
    let cgroup = roots.sys("fs/cgroup");
    let mut files = 0;
    let mut dirs = vec![cgroup.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else if V2_SOURCES
                .iter()
                .any(|s| entry.file_name().to_str() == Some(s.file_name()))
            {
                std::fs::write(entry.path(), "junk junk junk\n").unwrap();
                files += 1;
            }
        }
    }
    assert!(files > 15);
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let err = c.collect(1).unwrap_err().to_string();
    assert!(err.starts_with(&cgroup.display().to_string()), "{err}");
    assert!(!c.source_errors().is_empty(), "the others are named too");
}

#[test]
fn binary_junk_is_an_error_not_a_panic() {
    let (_dir, roots) = scratch("k8s-node");
    let path = roots.sys("fs/cgroup/init.scope/cpu.stat");
    std::fs::write(&path, [0xffu8, 0xfe, 0x00, 0x41]).unwrap();
    let mut c = collector(&CgroupsConfig::default(), &roots);
    assert_eq!(collect_one(&mut c, 1).len(), 15);
    let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(errors, [format!("{}: not UTF-8 text", path.display())]);
}

#[test]
fn no_cgroup_filesystem_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let roots = Roots {
        procfs: dir.path().join("proc"),
        sysfs: dir.path().join("sys"),
        ..Roots::default()
    };
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let Availability::Absent(why) = c.probe() else {
        panic!("no /sys/fs/cgroup yet available");
    };
    assert!(why.starts_with("no cgroup filesystem at "), "{why}");
    assert!(c.collect(1).is_err());
    // An empty tmpfs at /sys/fs/cgroup (no hierarchy mounted) is absent too.
    std::fs::create_dir_all(roots.sys("fs/cgroup/systemd")).unwrap();
    assert!(matches!(c.probe(), Availability::Absent(_)));
}

#[test]
fn validate_names_the_key() {
    let ok = CgroupsConfig::default();
    ok.validate().unwrap();
    let bad = CgroupsConfig {
        include: vec!["(".into()],
        ..ok.clone()
    };
    assert_eq!(
        bad.validate().unwrap_err().1,
        "collectors.cgroups.include = \"(\": not a regular expression: unclosed group"
    );
    let bad = CgroupsConfig {
        exclude: vec!["a".into(), "[z-a]".into()],
        ..ok.clone()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .1
        .starts_with("collectors.cgroups.exclude = \"[z-a]\": not a regular expression: "));
    let bad = CgroupsConfig {
        max_depth: 0,
        ..ok.clone()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .1
        .starts_with("collectors.cgroups.max_depth = 0"));
    let bad = CgroupsConfig {
        max_cgroups: 0,
        ..ok.clone()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .1
        .starts_with("collectors.cgroups.max_cgroups = 0"));
    let bad = CgroupsConfig {
        rescan_interval_secs: f64::NAN,
        ..ok
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .1
        .starts_with("collectors.cgroups.rescan_interval_secs = NaN"));
}

#[test]
fn broken_patterns_sample_nothing_and_say_so() {
    let config = CgroupsConfig {
        include: vec!["(".into()],
        ..CgroupsConfig::default()
    };
    let mut c = collector(&config, &fixture("k8s-node"));
    assert!(c.collect(1).unwrap().is_empty());
    assert!(c.problems()[0].starts_with("collectors.cgroups.include"));
}

#[test]
fn workload_kinds() {
    for (path, kind) in [
        ("/system.slice", "slice"),
        ("/system.slice/sshd.service", "service"),
        ("/system.slice/docker-0123456789ab.scope", "container"),
        ("/machine.slice/libpod-0123456789ab.scope", "container"),
        ("/machine.slice/libpod-conmon-0123456789ab.scope", "other"),
        ("/system.slice/crio-0123456789ab.scope", "container"),
        ("/docker/0123456789abcdef", "container"),
        ("/docker", "other"),
        ("/kubepods/burstable/pod1234-5678", "pod"),
        (
            "/kubepods/burstable/pod1234-5678/0123456789abcdef",
            "container",
        ),
        ("/kubepods/pod1234", "pod"),
        ("/kubepods.slice/kubepods-pod12_34.slice", "pod"),
        ("/kubepods.slice/kubepods-burstable.slice", "slice"),
        ("/slurm/uid_1000/job_12", "slurm_job"),
        ("/slurm/uid_1000/job_12/step_extern", "slurm_step"),
        ("/slurm/uid_1000", "other"),
        (
            "/system.slice/slurmstepd.scope/job_9/step_0/user/task_0",
            "slurm_step",
        ),
        ("/system.slice/slurmstepd.scope", "other"),
        ("/job_12", "other"),
        ("/user.slice/user-1000.slice/session-3.scope", "other"),
        ("/", "other"),
    ] {
        assert_eq!(classify(path), kind, "{path}");
    }
}

#[test]
fn a_file_the_kernel_refuses_is_absent_not_an_error() {
    use super::collector::{failed_read, FailedRead};
    use std::io::Error;
    let refused = Error::from_raw_os_error(libc::EOPNOTSUPP);
    // PSI off: the pressure file is listed and every read fails so.
    assert_eq!(failed_read(&refused, || false), FailedRead::Absent);
    let missing = Error::from_raw_os_error(libc::ENOENT);
    assert_eq!(failed_read(&missing, || true), FailedRead::Absent);
    assert_eq!(failed_read(&missing, || false), FailedRead::Gone);
    let removed = Error::from_raw_os_error(libc::ENODEV);
    assert_eq!(failed_read(&removed, || false), FailedRead::Gone);
    for fault in [libc::EACCES, libc::EIO, libc::EISDIR] {
        let e = Error::from_raw_os_error(fault);
        assert_eq!(failed_read(&e, || true), FailedRead::Error, "{e}");
    }
}

/// A cgroup named with bytes that are not UTF-8 cannot be a label: it and
/// the cgroups below it are left out, and the problems say so rather than
/// nothing.
#[test]
fn a_cgroup_whose_name_is_not_utf8_is_named_among_the_problems() {
    use std::os::unix::ffi::OsStrExt;
    let (_dir, roots) = scratch("k8s-node");
    let odd = roots
        .sys("fs/cgroup")
        .join(std::ffi::OsStr::from_bytes(b"x\xff\xfe"));
    std::fs::create_dir_all(odd.join("child")).unwrap();
    std::fs::write(odd.join("child/memory.current"), "4096\n").unwrap();
    let mut c = collector(&CgroupsConfig::default(), &roots);
    let batch = collect_one(&mut c, 1_000_000);
    assert!(!paths(&batch).iter().any(|p| p.contains("child")));
    assert!(
        c.problems()
            .iter()
            .any(|p| p.starts_with("1 cgroup directories have names that are not UTF-8")),
        "{:?}",
        c.problems()
    );
    assert_eq!(c.left_out(), 1, "vtax_collector_left_out");
}
