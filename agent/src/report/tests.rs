//! The report over real stores written by the store crate: what it reads,
//! what it concludes, and that every section has its plot.

use std::path::Path;

use vtax_store::{BatchBuilder, Catalog, Store, StoreOptions, Value};

use super::*;

/// The agent's catalogue, which holds the detector's `neighbor_events`.
fn catalog_with_events() -> Catalog {
    crate::catalog()
}

/// Start of the test data: 2025-11-21T10:00:00Z.
const T0: i64 = 1_763_719_200_000_000;
const SECOND: i64 = 1_000_000;

/// Appends rows to `table`: tags in declaration order, the named fields, null
/// for the others.
/// A row to push: time, tags, named field values.
type TestRow<'a> = (i64, Vec<&'a str>, Vec<(&'a str, Value)>);

fn push(store: &mut Store, table: &str, rows: &[TestRow]) -> vtax_store::Batch {
    let def = store.catalog().get(table).unwrap();
    let mut builder = BatchBuilder::new(def);
    for (t, tags, fields) in rows {
        let values: Vec<Value> = def
            .fields
            .iter()
            .map(|f| {
                fields
                    .iter()
                    .find(|(n, _)| *n == f.name)
                    .map_or(Value::Null, |(_, v)| *v)
            })
            .collect();
        builder.push(*t, tags, &values).unwrap();
    }
    let batch = builder.finish();
    store.append(&batch).unwrap();
    batch
}

/// A node's store: 2 GPUs, 2 CPUs, 60 s; steal grows 0.1 s/s per CPU;
/// `events` adds a detector event seen open then closed, and one still open.
fn write_node(dir: &Path, node: &str, utilization: f64, events: bool) {
    let mut options = StoreOptions::new(dir);
    options.node = node.into();
    let catalog = if events {
        catalog_with_events()
    } else {
        crate::catalog()
    };
    let mut store = Store::open(options, catalog).unwrap();
    let platform = vec![
        "vm",
        "kvm",
        "none",
        "QEMU Standard PC",
        "6.1.0",
        "on",
        "none",
        "none",
        "550.54",
        "EPYC",
    ];
    // The verdict comes from the real detector fed this node's facts, as in
    // a running agent.
    let mut detector = crate::detect::Detector::new(crate::detect::DetectConfig {
        cache_canary: false,
        ..Default::default()
    });
    detector.observe(&push(
        &mut store,
        "platform_host",
        &[(T0, platform, vec![("info", Value::I64(1))])],
    ));
    // One `gpu` batch per tick holds every GPU, as the collector writes it.
    let uuids = ["GPU-0", "GPU-1"];
    let mut gpu_rows = Vec::new();
    for (g, uuid) in ["0", "1"].into_iter().zip(uuids) {
        let info = vec![
            g,
            uuid,
            "NVIDIA H100 80GB HBM3",
            "00000000:18:00.0",
            "hopper",
            "passthrough",
            "off",
            "550.54",
            "nvml",
        ];
        detector.observe(&push(
            &mut store,
            "gpu_info",
            &[(T0, info, vec![("info", Value::U64(1))])],
        ));
        gpu_rows.extend((0..60).map(|s| {
            (
                T0 + s * SECOND,
                vec![g, uuid],
                vec![
                    ("utilization_ratio", Value::F64(utilization)),
                    ("hbm_bytes_per_second", Value::F64(1e12)),
                    ("hbm_peak_bytes_per_second", Value::F64(4e12)),
                    ("nvlink_total_rx_bytes_per_second", Value::F64(90e9)),
                    ("nvlink_total_tx_bytes_per_second", Value::F64(90e9)),
                    ("nvlink_links_up", Value::U64(18)),
                    ("nvlink_links_product", Value::U64(18)),
                    ("nvlink_peak_bytes_per_second", Value::F64(900e9)),
                ],
            )
        }));
    }
    gpu_rows.sort_by_key(|r| r.0);
    detector.observe(&push(&mut store, "gpu", &gpu_rows));
    // Running since before T0: the rows at T0 measure the second before it.
    detector.tick(T0 - 10 * SECOND);
    for batch in detector.tick(T0 + 60 * SECOND) {
        if batch.table.name == "platform" {
            store.append(&batch).unwrap();
        }
    }
    for cpu in ["0", "1"] {
        let rows: Vec<_> = (0..60)
            .map(|s| {
                (
                    T0 + s * SECOND,
                    vec![cpu],
                    vec![("steal_seconds", Value::F64(100.0 + 0.1 * s as f64))],
                )
            })
            .collect();
        push(&mut store, "cpu", &rows);
        // Windows of 10 s: p99 grows with the window; the cumulative histogram
        // gains 90 wake-ups under 10 µs and 10 under 100 µs per window.
        let windows: Vec<_> = (1..=6)
            .map(|w| {
                (
                    T0 + w * 10 * SECOND,
                    vec![cpu],
                    vec![
                        ("wakeup_p50_seconds", Value::F64(5e-6)),
                        ("wakeup_p99_seconds", Value::F64(w as f64 * 1e-5)),
                        ("wakeup_max_seconds", Value::F64(2e-4)),
                        ("steal_ratio", Value::F64(0.02)),
                        ("unexplained_ratio", Value::F64(0.01)),
                    ],
                )
            })
            .collect();
        push(&mut store, "jitter", &windows);
        for w in 0..=6i64 {
            let rows: Vec<_> = [("1e-05", 90.0), ("0.0001", 100.0), ("+Inf", 100.0)]
                .iter()
                .map(|(le, per_window)| {
                    (
                        T0 + w * 10 * SECOND,
                        vec![cpu, *le],
                        vec![(
                            "latency_seconds",
                            Value::U64((per_window * w as f64) as u64),
                        )],
                    )
                })
                .collect();
            push(&mut store, "jitter_wakeup", &rows);
        }
    }
    if events {
        let event = |t: i64, state: &'static str, end: f64| {
            (
                t,
                // The detector's tag order: resource, victim, signal, state,
                // suspects, evidence.
                vec![
                    "cpu",
                    "jitter",
                    "wakeup_p99_seconds",
                    state,
                    "cgroup:/batch.slice",
                    "corr 0.9",
                ],
                vec![
                    ("start_time_seconds", Value::F64((T0 / SECOND + 10) as f64)),
                    ("end_time_seconds", Value::F64(end)),
                    ("score", Value::F64(4.5)),
                    ("top_correlation", Value::F64(0.9)),
                    ("effect_size", Value::F64(2.0)),
                ],
            )
        };
        let mut rows = vec![
            event(T0 + 20 * SECOND, "open", 0.0),
            event(T0 + 40 * SECOND, "closed", (T0 / SECOND + 35) as f64),
        ];
        let mut other = event(T0 + 50 * SECOND, "open", 0.0);
        other.1[0] = "memory_bandwidth";
        other.2[0] = ("start_time_seconds", Value::F64((T0 / SECOND + 45) as f64));
        rows.push(other);
        push(&mut store, "neighbor_events", &rows);
    }
    store.close().unwrap();
}

