//! Tests of the module.

use super::*;
use std::path::PathBuf;
use vtax_store::batch::Values;
use vtax_store::Value;

const STAT: &str = "cpu  100 0 50 1000 5 1 2 30 0 0\n\
    cpu0 60 0 30 500 3 1 1 20 0 0\n\
    cpu1 40 0 20 500 2 0 1 10 0 0\n\
    intr 12345\nctxt 999\n";

#[test]
fn one_row_per_cpu_in_seconds() {
    let (batch, skipped) = parse(STAT, "stat", 7, 100.0).unwrap();
    assert!(skipped.is_empty());
    assert_eq!(batch.len(), 2);
    assert_eq!(batch.tags[0].dict, ["0", "1"]);
    let steal = CPU.field_index("steal_seconds").unwrap();
    assert_eq!(batch.fields[steal].values, Values::F64(vec![0.2, 0.1]));
}

#[test]
fn old_kernels_without_steal_leave_it_null() {
    let (batch, _) = parse("cpu0 1 2 3 4\n", "stat", 7, 100.0).unwrap();
    let steal = CPU.field_index("steal_seconds").unwrap();
    assert!(!batch.fields[steal].is_valid(0));
}

#[test]
fn garbage_names_the_file_and_line() {
    let err = parse("cpu0 1 2 x 4\n", "/proc/stat", 7, 100.0)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "/proc/stat:1: \"x\" is not a tick count");
    assert!(parse("intr 1\n", "/proc/stat", 7, 100.0).is_err());
}

/// One odd `cpuN` line (a new kernel's layout, a driver's garbage) costs that
/// CPU's row and is named; the other CPUs keep theirs, in both per-CPU files.
#[test]
fn one_bad_cpu_line_costs_only_its_cpu() {
    let stat = "cpu  1 2 3 4\ncpu0 60 0 30 500\ncpu1 40 x 20 500\ncpuX 1 2 3 4\ncpu2 7 0 1 9\n";
    let (batch, skipped) = parse(stat, "/proc/stat", 7, 100.0).unwrap();
    assert_eq!(batch.tags[0].dict, ["0", "2"]);
    let skipped: Vec<String> = skipped.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        skipped,
        [
            "/proc/stat:3: \"x\" is not a tick count",
            "/proc/stat:4: bad CPU number \"X\""
        ]
    );

    let schedstat = "version 15\ntimestamp 1\ncpu0 0 0 5 1 9 3 2000000000 500000000 77\n\
        cpu1 0 0 5 1 9 3 -1 250000000 66\ncpu2 0 0 5 1 9 3 1000000000 250000000 66\n";
    let (version, batch, skipped) = parse_schedstat(schedstat, "/proc/schedstat", 7).unwrap();
    assert_eq!(version, Schedstat::Read(15));
    assert_eq!(batch.unwrap().tags[0].dict, ["0", "2"]);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].line, 4);

    // Through `sample`: the rows are kept and the file is named once.
    let (dir, roots) = copy_of("vm-node", VM_FILES);
    let good = std::fs::read_to_string(dir.path().join("proc/stat")).unwrap();
    let bad = good.replacen("cpu1 ", "cpu1 x", 1);
    assert_ne!(good, bad, "the fixture has a cpu1 line");
    std::fs::write(dir.path().join("proc/stat"), bad).unwrap();
    let sample = sample(&roots, 7, 100.0).unwrap();
    let cpus = table(&sample, &CPU).unwrap();
    assert!(cpus.tags[0].dict.iter().any(|c| c == "0"));
    assert!(!cpus.tags[0].dict.iter().any(|c| c == "1"));
    assert_eq!(sample.errors.len(), 1, "{:?}", sample.errors);
    assert!(table(&sample, &KERNEL).is_some(), "the kernel lines are read");
}

// ---- helpers ----

fn fixture(node: &str) -> Roots {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    Roots {
        procfs: base.join(node).join("proc"),
        sysfs: base.join(node).join("sys"),
        ..Roots::default()
    }
}

fn table<'a>(sample: &'a Sample, table: &TableDef) -> Option<&'a Batch> {
    sample.batches.iter().find(|b| b.table.name == table.name)
}