fn context(dir: &Path, fleet: bool, events_known: bool) -> Page<'_> {
    Page {
        source: dir,
        fleet,
        from_us: None,
        until_us: None,
        generated_us: T0,
        max_points: 20,
        events_known,
    }
}

#[test]
fn a_node_report_shapes_gpu_steal_jitter_and_events() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "unit_node", 0.75, true);
    let catalog = catalog_with_events();
    let source = Source::open(dir.path()).unwrap();
    assert_eq!(
        source.nodes(),
        ["unit_node"],
        "the node comes from the file names"
    );
    let data = load(&source, &catalog, None, None, false).unwrap();
    let s = summarize(&data[0]);

    assert_eq!(
        s.verdict, "VM with GPU passthrough (kvm)",
        "{:?}",
        s.evidence
    );
    assert!(
        s.evidence
            .contains(&("NVLink links up".into(), "36 of 36".into())),
        "{:?}",
        s.evidence
    );
    assert_eq!(s.health.len(), 2);
    assert!(s.faults.is_empty(), "a neighbour's events are not faults");
    assert_eq!(shape::mean(&s.utilization), Some(0.75));
    assert_eq!(shape::mean(&s.hbm_ratio), Some(0.25));
    // 180 GB/s of 18 links × 50 GB/s.
    let nvlink = shape::mean(&s.nvlink_ratio).unwrap();
    assert!((nvlink - 0.2).abs() < 1e-9, "{nvlink}");
    let steal = shape::mean(&s.steal_ratio).unwrap();
    assert!((steal - 0.1).abs() < 1e-6, "{steal}");
    let steal = s.steal_over_range.unwrap();
    assert!((steal - 0.1).abs() < 1e-6, "{steal}");
    // 6 windows × 2 CPUs × 100 wake-ups: 1080 under 10 µs, 120 under 100 µs.
    assert_eq!(
        s.histogram,
        [(1e-5, 1080.0), (1e-4, 120.0), (f64::INFINITY, 0.0)]
    );
    // The event seen open then closed counts once, closed.
    assert_eq!(s.events.len(), 2);
    let closed = &s.events[0];
    assert_eq!(
        (closed.state.as_str(), closed.end_us),
        ("closed", Some(T0 + 35 * SECOND))
    );
    assert_eq!(closed.start_us, T0 + 10 * SECOND);
    assert_eq!(
        (s.events[1].resource.as_str(), s.events[1].end_us),
        ("memory_bandwidth", None)
    );

    let html = render(&context(dir.path(), false, true), &data);
    for id in [
        "gpu-utilization",
        "gpu-hbm",
        "gpu-nvlink",
        "jitter-quantiles",
        "jitter-lost",
        "jitter-distribution-0",
        "steal",
        "events-timeline",
    ] {
        assert!(html.contains(&format!(r#"id="{id}" data-points"#)), "{id}");
    }
    assert!(html.contains("HBM peak") && html.contains("NVLink peak (18 links, both ways)"));
    // No pressure rows: a note, not an empty frame.
    assert!(html.contains(r#"<p class="no-data" id="pressure">"#));
    // Downsampled to max_points: 60 samples per GPU become at most 20.
    let hbm = &html[html.find(r#"id="gpu-hbm""#).unwrap()..];
    let first_path = &hbm[hbm.find("<path").unwrap()..];
    let d = &first_path[..first_path.find("</path>").unwrap()];
    assert!(d.matches('L').count() < 20, "{d}");
    assert!(
        !html.contains(" src=") && !html.contains(" href=") && !html.contains("<link"),
        "self-contained"
    );
}

/// An open event is drawn to the node's last row, not to the end of a
/// range that reaches past the data: nothing says it went on after.
#[test]
fn an_open_event_ends_where_the_nodes_rows_end() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "unit_node", 0.75, true);
    let source = Source::open(dir.path()).unwrap();
    let data = load(&source, &catalog_with_events(), None, None, false).unwrap();
    let last = data[0].last_row_us().unwrap();
    let mut page = context(dir.path(), false, true);
    // A range of an hour from the first row: the rows end within minutes.
    page.from_us = Some(T0);
    page.until_us = Some(T0 + 3600 * SECOND);
    let html = render(&page, &data);
    let timeline = &html[html.find(r#"id="events-timeline""#).unwrap()..];
    let open = &timeline[timeline.find(r##"fill="#1f77b4""##).unwrap()..];
    let rect = &timeline[..timeline.len() - open.len()];
    let rect = &rect[rect.rfind("<rect").unwrap()..];
    let attr = |name: &str| -> f64 {
        let at = rect.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        rect[at..at + rect[at..].find('"').unwrap()]
            .parse()
            .unwrap()
    };
    let right = attr("x") + attr("width");
    // The timeline's x: 120 px of lane names, then the range.
    let (left, width) = (78.0 + 120.0, 860.0 - 78.0 - 120.0 - 16.0);
    let x = |t: i64| left + width * ((t - T0) as f64 / (3600 * SECOND) as f64);
    assert!(
        (right - x(last)).abs() < 4.0,
        "ends at {right}, the last row at {}",
        x(last)
    );
    assert!(right < left + width / 2.0, "{right}");
}

/// A range with no rows says which range it was.
#[test]
fn an_empty_range_names_the_range_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "unit_node", 0.75, false);
    let source = Source::open(dir.path()).unwrap();
    let (from, until) = (T0 + 10 * vtax_store::DAY_US, T0 + 11 * vtax_store::DAY_US);
    let data = load(&source, &crate::catalog(), Some(from), Some(until), false).unwrap();
    let mut page = context(dir.path(), false, false);
    page.from_us = Some(from);
    page.until_us = Some(until);
    let html = render(&page, &data);
    let said = format!(
        "no rows from {} to {} UTC",
        format_time(from, true),
        format_time(until, true)
    );
    assert!(
        html.contains(&said),
        "{}",
        &html[..html.find("</header>").unwrap()]
    );
}

/// An event's end carries its date where it is not its start's: a day-long
/// event read "10:00:10 – 10:00:15", five seconds.
#[test]
fn an_event_that_ends_on_another_day_says_its_end_date() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = StoreOptions::new(dir.path());
    options.node = "n1".into();
    let mut store = Store::open(options, catalog_with_events()).unwrap();
    let day = 86_400;
    let rows = vec![(
        T0 + (day + 20) * SECOND,
        vec![
            "cpu",
            "node",
            "pressure_some_ratio",
            "closed",
            "/batch.slice score=0.90 r=0.90 effect=0.5000",
            "stalled",
        ],
        vec![
            ("start_time_seconds", Value::F64((T0 / SECOND + 10) as f64)),
            (
                "end_time_seconds",
                Value::F64((T0 / SECOND + day + 15) as f64),
            ),
            ("score", Value::F64(4.5)),
            ("top_correlation", Value::F64(0.9)),
            ("effect_size", Value::F64(2.0)),
        ],
    )];
    push(&mut store, "neighbor_events", &rows);
    store.close().unwrap();
    let source = Source::open(dir.path()).unwrap();
    let data = load(&source, &catalog_with_events(), None, None, false).unwrap();
    let html = render(&context(dir.path(), false, true), &data);
    let start = format_time(T0 + 10 * SECOND, true);
    let end = format_time(T0 + (day + 15) * SECOND, true);
    assert!(
        html.contains(&format!("{start} – {end}")),
        "{}",
        &html[html.find("Noisy-neighbour events").unwrap()..]
    );
}

/// HBM and NVLink against their peaks are taken while busy: a node whose
/// GPUs idle (utilisation 0.1) moves few bytes by design, and its seconds
/// would read as bandwidth lost.
#[test]
fn an_idle_gpus_bandwidth_is_no_share_of_its_peak() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "idle_node", 0.1, false);
    let source = Source::open(dir.path()).unwrap();
    let data = load(&source, &crate::catalog(), None, None, false).unwrap();
    let s = summarize(&data[0]);
    let utilization = shape::mean(&s.utilization).unwrap();
    assert!((utilization - 0.1).abs() < 1e-9, "{utilization}");
    assert!(s.hbm_ratio.is_empty(), "{:?}", s.hbm_ratio);
    assert!(s.nvlink_ratio.is_empty(), "{:?}", s.nvlink_ratio);
}

/// A fleet copy of nodes written by `write_node` with their utilisation.
fn fleet_of(nodes: &[(&str, f64)]) -> tempfile::TempDir {
    let fleet = tempfile::tempdir().unwrap();
    for (node, util) in nodes {
        let dir = tempfile::tempdir().unwrap();
        write_node(dir.path(), node, *util, false);
        // The uploader's layout: each table's partitions moved under node=.
        for table in std::fs::read_dir(dir.path().join("tables")).unwrap() {
            let table = table.unwrap().path();
            let to = fleet.path().join("tables").join(table.file_name().unwrap());
            std::fs::create_dir_all(&to).unwrap();
            std::fs::rename(&table, to.join(format!("node={node}"))).unwrap();
        }
    }
    fleet
}

#[test]
fn a_fleet_copy_is_read_per_node_and_without_events_says_so() {
    let fleet = fleet_of(&[("node_a", 0.9), ("node_b", 0.3)]);
    let source = Source::open(fleet.path()).unwrap();
    assert_eq!(source.nodes(), ["node_a", "node_b"]);
    let catalog = crate::catalog();
    // A range keeps the first 30 s only.
    let data = load(&source, &catalog, Some(T0), Some(T0 + 30 * SECOND), false).unwrap();
    let utilization: Vec<f64> = data
        .iter()
        .map(|n| {
            assert_eq!(n.rows("gpu").len(), 60, "{}: 2 GPUs × 30 s", n.name);
            shape::mean(&summarize(n).utilization).unwrap()
        })
        .collect();
    assert!(
        (utilization[0] - 0.9).abs() < 1e-9 && (utilization[1] - 0.3).abs() < 1e-9,
        "{utilization:?}"
    );
    let html = render(&context(fleet.path(), true, false), &data);
    assert!(html.contains("fleet of 2 nodes"));
    assert!(html.contains("No noisy-neighbour events recorded"));
    for id in [
        "gpu-utilization",
        "gpu-hbm",
        "gpu-nvlink",
        "jitter-p99",
        "jitter-lost",
        "steal",
    ] {
        assert!(html.contains(&format!(r#"id="{id}""#)), "{id}");
    }
    assert!(!html.contains(r#"class="no-data" id="gpu"#));
}

/// A damaged file in a fleet copy stops the report with what to do; with
/// `skip_damaged` the rest is reported and the file named first on the page.
#[test]
fn a_damaged_file_is_named_and_left_out_only_when_asked() {
    let fleet = fleet_of(&[("node_a", 0.9), ("node_b", 0.3)]);
    let cpu_files = vtax_tests::all_files(&fleet.path().join("tables/cpu/node=node_b"));
    assert!(!cpu_files.is_empty());
    for file in &cpu_files {
        // Cut short, as a copy stopped midway leaves it.
        let bytes = std::fs::read(file).unwrap();
        std::fs::write(file, &bytes[..bytes.len() / 2]).unwrap();
    }
    let source = Source::open(fleet.path()).unwrap();
    let catalog = crate::catalog();
    let err = format!(
        "{:#}",
        load(&source, &catalog, None, None, false).err().unwrap()
    );
    assert!(
        err.contains("read table cpu of node node_b")
            && err.contains(&cpu_files[0].display().to_string())
            && err.contains("--skip-damaged writes the report without it"),
        "{err}"
    );

    let data = load(&source, &catalog, None, None, true).unwrap();
    let (a, b) = (&data[0], &data[1]);
    assert!(a.damaged_files.is_empty());
    assert_eq!(
        b.damaged_files.len(),
        cpu_files.len(),
        "{:?}",
        b.damaged_files
    );
    assert_eq!(
        b.rows("cpu").len(),
        0,
        "node_b's CPU rows were all in the damaged files"
    );
    assert_eq!(b.rows("gpu").len(), 120, "its other tables are read");
    assert_eq!(a.rows("cpu").len(), 120);
    let html = render(&context(fleet.path(), true, false), &data);
    let damaged = html.find(r#"<section id="damaged">"#).expect("the section");
    assert!(
        damaged < html.find(r#"<section id="headline">"#).unwrap(),
        "first on the page"
    );
    let section = &html[damaged..damaged + html[damaged..].find("</section>").unwrap()];
    assert!(
        section.contains(&format!("{} damaged file(s)", cpu_files.len()))
            && section.contains("<b>node_b</b>")
            && section.contains(&escape(&cpu_files[0].display().to_string())),
        "{section}"
    );
    // Without damage the page has no such section.
    let whole = fleet_of(&[("node_a", 0.9)]);
    let data = load(
        &Source::open(whole.path()).unwrap(),
        &catalog,
        None,
        None,
        true,
    )
    .unwrap();
    assert!(!render(&context(whole.path(), true, false), &data).contains(r#"id="damaged""#));
}

/// Beside a young agent every row is still in the WAL: the report reads it,
/// as `vtax query` does.
#[test]
fn a_store_whose_rows_are_all_in_the_wal_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut store =
        vtax_store::Store::open(vtax_store::StoreOptions::new(dir.path()), crate::catalog())
            .unwrap();
    let mut rows = vtax_store::BatchBuilder::new(&crate::collectors::host::LOAD);
    let row = crate::collectors::host::LoadRow {
        load1: 0.5,
        load5: 0.5,
        load15: 0.5,
        runnable_tasks: 1,
        tasks: 1,
    };
    rows.push_row(1_800_000_000_000_000, &row).unwrap();
    store.append(&rows.finish()).unwrap();
    store.sync().unwrap();
    assert!(!dir.path().join("tables").exists(), "nothing published yet");
    let source = Source::open(dir.path()).unwrap();
    let request = ScanRequest {
        table: "load".into(),
        ..Default::default()
    };
    let node = source.nodes().remove(0);
    let (read, damaged) = source.scan(&node, &crate::catalog(), &request).unwrap();
    assert_eq!((read.len(), damaged.len()), (1, 0));
    drop(store);
}

#[test]
fn a_missing_store_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = Source::open(&dir.path().join("nothing")).err().unwrap();
    assert!(e.to_string().contains("no store at"), "{e}");
}

#[test]
fn a_large_fleet_plots_lowest_median_and_highest_node() {
    let names: Vec<String> = (0..12).map(|i| format!("n{i:02}")).collect();
    let nodes: Vec<(&str, f64)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), 0.05 + 0.05 * i as f64))
        .collect();
    let fleet = fleet_of(&nodes);
    let source = Source::open(fleet.path()).unwrap();
    let data = load(&source, &crate::catalog(), None, None, false).unwrap();
    assert_eq!(data.len(), 12);
    let html = render(&context(fleet.path(), true, false), &data);
    let gpu = &html[html.find(r#"id="gpu-utilization""#).unwrap()..];
    let gpu = &gpu[..gpu.find("</svg>").unwrap()];
    assert_eq!(
        gpu.matches(r#"class="series""#).count(),
        3,
        "three lines, not twelve"
    );
    for (label, value) in [
        ("lowest node", "5%"),
        ("median node", "35%"),
        ("highest node", "60%"),
    ] {
        assert!(
            gpu.contains(&format!("{label}: last {value}")),
            "{label} {value} in {gpu}"
        );
    }
    // One distribution for the fleet, its counts the sum of the nodes'.
    assert!(html.contains("Distribution: all nodes") && !html.contains("jitter-distribution-1"));
    // The headline's and the platform's tables still have a row per node.
    let platform = &html[html.find(r#"<section id="platform""#).unwrap()..];
    let platform = &platform[..platform.find("</section>").unwrap()];
    assert_eq!(platform.matches(r#"class="verdict-cell""#).count(), 12);
    let headline = &html[..html.find(r#"<section id="platform""#).unwrap()];
    assert_eq!(headline.matches(r#"class="verdict-cell""#).count(), 12);
}

#[test]
fn a_range_without_rows_renders_notes_not_empty_plots() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "quiet", 0.5, false);
    let source = Source::open(dir.path()).unwrap();
    let data = load(
        &source,
        &crate::catalog(),
        Some(T0 + 3600 * SECOND),
        None,
        false,
    )
    .unwrap();
    assert!(data[0].tables.values().all(|rows| rows.is_empty()));
    let html = render(&context(dir.path(), false, false), &data);
    assert!(!html.contains("<svg"), "no plot without data");
    assert!(html.matches(r#"class="no-data""#).count() >= 6);
    assert!(html.contains("Unknown: no verdict rows in this range"));
    // Nothing to judge the hardware by is not "nothing lost".
    assert!(html.contains("no detector windows in this range to judge it by"));
    assert!(!html.contains("nothing lost"));
    // Nor is it "no noisy-neighbour events".
    assert!(html.contains("no detector windows in this range to judge them by"));
    assert!(!html.contains("no noisy-neighbour events"));
    // An empty sum of wake-ups printed as "-0".
    assert!(
        html.contains(r#"<td class="num">0</td>"#) && !html.contains(">-0<"),
        "no negative zero"
    );
}

use crate::golden::GOLDEN_SCENARIOS as SCENARIOS;

/// A node whose GPUs play every scenario for 40 s, through the real GPU
/// collector and detector, as a running agent writes them.
fn write_simulated_node(dir: &Path) {
    use crate::collectors::{Availability, Collector};
    let mut options = StoreOptions::new(dir);
    options.node = "sim".into();
    let mut store = Store::open(options, crate::catalog()).unwrap();
    let config = crate::collectors::gpu::GpuConfig {
        simulate_gpus: SCENARIOS.len() as u32,
        simulate_scenarios: SCENARIOS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let roots = crate::collectors::Roots {
        procfs: "/nonexistent/proc".into(),
        sysfs: "/nonexistent/sys".into(),
        ..crate::collectors::Roots::default()
    };
    let mut gpu = crate::collectors::gpu::Gpu::new(&config, &roots);
    assert!(matches!(gpu.probe(), Availability::Available(_)));
    let mut detector = crate::detect::Detector::new(crate::detect::DetectConfig {
        cache_canary: false,
        ..Default::default()
    });
    for second in 0..40 {
        for batch in gpu.collect(T0 + second * SECOND + 1_000).unwrap() {
            detector.observe(&batch);
            store.append(&batch).unwrap();
        }
        for batch in detector.tick(T0 + (second + 1) * SECOND + 300_000) {
            store.append(&batch).unwrap();
        }
    }
    store.close().unwrap();
}

/// The legend's `(colour, label)` entries of the chart `id`.
fn legend_of(html: &str, id: &str) -> Vec<(String, String)> {
    let chart = &html[html
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("{id}"))..];
    let legend = &chart[chart.find(r#"<div class="legend">"#).unwrap()..];
    let legend = &legend[..legend.find("</div>").unwrap()];
    legend
        .split(r#"<i style="background:"#)
        .skip(1)
        .map(|e| {
            let (color, rest) = e.split_once('"').unwrap();
            let label = &rest[rest.find("</i>").unwrap() + 4..rest.find("</span>").unwrap()];
            (color.to_string(), label.to_string())
        })
        .collect()
}

#[test]
fn every_gpu_is_listed_the_lost_one_as_lost_and_faults_apart_from_neighbours() {
    let dir = tempfile::tempdir().unwrap();
    write_simulated_node(dir.path());
    let source = Source::open(dir.path()).unwrap();
    let data = load(&source, &crate::catalog(), None, None, false).unwrap();
    let s = summarize(&data[0]);

    // The lost GPU (index 7) has no `gpu` rows after it went, yet is listed.
    let indices: Vec<&str> = s.health.iter().map(|g| g.index.as_str()).collect();
    assert_eq!(indices, ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]);
    let lost: Vec<&str> = s.lost_gpus().map(|g| g.index.as_str()).collect();
    assert_eq!(lost, ["7"]);
    assert_eq!(s.health[7].last_xid, Some(79));
    // Lost from its first tick: the store cannot say when it went, only
    // that it had by its first sample; the page says "at or before".
    assert!(s.health[7].lost_before, "{:?}", s.health[7]);
    assert_eq!(s.health[7].lost_since, Some(T0 + 1_000));
    assert_eq!(s.gpu_count(), "10 (1 lost)");
    // What each scenario shows.
    assert_eq!(
        s.health[2].slowdowns,
        ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    );
    assert!(
        s.health[4].pcie.is_some_and(|p| p.degraded()),
        "{:?}",
        s.health[4].pcie
    );
    assert_eq!(s.health[5].nvlink, Some((0, 18)));
    assert!(s.health[6].xids.contains_key(&31), "{:?}", s.health[6].xids);
    assert!(!s.health[0].troubled(), "{:?}", s.health[0]);

    // The throttles, the trained-down link and the hidden NVLink are faults
    // of the node, not neighbours.
    let signals = |events: &[Event]| -> Vec<(String, String)> {
        events
            .iter()
            .map(|e| (e.victim.clone(), e.signal.clone()))
            .collect()
    };
    let faults = signals(&s.faults);
    for (victim, signal) in [
        ("gpu2", "clock_throttle_ratio"),
        ("gpu4", "pcie_bandwidth_loss_ratio"),
        ("gpu5", "nvlink_links_missing_ratio"),
    ] {
        assert!(
            faults.contains(&(victim.into(), signal.into())),
            "{victim} {signal} in {faults:?}"
        );
    }
    assert!(
        s.events.iter().all(|e| !e.is_fault()),
        "{:?}",
        signals(&s.events)
    );
    // The tax as the detector measured it.
    let figure = |field: &str| {
        let i = TAX_FIELDS.iter().position(|f| f.field == field).unwrap();
        s.tax[i].value
    };
    assert!(
        figure("nvlink_links_missing_ratio").is_some_and(|v| v > 0.1),
        "{:?}",
        s.tax
    );
    assert!(
        figure("pcie_bandwidth_loss_ratio").is_some_and(|v| v > 0.5),
        "{:?}",
        s.tax
    );

    let html = render(&context(dir.path(), false, true), &data);
    // The headline: every figure, the lost GPU, the causes with it first.
    let headline =
        &html[html.find(r#"id="headline""#).unwrap()..html.find(r#"id="gpu-health""#).unwrap()];
    for field in TAX_FIELDS {
        assert!(
            headline.contains(&format!(r#"data-tax="{}""#, field.field)),
            "{}",
            field.field
        );
    }
    assert!(headline.contains("1 of 10") && headline.contains("GPUs lost"));
    let causes = &headline[headline.find("Top causes").unwrap()..];
    assert!(
        causes.find("GPU 7: lost") < causes.find("GPU 5: NVLink links missing"),
        "{causes}"
    );
    for gpu in 0..10 {
        let state = if gpu == 7 { "lost" } else { "up" };
        assert!(
            html.contains(&format!(r#"data-gpu="{gpu}" data-state="{state}""#)),
            "GPU {gpu}"
        );
    }
    // The hidden NVLink's GPU is on the NVLink chart, at zero, saying why.
    assert!(
        html.contains("GPU 5 (0 of 18 links up): last 0 B/s"),
        "the hidden GPU's NVLink line"
    );
    // Each GPU has its index's colour in every chart, the lost one included.
    for id in [
        "gpu-utilization",
        "gpu-hbm",
        "gpu-nvlink",
        "gpu-clock",
        "gpu-temperature",
    ] {
        let legend = legend_of(&html, id);
        assert_eq!(legend.len(), 10, "{id}: {legend:?}");
        for (color, label) in &legend {
            let index: usize = label["GPU ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(
                color,
                svg::PALETTE[index % svg::PALETTE.len()],
                "{id}: {label}"
            );
        }
        assert!(
            legend.iter().any(|(_, l)| l.starts_with("GPU 7 (lost at ")),
            "{id}: {legend:?}"
        );
    }
    // The timeline's colours have a legend.
    let legend = legend_of(&html, "events-timeline");
    assert!(legend.iter().any(|(_, l)| l == "fault, open"), "{legend:?}");
}

/// Each tax tile's worst window is the one where the platform took most: the
/// highest loss, the lowest share of a peak; the probed CPUs' busy share is
/// context, shown as its range, and named where the hypervisor line blames
/// unexplained time.
#[test]
fn the_worst_window_is_the_worst_way_and_busy_is_context() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(StoreOptions::new(dir.path()), crate::catalog()).unwrap();
    let window = |t: i64, steal: f64, unexplained: f64, busy: f64, hbm: f64| {
        (
            T0 + t * 10 * SECOND,
            vec![],
            vec![
                ("steal_ratio", Value::F64(steal)),
                ("unexplained_ratio", Value::F64(unexplained)),
                ("jitter_busy_ratio", Value::F64(busy)),
                ("hbm_peak_ratio", Value::F64(hbm)),
            ],
        )
    };
    push(
        &mut store,
        "tax",
        &[
            window(1, 0.002, 0.03, 0.01, 0.9),
            window(2, 0.004, 0.05, 0.03, 0.5),
        ],
    );
    store.close().unwrap();
    let source = Source::open(dir.path()).unwrap();
    let data = load(&source, &crate::catalog(), None, None, false).unwrap();
    let s = summarize(&data[0]);
    let note = |field: &str| {
        let i = TAX_FIELDS.iter().position(|f| f.field == field).unwrap();
        s.tax[i].note(&TAX_FIELDS[i])
    };
    assert_eq!(note("steal_ratio"), "worst window 0.4%");
    assert_eq!(note("unexplained_ratio"), "worst window 5%");
    assert_eq!(note("hbm_peak_ratio"), "worst window 50%");
    assert_eq!(note("jitter_busy_ratio"), "windows 1%–3%");
    let (who, hypervisor) = &findings::who_takes(&s)[0];
    assert_eq!(*who, "The hypervisor");
    assert!(
        hypervisor.ends_with("where the guest cannot see why, on probed CPUs 2% busy"),
        "{hypervisor}"
    );
}

/// A tail past the histogram's last bound is shown as more than that bound:
/// "≤ 100 µs" for wake-ups later than 100 µs would point the wrong way.
#[test]
fn a_wake_up_tail_past_the_last_bucket_reads_as_more_than_it() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "late_node", 0.75, false);
    {
        let mut options = StoreOptions::new(dir.path());
        options.node = "late_node".into();
        let mut store = Store::open(options, crate::catalog()).unwrap();
        // A window after the node's last: 100 more wake-ups per CPU, 40 of
        // them later than the last bound (100 µs).
        for cpu in ["0", "1"] {
            let rows: Vec<_> = [("1e-05", 600.0), ("0.0001", 660.0), ("+Inf", 700.0)]
                .iter()
                .map(|(le, count)| {
                    (
                        T0 + 70 * SECOND,
                        vec![cpu, *le],
                        vec![("latency_seconds", Value::U64(*count as u64))],
                    )
                })
                .collect();
            push(&mut store, "jitter_wakeup", &rows);
        }
        store.close().unwrap();
    }
    let source = Source::open(dir.path()).unwrap();
    let data = load(&source, &crate::catalog(), None, None, false).unwrap();
    let s = summarize(&data[0]);
    assert_eq!(s.histogram.last(), Some(&(f64::INFINITY, 80.0)));
    assert_eq!(
        shape::histogram_quantile(0.99, &s.histogram),
        Some(shape::Quantile::Above(1e-4))
    );
    let html = render(&context(dir.path(), false, false), &data);
    let table = &html[html.find("Wake-up latency distribution").unwrap()..];
    let row = &table[table.find("late_node").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("&gt; 100 µs") || row.contains("> 100 µs"),
        "{row}"
    );
    assert!(!row.contains("≤ 100 µs"), "{row}");
}

/// A range takes the windows that lie in it: the detector's and the jitter
/// probe's rows are stamped with their window's end, so the row at the
/// range's start sums up the window before it and the row at its end the
/// range's last; the wake-up counts grow from the row at its start. Events
/// are those the range saw: one open across the whole range (its only row
/// before it) is there, one closed before it is not.
#[test]
fn a_range_reads_the_windows_and_events_of_that_range() {
    let dir = tempfile::tempdir().unwrap();
    write_node(dir.path(), "unit_node", 0.75, true);
    let catalog = catalog_with_events();
    let source = Source::open(dir.path()).unwrap();
    let (from, until) = (T0 + 20 * SECOND, T0 + 40 * SECOND);
    let data = load(&source, &catalog, Some(from), Some(until), false).unwrap();
    let jitter_times: std::collections::BTreeSet<i64> =
        data[0].rows("jitter").time_us.iter().copied().collect();
    assert_eq!(
        jitter_times.into_iter().collect::<Vec<_>>(),
        [T0 + 30 * SECOND, T0 + 40 * SECOND]
    );
    let s = summarize(&data[0]);
    // Two windows × 2 CPUs × (90 under 10 µs, 10 under 100 µs).
    assert_eq!(
        s.histogram,
        [(1e-5, 360.0), (1e-4, 40.0), (f64::INFINITY, 0.0)]
    );
    let states: Vec<(&str, &str)> = s
        .events
        .iter()
        .map(|e| (e.resource.as_str(), e.state.as_str()))
        .collect();
    assert_eq!(states, [("cpu", "closed")], "ended at +35 s, in the range");

    let data = load(
        &source,
        &catalog,
        Some(T0 + 55 * SECOND),
        Some(T0 + 60 * SECOND),
        false,
    )
    .unwrap();
    let s = summarize(&data[0]);
    let states: Vec<(&str, &str)> = s
        .events
        .iter()
        .map(|e| (e.resource.as_str(), e.state.as_str()))
        .collect();
    assert_eq!(
        states,
        [("memory_bandwidth", "open")],
        "open since +45 s, its only row at +50 s"
    );
}