/// The value of `field` in the row whose first tag is `tag` (or row 0 for
/// untagged tables); `None` when null.
fn value(batch: &Batch, tag: Option<&str>, field: &str) -> Option<Value> {
    let row = match tag {
        None => 0,
        Some(tag) => {
            let column = &batch.tags[0];
            let code = column.dict.iter().position(|d| d == tag)? as u32;
            column.codes.iter().position(|&c| c == code)?
        }
    };
    let f = batch.table.field_index(field).expect("known field");
    let column = &batch.fields[f];
    if !column.is_valid(row) {
        return None;
    }
    Some(match &column.values {
        Values::F64(v) => Value::F64(v[row]),
        Values::I64(v) => Value::I64(v[row]),
        Values::U64(v) => Value::U64(v[row]),
    })
}

fn f64_of(batch: &Batch, tag: Option<&str>, field: &str) -> f64 {
    match value(batch, tag, field) {
        Some(Value::F64(x)) => x,
        other => panic!("{field}: {other:?}"),
    }
}

fn u64_of(batch: &Batch, tag: Option<&str>, field: &str) -> u64 {
    match value(batch, tag, field) {
        Some(Value::U64(x)) => x,
        other => panic!("{field}: {other:?}"),
    }
}

/// A procfs tree in a tempdir holding copies of `node`'s host files.
fn copy_of(node: &str, files: &[&str]) -> (tempfile::TempDir, Roots) {
    let dir = tempfile::tempdir().unwrap();
    let from = fixture(node).procfs;
    for file in files {
        let to = dir.path().join("proc").join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from.join(file), &to).unwrap();
    }
    let roots = Roots {
        procfs: dir.path().join("proc"),
        sysfs: dir.path().join("sys"),
        ..Roots::default()
    };
    (dir, roots)
}

const VM_FILES: &[&str] = &[
    "stat",
    "loadavg",
    "meminfo",
    "pressure/cpu",
    "pressure/memory",
    "pressure/io",
];

// ---- declarations ----

#[test]
fn tables_are_valid_and_unique() {
    vtax_store::Catalog::new(TABLES).unwrap();
    // Each source fills a field of its own, every field has a source,
    // and a kB key fills a bytes field.
    let filled = |table: &'static TableDef, push: &dyn Fn(&mut BatchBuilder)| {
        let mut rows = BatchBuilder::new(table);
        push(&mut rows);
        let batch = rows.finish();
        let filled: Vec<usize> = (0..table.fields.len())
            .filter(|&i| batch.fields[i].is_valid(0))
            .collect();
        assert_eq!(filled.len(), 1, "{}: {filled:?}", table.name);
        &table.fields[filled[0]]
    };
    let mut seen = std::collections::HashSet::new();
    for (key, unit, field) in MEMINFO {
        let def = filled(&MEMORY, &|rows| {
            let mut row = MemoryRow::default();
            *field(&mut row) = Some(1);
            rows.push_row(0, &row).unwrap();
        });
        assert!(seen.insert(def.name), "{key} fills {} again", def.name);
        let bytes = def.unit == Unit::Bytes;
        assert_eq!(bytes, *unit == MemUnit::KiB, "{key} -> {}", def.name);
    }
    assert_eq!(seen.len(), MEMORY.fields.len());
    for key in MEMINFO_REQUIRED {
        assert!(MEMINFO.iter().any(|(k, _, _)| k == key));
    }
    let mut seen = std::collections::HashSet::new();
    for (key, _, field) in STAT_KEYS {
        let def = filled(&KERNEL, &|rows| {
            let mut row = KernelRow::default();
            *field(&mut row) = Some(1);
            rows.push_row(0, &row).unwrap();
        });
        assert!(seen.insert(def.name), "{key} fills {} again", def.name);
    }
    assert_eq!(seen.len(), KERNEL.fields.len());
}

// ---- fixtures ----

#[test]
fn vm_node_fixture() {
    let sample = sample(&fixture("vm-node"), 7, 100.0).unwrap();

    let cpu = table(&sample, &CPU).unwrap();
    assert_eq!(cpu.len(), 2);
    assert!(cpu.time_us.iter().all(|&t| t == 7));
    assert_eq!(f64_of(cpu, Some("0"), "user_seconds"), 286839.0 / 100.0);
    assert_eq!(f64_of(cpu, Some("1"), "steal_seconds"), 554.0 / 100.0);
    assert_eq!(f64_of(cpu, Some("1"), "iowait_seconds"), 5121.0 / 100.0);

    let kernel = table(&sample, &KERNEL).unwrap();
    assert_eq!(u64_of(kernel, None, "context_switches"), 39801158);
    assert_eq!(u64_of(kernel, None, "interrupts"), 10114051);
    assert_eq!(u64_of(kernel, None, "softirqs"), 2926486);
    assert_eq!(u64_of(kernel, None, "forks"), 132112);
    assert_eq!(u64_of(kernel, None, "procs_running"), 3);
    assert_eq!(u64_of(kernel, None, "procs_blocked"), 0);
    assert_eq!(u64_of(kernel, None, "boot_time_seconds"), 1795257729);

    let pressure = table(&sample, &PRESSURE).unwrap();
    assert_eq!(pressure.tags[0].dict, ["cpu", "memory", "io"]);
    assert_eq!(
        f64_of(pressure, Some("cpu"), "some_stalled_seconds"),
        538397385.0 / 1e6
    );
    assert_eq!(
        f64_of(pressure, Some("cpu"), "some_avg10_ratio"),
        2.85 / 100.0
    );
    assert_eq!(
        f64_of(pressure, Some("io"), "full_stalled_seconds"),
        46094966.0 / 1e6
    );
    assert_eq!(
        f64_of(pressure, Some("io"), "full_avg10_ratio"),
        0.02 / 100.0
    );
    assert_eq!(
        f64_of(pressure, Some("memory"), "full_stalled_seconds"),
        0.0
    );

    let load = table(&sample, &LOAD).unwrap();
    assert_eq!(f64_of(load, None, "load1"), 0.55);
    assert_eq!(f64_of(load, None, "load5"), 1.04);
    assert_eq!(f64_of(load, None, "load15"), 1.27);
    assert_eq!(u64_of(load, None, "runnable_tasks"), 3);
    assert_eq!(u64_of(load, None, "tasks"), 105);

    let memory = table(&sample, &MEMORY).unwrap();
    assert_eq!(u64_of(memory, None, "total_bytes"), 24682416 * 1024);
    assert_eq!(u64_of(memory, None, "available_bytes"), 23811616 * 1024);
    assert_eq!(u64_of(memory, None, "dirty_bytes"), 43740 * 1024);
    assert_eq!(u64_of(memory, None, "swap_total_bytes"), 0);
    assert_eq!(u64_of(memory, None, "huge_pages"), 0);
    assert_eq!(u64_of(memory, None, "huge_page_size_bytes"), 2048 * 1024);

    // This VM's kernel has no CONFIG_SCHEDSTATS.
    assert!(table(&sample, &CPU_SCHED).is_none());
    assert_eq!(
        sample.summary(),
        "2 CPUs; pressure: cpu memory io; schedstat: none"
    );
    assert_eq!(sample.problems.len(), 1, "{:?}", sample.problems);
    assert!(sample.problems[0].contains("CONFIG_SCHEDSTATS"));
}

#[test]
fn baremetal_node_fixture() {
    let sample = sample(&fixture("baremetal-node"), 7, 100.0).unwrap();
    assert!(sample.problems.is_empty(), "{:?}", sample.problems);
    assert_eq!(
        sample.summary(),
        "8 CPUs; pressure: cpu memory io; schedstat v15"
    );

    let cpu = table(&sample, &CPU).unwrap();
    assert_eq!(cpu.len(), 8);
    for n in 0..8 {
        assert_eq!(f64_of(cpu, Some(&n.to_string()), "steal_seconds"), 0.0);
    }
    assert_eq!(f64_of(cpu, Some("7"), "user_seconds"), 44641969.0 / 100.0);
    assert_eq!(f64_of(cpu, Some("0"), "softirq_seconds"), 910000.0 / 100.0);

    let kernel = table(&sample, &KERNEL).unwrap();
    assert_eq!(u64_of(kernel, None, "context_switches"), 48213377104);
    assert_eq!(u64_of(kernel, None, "interrupts"), 9876543210);
    assert_eq!(u64_of(kernel, None, "softirqs"), 3456789012);
    assert_eq!(u64_of(kernel, None, "forks"), 61234567);
    assert_eq!(u64_of(kernel, None, "procs_running"), 9);
    assert_eq!(u64_of(kernel, None, "procs_blocked"), 2);
    assert_eq!(u64_of(kernel, None, "boot_time_seconds"), 1794048000);

    // Linux 5.15: no irq pressure (Linux 6.1 and later).
    let pressure = table(&sample, &PRESSURE).unwrap();
    assert_eq!(pressure.tags[0].dict, ["cpu", "memory", "io"]);
    assert_eq!(
        f64_of(pressure, Some("cpu"), "some_stalled_seconds"),
        98765432109.0 / 1e6
    );
    assert_eq!(
        f64_of(pressure, Some("cpu"), "some_avg10_ratio"),
        12.34 / 100.0
    );
    assert_eq!(f64_of(pressure, Some("cpu"), "full_stalled_seconds"), 0.0);
    assert_eq!(
        f64_of(pressure, Some("memory"), "full_avg10_ratio"),
        0.25 / 100.0
    );

    let load = table(&sample, &LOAD).unwrap();
    assert_eq!(f64_of(load, None, "load1"), 7.42);
    assert_eq!(u64_of(load, None, "runnable_tasks"), 9);
    assert_eq!(u64_of(load, None, "tasks"), 1843);

    let memory = table(&sample, &MEMORY).unwrap();
    assert_eq!(u64_of(memory, None, "total_bytes"), 65842688 * 1024);
    assert_eq!(u64_of(memory, None, "swap_free_bytes"), 8126460 * 1024);
    assert_eq!(u64_of(memory, None, "mlocked_bytes"), 4190208 * 1024);
    assert_eq!(u64_of(memory, None, "huge_pages"), 4096);
    assert_eq!(u64_of(memory, None, "huge_pages_free"), 1024);
    assert_eq!(u64_of(memory, None, "huge_pages_reserved"), 512);
    assert_eq!(u64_of(memory, None, "huge_pages_surplus"), 0);
    assert_eq!(u64_of(memory, None, "hugetlb_bytes"), 8388608 * 1024);

    let sched = table(&sample, &CPU_SCHED).unwrap();
    assert_eq!(sched.len(), 8);
    assert_eq!(
        f64_of(sched, Some("3"), "run_delay_seconds"),
        (9_876_543_210_987u64 + 3 * 1_000_000_007) as f64 / 1e9
    );
    assert_eq!(
        f64_of(sched, Some("0"), "running_seconds"),
        362_345_678_901_234.0 / 1e9
    );
    assert_eq!(
        u64_of(sched, Some("7"), "timeslices"),
        2_345_678_901 + 7 * 12_345
    );
}

#[test]
fn collector_probes_and_collects_through_roots() {
    let mut host = Host::new(&HostConfig::default(), &fixture("baremetal-node"));
    host.hz = 100.0;
    assert_eq!(
        host.probe(),
        Availability::Available("8 CPUs; pressure: cpu memory io; schedstat v15".into())
    );
    let batches = host.collect(42).unwrap();
    assert_eq!(batches.len(), TABLES.len());
    assert!(batches.iter().all(|b| b.time_us.iter().all(|&t| t == 42)));
    assert!(host.problems().is_empty());

    let mut nowhere = Host::new(
        &HostConfig::default(),
        &Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        },
    );
    match nowhere.probe() {
        Availability::Absent(reason) => assert!(reason.contains("/nonexistent/proc/stat")),
        other => panic!("{other:?}"),
    }
    assert!(nowhere.collect(1).is_err());
}

#[test]
fn a_kernel_without_pressure_or_schedstat_is_not_a_failure() {
    let (_dir, roots) = copy_of("vm-node", &["stat", "loadavg", "meminfo"]);
    let sample = sample(&roots, 7, 100.0).unwrap();
    assert!(table(&sample, &PRESSURE).is_none());
    assert!(table(&sample, &CPU_SCHED).is_none());
    assert_eq!(sample.summary(), "2 CPUs; pressure: none; schedstat: none");
    assert_eq!(sample.problems.len(), 2, "{:?}", sample.problems);
    assert!(sample.problems[0].contains("psi=0"));
    assert!(sample.problems[1].contains("CONFIG_SCHEDSTATS"));
}

#[test]
fn schedstat_versions() {
    // Version 17 names the domain in its domain lines; cpu lines are unchanged.
    let v17 = "version 17\ntimestamp 4295\n\
        cpu0 0 0 5 1 9 3 2000000000 500000000 77\n\
        domain0 MC 03 1 2 3\n\
        cpu1 0 0 5 1 9 3 1000000000 250000000 66\n";
    let (version, batch, _) = parse_schedstat(v17, "schedstat", 7).unwrap();
    assert_eq!(version, Schedstat::Read(17));
    let batch = batch.unwrap();
    assert_eq!(f64_of(&batch, Some("0"), "running_seconds"), 2.0);
    assert_eq!(f64_of(&batch, Some("1"), "run_delay_seconds"), 0.25);
    assert_eq!(u64_of(&batch, Some("1"), "timeslices"), 66);

    // Version 14 had three more yield counters in front: not read, reported.
    let v14 = "version 14\ntimestamp 1\ncpu0 0 0 0 0 0 0 0 0 0 1 2 3\n";
    assert_eq!(
        parse_schedstat(v14, "schedstat", 7).unwrap(),
        (Schedstat::Unsupported(14), None, Vec::new())
    );
    let (dir, roots) = copy_of("vm-node", VM_FILES);
    std::fs::write(dir.path().join("proc/schedstat"), v14).unwrap();
    let sample = sample(&roots, 7, 100.0).unwrap();
    assert!(table(&sample, &CPU_SCHED).is_none());
    assert!(sample.summary().ends_with("schedstat: v14 unsupported"));
    assert!(
        sample.problems[0].contains("version 14"),
        "{:?}",
        sample.problems
    );

    for bad in [
        "",
        "timestamp 1\ncpu0 1\n",
        "version x\n",
        "version 15\ntimestamp 1\n",
    ] {
        assert!(parse_schedstat(bad, "schedstat", 7).is_err(), "{bad:?}");
    }
}

#[test]
fn pressure_lines() {
    // cpu before Linux 5.13: only `some`.
    let row = parse_pressure(
        "some avg10=1.00 avg60=0.50 avg300=0.25 total=1500000\n",
        "cpu",
        "cpu",
    )
    .unwrap();
    let expected = PressureRow {
        resource: "cpu",
        some_stalled_seconds: Some(1.5),
        full_stalled_seconds: None,
        some_avg10_ratio: Some(0.01),
        full_avg10_ratio: None,
    };
    assert_eq!(row, expected);
}

#[test]
fn irq_pressure_where_the_kernel_has_it() {
    // Linux 6.1+ with CONFIG_IRQ_TIME_ACCOUNTING: irq has only a `full` line.
    let (dir, roots) = copy_of(
        "baremetal-node",
        &[
            "stat",
            "loadavg",
            "meminfo",
            "schedstat",
            "pressure/cpu",
            "pressure/memory",
            "pressure/io",
        ],
    );
    std::fs::write(
        dir.path().join("proc/pressure/irq"),
        "full avg10=0.07 avg60=0.05 avg300=0.04 total=456789012\n",
    )
    .unwrap();
    let sample = sample(&roots, 7, 100.0).unwrap();
    assert_eq!(
        sample.summary(),
        "8 CPUs; pressure: cpu memory io irq; schedstat v15"
    );
    let pressure = table(&sample, &PRESSURE).unwrap();
    assert_eq!(pressure.tags[0].dict, ["cpu", "memory", "io", "irq"]);
    assert_eq!(
        f64_of(pressure, Some("irq"), "full_stalled_seconds"),
        456789012.0 / 1e6
    );
    assert_eq!(
        f64_of(pressure, Some("irq"), "full_avg10_ratio"),
        0.07 / 100.0
    );
    assert_eq!(value(pressure, Some("irq"), "some_stalled_seconds"), None);
    assert_eq!(value(pressure, Some("irq"), "some_avg10_ratio"), None);
}

// ---- garbage ----

/// Writes `content` over `file` in a copy of the vm-node tree and checks
/// that the read names the file (and the line) in its one error, and
/// that the file costs only its own rows: every other table is there,
/// the CPU rows with their steal time unless the CPU lines are the bad ones.
fn assert_garbage(file: &str, content: &str, want: &str) {
    let (dir, roots) = copy_of("vm-node", VM_FILES);
    let path = dir.path().join("proc").join(file);
    std::fs::write(&path, content).unwrap();
    let sample = sample(&roots, 7, 100.0)
        .unwrap_or_else(|e| panic!("{file} {content:?}: the whole read failed: {e}"));
    let errors: Vec<String> = sample.errors.iter().map(ToString::to_string).collect();
    let expected = format!("{}{want}", path.display());
    assert!(
        errors.len() == 1 && errors[0].starts_with(&expected),
        "{file} {content:?}: {errors:?} is not one error starting with {expected:?}"
    );
    let from_file: &[&TableDef] = match file {
        "stat" => &[&CPU, &KERNEL],
        "loadavg" => &[&LOAD],
        "meminfo" => &[&MEMORY],
        "schedstat" => &[&CPU_SCHED],
        _ => &[],
    };
    for def in [&CPU, &KERNEL, &LOAD, &MEMORY, &PRESSURE] {
        if !from_file.iter().any(|d| d.name == def.name) {
            assert!(
                table(&sample, def).is_some(),
                "{file} {content:?}: no {} rows",
                def.name
            );
        }
    }
    if let Some(resource) = file.strip_prefix("pressure/") {
        let pressure = table(&sample, &PRESSURE).unwrap();
        assert!(!pressure.tags[0].dict.iter().any(|r| r == resource));
        assert_eq!(pressure.len(), 2, "the other two resources' rows");
    }
    if file != "stat" {
        assert_eq!(
            f64_of(table(&sample, &CPU).unwrap(), Some("1"), "steal_seconds"),
            554.0 / 100.0
        );
    }
}

/// An empty `pressure/cpu`, junk in `meminfo` or in `loadavg` on the
/// bare-metal tree: the CPU rows (steal included) and every other
/// table's rows are still written, the collector's tick succeeds, and
/// the bad file is its one source error until it mends.
#[test]
fn one_bad_file_costs_only_its_own_rows() {
    let files = [
        "stat",
        "loadavg",
        "meminfo",
        "schedstat",
        "pressure/cpu",
        "pressure/memory",
        "pressure/io",
    ];
    let damage = [
        ("pressure/cpu", "", PRESSURE.name),
        ("meminfo", "MemTotal: junk kB\nMemFree: 1 kB\n", MEMORY.name),
        ("loadavg", "0.5 zz\n", LOAD.name),
    ];
    for (file, junk, lost) in damage {
        let (dir, roots) = copy_of("baremetal-node", &files);
        let path = dir.path().join("proc").join(file);
        let good = std::fs::read(&path).unwrap();
        let mut host = Host::new(&HostConfig::default(), &roots);
        host.hz = 100.0;
        std::fs::write(&path, junk).unwrap();
        assert!(matches!(host.probe(), Availability::Available(_)), "{file}");
        let batches = host.collect(42).unwrap();
        let names: Vec<&str> = batches.iter().map(|b| b.table.name).collect();
        let cpu = batches.iter().find(|b| b.table.name == "cpu").unwrap();
        assert_eq!(cpu.len(), 8, "{file}");
        assert_eq!(f64_of(cpu, Some("7"), "steal_seconds"), 0.0, "{file}");
        for def in TABLES {
            let pressure_row_left = def.name == "pressure" && file == "pressure/cpu";
            assert_eq!(
                names.contains(&def.name),
                def.name != lost || pressure_row_left,
                "{file}: {names:?}"
            );
        }
        if file == "pressure/cpu" {
            let pressure = batches.iter().find(|b| b.table.name == "pressure").unwrap();
            assert_eq!(pressure.tags[0].dict, ["memory", "io"]);
        }
        let errors = host.source_errors();
        assert_eq!(errors.len(), 1, "{file}: {errors:?}");
        assert_eq!(errors[0].path, path.display().to_string());

        std::fs::write(&path, good).unwrap();
        assert_eq!(host.collect(43).unwrap().len(), TABLES.len(), "{file}");
        assert!(host.source_errors().is_empty(), "{file} mended");
    }
}

/// Only when no file gives a row does the tick fail, and the probe then
/// says the source reads badly rather than that it is absent.
#[test]
fn every_file_bad_fails_the_tick_and_the_probe() {
    let (dir, roots) = copy_of("vm-node", VM_FILES);
    for file in VM_FILES {
        std::fs::write(dir.path().join("proc").join(file), "junk\n").unwrap();
    }
    let mut host = Host::new(&HostConfig::default(), &roots);
    match host.probe() {
        Availability::Failed(error) => {
            assert!(error.ends_with("proc/stat: no per-CPU lines"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert!(host.collect(1).is_err());
}

#[test]
fn truncated_lines_fail_naming_file_and_line() {
    assert_garbage(
        "stat",
        "cpu  1 2 3 4\ncpu0 1 2\n",
        ":2: fewer than 4 columns",
    );
    assert_garbage("stat", "cpu0 1 2 3 4\nctxt\n", ":2: ctxt has no value");
    assert_garbage("loadavg", "0.55 1.04\n", ":1: truncated: no load15");
    assert_garbage(
        "loadavg",
        "0.55 1.04 1.27 3\n",
        ":1: \"3\" is not runnable/total",
    );
    assert_garbage("meminfo", "MemTotal:       24682416 kB\nMemFr", ":2: ");
    assert_garbage("meminfo", "MemTotal:\n", ":1: MemTotal: no value");
    assert_garbage(
        "pressure/cpu",
        "some avg10=4.50 avg60=3.74 avg300=3.71 total=537802659\nfull avg10=0.00 avg6",
        ":2: \"avg6\" is not key=value",
    );
    assert_garbage(
        "pressure/io",
        "some avg10=4.50 avg60=3.74\n",
        ":1: some line has no total=",
    );
    assert_garbage(
        "schedstat",
        "version 15\ntimestamp 1\ncpu0 0 0 1 2 3 4 5\n",
        ":3: 7 counters",
    );
}

#[test]
fn non_numbers_fail_naming_file_and_line() {
    assert_garbage("stat", "cpu0 1 2 3 4\ncpuX 1 2 3 4\n", ":2: bad CPU number");
    let stat = std::fs::read_to_string(fixture("vm-node").proc("stat")).unwrap();
    assert_garbage(
        "stat",
        &stat.replace("procs_running 3", "procs_running three"),
        ":8: \"three\" is not a count",
    );
    assert_garbage(
        "loadavg",
        "0.55 NaN 1.27 3/105 2265\n",
        ":1: \"NaN\" is not a load average",
    );
    assert_garbage(
        "loadavg",
        "0.55 1.04 1.27 3/-1 2265\n",
        ":1: \"-1\" is not a task count",
    );
    assert_garbage(
        "meminfo",
        "MemTotal:       2468x416 kB\n",
        ":1: MemTotal: \"2468x416\" is not a number",
    );
    assert_garbage(
        "meminfo",
        "MemTotal:       1 MB\n",
        ":1: MemTotal: unknown unit",
    );
    assert_garbage("meminfo", "MemTotal:       1\n", ":1: MemTotal: no kB unit");
    assert_garbage(
        "pressure/memory",
        "some avg10=inf avg60=0.00 avg300=0.00 total=0\n",
        ":1: \"inf\" is not a percentage",
    );
    assert_garbage(
        "pressure/memory",
        "partial avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        ":1: \"partial\" is neither some nor full",
    );
    assert_garbage(
        "schedstat",
        "version 16\ntimestamp 1\ncpu0 0 0 0 0 0 0 1 x 1\n",
        ":3: \"x\" is not a counter",
    );
    assert_garbage(
        "schedstat",
        "version sixteen\n",
        ":1: \"sixteen\" is not a version",
    );
    assert_garbage(
        "schedstat",
        "timestamp 1\n",
        ":1: \"timestamp 1\" is not 'version N'",
    );
}

#[test]
fn overflows_fail_naming_file_and_line() {
    let huge = "18446744073709551616"; // u64::MAX + 1
    assert_garbage(
        "stat",
        &format!("cpu0 1 2 3 {huge}\n"),
        &format!(":1: \"{huge}\" overflows a 64-bit tick count"),
    );
    assert_garbage(
        "loadavg",
        &format!("0.1 0.2 0.3 1/{huge} 5\n"),
        ":1: \"18446744073709551616\" overflows",
    );
    // Fits in kB, not in bytes.
    assert_garbage(
        "meminfo",
        "MemTotal:       18446744073709551615 kB\n",
        ":1: MemTotal: 18446744073709551615 kB overflows",
    );
    assert_garbage(
        "pressure/cpu",
        &format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={huge}\n"),
        ":1: \"18446744073709551616\" overflows a 64-bit microsecond count",
    );
    assert_garbage(
        "schedstat",
        &format!("version 15\ncpu0 0 0 0 0 0 0 {huge} 1 1\n"),
        ":2: \"18446744073709551616\" overflows",
    );
    assert_garbage("schedstat", "version 99999999999\n", ":1: ");
}

/// A `/proc/meminfo` line vtax does not store is not read (a new kernel's
/// key, an odd unit): node_exporter keeps every series there, and so does
/// vtax. A stored line that does not read
/// costs its own field and is named.
#[test]
fn an_odd_meminfo_line_costs_at_most_its_own_field() {
    let text = "MemTotal:       24682416 kB\nMemFree:        1000 kB\n\
        Committed_AS:   18446744073709551615 kB\nDirectMap4k:    -1 kB\n\
        NewKey:         7 pages\nCached:         12x kB\nBuffers:        5 kB\n";
    let (batch, skipped) = parse_meminfo(text, "/proc/meminfo", 7).unwrap();
    assert_eq!(value(&batch, None, "total_bytes"), Some(Value::U64(24682416 * 1024)));
    assert_eq!(value(&batch, None, "buffers_bytes"), Some(Value::U64(5 * 1024)));
    assert_eq!(value(&batch, None, "cached_bytes"), None);
    let skipped: Vec<String> = skipped.iter().map(|e| e.to_string()).collect();
    // An underflowed Committed_AS (old kernels) is no figure: left null.
    assert_eq!(
        skipped,
        [
            "/proc/meminfo:3: Committed_AS: 18446744073709551615 kB overflows 64 bits in bytes",
            "/proc/meminfo:6: Cached: \"12x\" is not a number"
        ]
    );
}

/// An unreadable `/proc/stat` at the start (a directory here) costs its own
/// rows, as after the start, not the whole collector.
#[test]
fn an_unreadable_stat_at_start_costs_only_its_rows() {
    let (dir, roots) = copy_of("vm-node", VM_FILES);
    let stat = dir.path().join("proc/stat");
    std::fs::remove_file(&stat).unwrap();
    std::fs::create_dir(&stat).unwrap();
    let mut host = Host::new(&HostConfig::default(), &roots);
    assert!(matches!(host.probe(), Availability::Available(_)));
    let batches = host.collect(7).unwrap();
    assert!(batches.iter().any(|b| b.table.name == MEMORY.name));
    assert!(!batches.iter().any(|b| b.table.name == CPU.name));
    assert_eq!(host.source_errors().len(), 1);
}

#[test]
fn empty_files_fail_naming_the_file() {
    assert_garbage("stat", "", ": no per-CPU lines");
    assert_garbage("loadavg", "", ":1: truncated: no load1");
    assert_garbage("meminfo", "", ": no MemTotal line");
    assert_garbage("pressure/io", "", ": no some or full line");
    assert_garbage("schedstat", "", ": no version line");
    // /proc/stat with CPUs but none of the kernel lines.
    assert_garbage("stat", "cpu0 1 2 3 4\n", ": no ctxt line");
}

/// Every prefix of every fixture file parses or fails, never panics.
#[test]
fn truncation_at_every_byte_never_panics() {
    for node in ["vm-node", "baremetal-node"] {
        let procfs = fixture(node).procfs;
        let read = |f: &str| std::fs::read_to_string(procfs.join(f)).ok();
        type Parses = dyn Fn(&str) -> bool;
        let parsers: [(&str, &Parses); 8] = [
            ("stat", &|t| parse(t, "p", 0, 100.0).is_ok()),
            ("stat", &|t| parse_kernel(t, "p", 0).is_ok()),
            ("loadavg", &|t| parse_loadavg(t, "p", 0).is_ok()),
            ("meminfo", &|t| parse_meminfo(t, "p", 0).is_ok()),
            ("pressure/cpu", &|t| parse_pressure(t, "p", "cpu").is_ok()),
            ("pressure/io", &|t| parse_pressure(t, "p", "io").is_ok()),
            ("pressure/memory", &|t| {
                parse_pressure(t, "p", "memory").is_ok()
            }),
            ("schedstat", &|t| parse_schedstat(t, "p", 0).is_ok()),
        ];
        for (file, parser) in parsers {
            let Some(text) = read(file) else {
                continue;
            };
            assert!(parser(&text), "{node}/{file} as a whole");
            for end in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
                let _ = parser(&text[..end]);
            }
        }
    }
}
