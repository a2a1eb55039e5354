//! Tests of the module.

use std::collections::BTreeMap;

use super::*;
use vtax_store::batch::Values;

fn fixture() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/baremetal-node"
    ))
}

fn roots(node: &Path) -> Roots {
    Roots {
        procfs: node.join("proc"),
        sysfs: node.join("sys"),
        ..Roots::default()
    }
}

fn collector(node: &Path) -> Infiniband {
    Infiniband::new(&InfinibandConfig::default(), &roots(node))
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A copy of the fixture's infiniband tree in a temporary directory.
fn fixture_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &fixture().join("sys/class/infiniband"),
        &dir.path().join("sys/class/infiniband"),
    );
    dir
}

fn batch<'a>(batches: &'a [Batch], table: &TableDef) -> &'a Batch {
    batches
        .iter()
        .find(|b| b.table.name == table.name)
        .unwrap_or_else(|| panic!("no {} batch", table.name))
}

fn tag(b: &Batch, name: &str, row: usize) -> String {
    let column = &b.tags[b.table.tag_index(name).unwrap()];
    column.dict[column.codes[row] as usize].clone()
}

/// The row of `device`/`port` in a batch tagged with both.
fn row(b: &Batch, device: &str, port: &str) -> usize {
    (0..b.len())
        .find(|&r| tag(b, "device", r) == device && tag(b, "port", r) == port)
        .unwrap_or_else(|| panic!("no row for {device}/{port}"))
}

fn u64_at(b: &Batch, field: &str, row: usize) -> Option<u64> {
    let column = &b.fields[b.table.field_index(field).unwrap()];
    if !column.is_valid(row) {
        return None;
    }
    match &column.values {
        Values::U64(v) => Some(v[row]),
        other => panic!("{field} is {other:?}"),
    }
}

fn f64_at(b: &Batch, field: &str, row: usize) -> Option<f64> {
    let column = &b.fields[b.table.field_index(field).unwrap()];
    if !column.is_valid(row) {
        return None;
    }
    match &column.values {
        Values::F64(v) => Some(v[row]),
        other => panic!("{field} is {other:?}"),
    }
}

fn hw_value(b: &Batch, device: &str, port: &str, counter: &str) -> Option<u64> {
    let r = (0..b.len()).find(|&r| {
        tag(b, "device", r) == device
            && tag(b, "port", r) == port
            && tag(b, "counter", r) == counter
    })?;
    u64_at(b, "value", r)
}

#[test]
fn tables_are_valid_and_columns_line_up() {
    for table in TABLES {
        table.validate().unwrap();
        assert!(table.name.starts_with("infiniband"));
    }
    // Every counter source fills a field of its own, and every field
    // but the three read from the port's attributes has one; the first
    // (preferred) source is the `counters/` file the field is named after.
    let mut filled = Vec::new();
    for (sources, _, field) in COUNTER_SOURCES {
        let mut row = PortRow::default();
        *field(&mut row) = Some(1);
        let mut rows = BatchBuilder::new(&PORT);
        rows.push_row(0, &row).unwrap();
        let batch = rows.finish();
        let set: Vec<usize> = (0..PORT.fields.len())
            .filter(|&i| batch.fields[i].is_valid(0))
            .collect();
        assert_eq!(set.len(), 1, "{sources:?}");
        let name = PORT.fields[set[0]].name;
        assert!(!filled.contains(&name), "{sources:?} fills {name} again");
        filled.push(name);
        let first = sources[0].strip_prefix("counters/").unwrap();
        assert_eq!(
            first.trim_start_matches("port_").to_ascii_lowercase(),
            name.trim_end_matches("_bytes"),
            "{sources:?}"
        );
    }
    let attributes = ["state", "phys_state", "rate_bytes_per_second"];
    let unfilled: Vec<&str> = PORT
        .fields
        .iter()
        .map(|f| f.name)
        .filter(|name| !filled.contains(name))
        .collect();
    assert_eq!(unfilled, attributes);
}

#[test]
fn fixture_values() {
    let mut c = collector(&fixture());
    let batches = c.collect(42).unwrap();
    let ports = batch(&batches, &PORT);
    assert_eq!(ports.len(), 9);
    assert!(ports.time_us.iter().all(|&t| t == 42));

    // port_xmit_data counts 4-byte words.
    let r = row(ports, "mlx5_0", "1");
    assert_eq!(
        u64_at(ports, "xmit_data_bytes", r),
        Some(1_029_384_756_102 * 4)
    );
    assert_eq!(
        u64_at(ports, "rcv_data_bytes", r),
        Some(918_273_645_123 * 4)
    );
    assert_eq!(u64_at(ports, "xmit_packets", r), Some(3_019_283_746));
    assert_eq!(u64_at(ports, "unicast_rcv_packets", r), Some(2_810_376_590));
    assert_eq!(u64_at(ports, "xmit_wait", r), Some(1204));
    assert_eq!(u64_at(ports, "state", r), Some(4));
    assert_eq!(u64_at(ports, "phys_state", r), Some(5));
    assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(50e9));

    // The congested port.
    let r = row(ports, "mlx5_2", "1");
    assert_eq!(u64_at(ports, "xmit_wait", r), Some(3_718_293_871));
    assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(50e9));
    let r = row(ports, "mlx5_4", "1");
    assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(25e9));

    // An older kernel's layout: the 64-bit counters_ext win over the
    // saturated 32-bit ones; what it lacks is null.
    let r = row(ports, "mlx5_3", "1");
    assert_eq!(
        u64_at(ports, "xmit_data_bytes", r),
        Some(73_839_029_384 * 4)
    );
    assert_eq!(u64_at(ports, "rcv_data_bytes", r), Some(69_120_394_857 * 4));
    assert_eq!(u64_at(ports, "xmit_packets", r), Some(9_028_371_625));
    assert_eq!(u64_at(ports, "rcv_packets", r), Some(8_812_734_410));
    assert_eq!(
        u64_at(ports, "unicast_xmit_packets", r),
        Some(9_028_360_001)
    );
    assert_eq!(u64_at(ports, "multicast_rcv_packets", r), Some(14_408));
    assert_eq!(u64_at(ports, "xmit_wait", r), None);

    // The port that is down.
    let r = row(ports, "mlx5_5", "1");
    assert_eq!(u64_at(ports, "state", r), Some(1));
    assert_eq!(u64_at(ports, "phys_state", r), Some(2));
    assert_eq!(u64_at(ports, "link_downed", r), Some(3));

    // The RoCE port and its mlx5 hw_counters; lifespan is a setting, not a counter.
    let r = row(ports, "mlx5_8", "1");
    assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(12.5e9));
    let hw = batch(&batches, &HW_COUNTER);
    assert_eq!(hw_value(hw, "mlx5_8", "1", "np_cnp_sent"), Some(120_410));
    assert_eq!(hw_value(hw, "mlx5_8", "1", "out_of_sequence"), Some(10));
    assert_eq!(
        hw_value(hw, "mlx5_0", "1", "rx_write_requests"),
        Some(48_232)
    );
    assert_eq!(hw_value(hw, "mlx5_8", "1", "lifespan"), None);
    assert_eq!(hw.len(), 8 * 19 + 29);

    let link = batch(&batches, &LINK);
    let r = row(link, "mlx5_8", "1");
    assert_eq!(tag(link, "link_layer", r), "Ethernet");
    assert_eq!(tag(link, "state", r), "ACTIVE");
    assert_eq!(tag(link, "phys_state", r), "LinkUp");
    assert_eq!(tag(link, "rate", r), "100 Gb/sec (4X EDR)");
    let r = row(link, "mlx5_1", "1");
    assert_eq!(tag(link, "link_layer", r), "InfiniBand");
    assert_eq!(tag(link, "lid", r), "0x1e");
    let r = row(link, "mlx5_5", "1");
    assert_eq!(tag(link, "state", r), "DOWN");
    assert_eq!(tag(link, "phys_state", r), "Polling");

    let devices = batch(&batches, &DEVICE);
    assert_eq!(devices.len(), 9);
    assert_eq!(tag(devices, "device", 0), "mlx5_0");
    assert_eq!(tag(devices, "hca_type", 0), "MT4129");
    assert_eq!(tag(devices, "fw_ver", 0), "28.39.2048");
    assert_eq!(tag(devices, "board_id", 0), "MT_0000000838");
    assert_eq!(tag(devices, "node_guid", 0), "946d:ae03:00f4:1a2c");

    let problems = c.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("mlx5_5/1 is DOWN/Polling: no link")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("mlx5_5/1: link_downed = 3")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("mlx5_6/1: physical errors")
                && p.contains("symbol_error = 12")),
        "{problems:?}"
    );
    // The saturated 32-bit counters of mlx5_3 are not read: no complaint.
    assert!(!problems.iter().any(|p| p.contains("2^32")), "{problems:?}");
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("mlx5_5/1: physical errors")
                && p.contains("link_error_recovery = 3")),
        "{problems:?}"
    );
    assert_eq!(problems.len(), 4, "{problems:?}");
}

/// A ConnectX-3 (mlx4) on a current kernel: `counters/` counts in 64
/// bits while every legacy `counters_ext/` file reads 0.
#[test]
fn mlx4_counters_ext_stuck_at_zero_never_replaces_counters() {
    let node = fixture().join("../mlx4-node");
    let mut c = collector(&node);
    let batches = c.collect(7).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx4_0", "1");
    assert_eq!(u64_at(ports, "rcv_packets", r), Some(6_812_093_417));
    assert_eq!(u64_at(ports, "xmit_packets", r), Some(5_219_384_401));
    assert_eq!(
        u64_at(ports, "rcv_data_bytes", r),
        Some(2_718_428_417_305 * 4)
    );
    assert_eq!(
        u64_at(ports, "xmit_data_bytes", r),
        Some(1_904_827_361_192 * 4)
    );
    assert_eq!(u64_at(ports, "unicast_rcv_packets", r), Some(6_812_090_012));
    assert_eq!(u64_at(ports, "multicast_xmit_packets", r), Some(4284));
    assert_eq!(u64_at(ports, "xmit_wait", r), Some(88_231));
    assert!(c.problems().is_empty(), "{:?}", c.problems());
}

/// `counters/` saturated at 2^32-1: the `counters_ext/` value is taken
/// only while it is at least as large; a stuck one is reported, and the
/// saturated value stands.
#[test]
fn a_saturated_counter_falls_back_only_to_a_source_that_counts_more() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture().join("../mlx4-node/sys"), &dir.path().join("sys"));
    let port = dir.path().join("sys/class/infiniband/mlx4_0/ports/1");
    std::fs::write(port.join("counters/port_rcv_packets"), "4294967295\n").unwrap();
    std::fs::write(port.join("counters/port_xmit_packets"), "4294967295\n").unwrap();
    std::fs::write(
        port.join("counters_ext/port_xmit_packets_64"),
        "9000000000\n",
    )
    .unwrap();
    let mut c = collector(dir.path());
    let batches = c.collect(7).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx4_0", "1");
    assert_eq!(u64_at(ports, "xmit_packets", r), Some(9_000_000_000));
    assert_eq!(u64_at(ports, "rcv_packets", r), Some(4_294_967_295));
    let problems = c.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("counters/port_rcv_packets: stuck at 2^32-1")
            && problems[0].contains("counters_ext/port_rcv_packets_64 reads 0"),
        "{problems:?}"
    );
    // Once the legacy file counts past it, it is read.
    std::fs::write(
        port.join("counters_ext/port_rcv_packets_64"),
        "7000000000\n",
    )
    .unwrap();
    let batches = c.collect(8).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx4_0", "1");
    assert_eq!(u64_at(ports, "rcv_packets", r), Some(7_000_000_000));
    assert!(c.problems().is_empty(), "{:?}", c.problems());
    // The 32-bit set is cleared (`perfquery -R`) and counts again from 0;
    // the 64-bit set is not. The counter stays on the 64-bit set: back on
    // the 32-bit one it would fall to 12, then leap by billions when that
    // stopped again, read as traffic.
    std::fs::write(port.join("counters/port_xmit_packets"), "12\n").unwrap();
    std::fs::write(
        port.join("counters_ext/port_xmit_packets_64"),
        "9000000500\n",
    )
    .unwrap();
    let batches = c.collect(9).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx4_0", "1");
    assert_eq!(u64_at(ports, "xmit_packets", r), Some(9_000_000_500));
    // And across the walk that comes once a minute.
    c.ticks = RESCAN_TICKS;
    let batches = c.collect(10).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx4_0", "1");
    assert_eq!(u64_at(ports, "xmit_packets", r), Some(9_000_000_500));
}

/// A counter on its 64-bit set whose file does not read for a tick (an
/// empty read, a refused query, "N/A (no PMA)") has no value that tick: the
/// stopped 32-bit value in its place, 355 GB falling to 17 GB and back,
/// was read by `increase()` as 355 GB sent. The same on the first tick
/// that finds the 32-bit counter stopped.
#[test]
fn a_wider_counter_that_does_not_read_for_a_tick_leaves_no_value() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture().join("../mlx4-node/sys"), &dir.path().join("sys"));
    let port = dir.path().join("sys/class/infiniband/mlx4_0/ports/1");
    let legacy = port.join("counters/port_rcv_data");
    let wide = port.join("counters_ext/port_rcv_data_64");
    std::fs::write(&legacy, "4294967295\n").unwrap();
    let mut c = collector(dir.path());
    let rcv_bytes = |c: &mut Infiniband, tick: i64| {
        let batches = c.collect(tick).unwrap();
        let ports = batch(&batches, &PORT);
        u64_at(ports, "rcv_data_bytes", row(ports, "mlx4_0", "1"))
    };
    for (tick, unreadable) in [(1, ""), (2, "N/A (no PMA)\n")] {
        std::fs::write(&wide, unreadable).unwrap();
        assert_eq!(rcv_bytes(&mut c, tick), None, "{unreadable:?}, first found stopped");
    }
    std::fs::write(&wide, "88888888888\n").unwrap();
    assert_eq!(rcv_bytes(&mut c, 3), Some(88_888_888_888 * 4));
    for (tick, unreadable) in [(4, ""), (5, "N/A (no PMA)\n"), (6, "-1\n")] {
        std::fs::write(&wide, unreadable).unwrap();
        assert_eq!(rcv_bytes(&mut c, tick), None, "{unreadable:?}, on the wider set");
        assert!(
            c.problems().iter().any(|p| p.contains("port_rcv_data_64")),
            "{:?}",
            c.problems()
        );
    }
    std::fs::write(&wide, "88888898888\n").unwrap();
    assert_eq!(rcv_bytes(&mut c, 7), Some(88_888_898_888 * 4));
}

/// mlx5 says Disabled of a RoCE port whose netdev is down or has no
/// carrier: a pulled cable is not a port someone disabled.
#[test]
fn a_roce_port_disabled_names_the_interface_and_its_carrier() {
    let dir = fixture_copy();
    let port = dir.path().join("sys/class/infiniband/mlx5_8/ports/1");
    std::fs::write(port.join("state"), "1: DOWN\n").unwrap();
    std::fs::write(port.join("phys_state"), "3: Disabled\n").unwrap();
    let mut c = collector(dir.path());
    c.collect(7).unwrap();
    let problems = c.problems();
    assert!(
        problems.iter().any(|p| p.starts_with(
            "mlx5_8/1 is DOWN/Disabled: its Ethernet interface is down or has no carrier"
        )),
        "{problems:?}"
    );
}

/// Some drivers (bnxt_re) list current values beside their counters: live
/// object counts, high-water marks, a register. They are no counters, and
/// are left out; the counters beside them are read.
#[test]
fn current_values_in_hw_counters_are_left_out() {
    let dir = fixture_copy();
    let hw = dir.path().join("sys/class/infiniband/mlx5_8/ports/1/hw_counters");
    for (name, value) in [
        ("active_qps", "17"),
        ("watermark_qps", "40"),
        ("db_fifo_register", "2147483648"),
        ("resize_cq_cnt", "3"),
    ] {
        std::fs::write(hw.join(name), format!("{value}\n")).unwrap();
    }
    let mut c = collector(dir.path());
    let batches = c.collect(7).unwrap();
    let hw = batch(&batches, &HW_COUNTER);
    for name in ["active_qps", "watermark_qps", "db_fifo_register"] {
        assert_eq!(hw_value(hw, "mlx5_8", "1", name), None, "{name}");
    }
    assert_eq!(hw_value(hw, "mlx5_8", "1", "resize_cq_cnt"), Some(3));
}

#[test]
fn probe_summarises_the_ports() {
    let mut c = collector(&fixture());
    let Availability::Available(summary) = c.probe() else {
        panic!("absent");
    };
    assert!(
        summary.starts_with(
            "9 HCAs, 9 ports: mlx5_0/1 ACTIVE 400 Gb/s IB, mlx5_1/1 ACTIVE 400 Gb/s IB, "
        ),
        "{summary}"
    );
    assert!(summary.contains("mlx5_5/1 DOWN 10 Gb/s IB"), "{summary}");
    assert!(
        summary.ends_with("mlx5_8/1 ACTIVE 100 Gb/s RoCE"),
        "{summary}"
    );
}

#[test]
fn absent_without_rdma_devices() {
    let vm = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/vm-node"
    ));
    let mut c = collector(&vm);
    let Availability::Absent(reason) = c.probe() else {
        panic!("present");
    };
    assert!(
        reason.starts_with("no ")
            && reason.ends_with("sys/class/infiniband: no RDMA devices or driver not loaded"),
        "{reason}"
    );
    assert!(c.collect(1).unwrap().is_empty());

    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty.path().join("sys/class/infiniband")).unwrap();
    let Availability::Absent(reason) = collector(empty.path()).probe() else {
        panic!("present");
    };
    assert!(reason.ends_with("is empty: no RDMA devices"), "{reason}");
}

#[test]
fn devices_and_hw_counters_settings() {
    let config = InfinibandConfig {
        devices: vec!["mlx5_8".into(), "mlx5_9".into()],
        hw_counters: false,
        ..InfinibandConfig::default()
    };
    let mut c = Infiniband::new(&config, &roots(&fixture()));
    let batches = c.collect(1).unwrap();
    assert_eq!(batch(&batches, &PORT).len(), 1);
    assert!(!batches.iter().any(|b| b.table.name == HW_COUNTER.name));
    assert_eq!(
        c.problems(),
        [format!(
            "collectors.infiniband.devices names mlx5_9, which is not under {}",
            fixture().join("sys/class/infiniband").display()
        )]
    );

    let config = InfinibandConfig {
        devices: vec!["mlx4_0".into()],
        ..InfinibandConfig::default()
    };
    let Availability::Absent(reason) = Infiniband::new(&config, &roots(&fixture())).probe()
    else {
        panic!("present");
    };
    assert!(
        reason.starts_with("none of collectors.infiniband.devices (mlx4_0)"),
        "{reason}"
    );
}

#[test]
fn config_keys() {
    let config: InfinibandConfig =
        toml::from_str("hw_counters = false\ndevices = [\"mlx5_0\"]\n").unwrap();
    assert!(!config.hw_counters);
    assert_eq!(config.devices, ["mlx5_0"]);
    assert!(toml::from_str::<InfinibandConfig>("hw_counter = true\n").is_err());
    for key in ["hw_counters", "devices"] {
        assert!(KEY_DOCS.iter().any(|(k, _)| *k == key), "{key}");
    }
}

#[test]
fn rates() {
    let gbit = 1_000_000_000;
    for (text, bits) in [
        ("100 Gb/sec (4X EDR)\n", 100 * gbit),
        ("400 Gb/sec (4X NDR)\n", 400 * gbit),
        ("200 Gb/sec (4X HDR)\n", 200 * gbit),
        ("25 Gb/sec (1X EDR)\n", 25 * gbit),
        ("10 Gb/sec (4X SDR)\n", 10 * gbit),
        ("2.5 Gb/sec (1X SDR)\n", 2_500_000_000),
        ("56 Gb/sec (4X FDR)\n", 56 * gbit),
        ("40 Gb/sec (4X FDR10)\n", 40 * gbit),
        ("800 Gb/sec (8X NDR)\n", 800 * gbit),
        ("14.0625 Gb/sec (1X FDR)\n", 14_062_500_000),
        ("10 Gb/sec\n", 10 * gbit),
        ("10 Gb/sec (4X)", 10 * gbit),
    ] {
        assert_eq!(parse_rate(text), Ok(bits), "{text:?}");
    }
    for bad in [
        "",
        "\n",
        "fast\n",
        "100 Mb/sec (4X EDR)\n",
        "100Gb/sec\n",
        "-1 Gb/sec (4X)\n",
        "1. Gb/sec\n",
        ".5 Gb/sec\n",
        "100 Gb/sec (4X EDR\n",
        "99999999999999999999 Gb/sec\n",
        "20000000000 Gb/sec\n",
    ] {
        assert!(parse_rate(bad).is_err(), "{bad:?}");
    }
    assert_eq!(format_gbits(2_500_000_000), "2.5");
    assert_eq!(format_gbits(400 * gbit), "400");
}

#[test]
fn states_and_counters() {
    assert_eq!(parse_state("4: ACTIVE\n", STATES, 0), Ok((4, "ACTIVE")));
    assert_eq!(
        parse_state("5: ACTIVE_DEFER\n", STATES, 0),
        Ok((5, "ACTIVE_DEFER"))
    );
    assert_eq!(parse_state("7: UNKNOWN\n", STATES, 0), Ok((7, "UNKNOWN")));
    assert_eq!(
        parse_state("5: LinkUp\n", PHYS_STATES, 1),
        Ok((5, "LinkUp"))
    );
    assert_eq!(
        parse_state("7: Phy Test\n", PHYS_STATES, 1),
        Ok((7, "Phy Test"))
    );
    assert_eq!(
        parse_state("9: <unknown>\n", PHYS_STATES, 1),
        Ok((9, "<unknown>"))
    );
    assert_eq!(
        parse_state("0: <unknown>\n", PHYS_STATES, 1),
        Ok((0, "<unknown>"))
    );
    for bad in [
        "4: ACTIV\n",
        "4: DOWN\n",
        "4:ACTIVE\n",
        ": ACTIVE\n",
        "x: ACTIVE\n",
        "",
        "4",
    ] {
        assert!(parse_state(bad, STATES, 0).is_err(), "{bad:?}");
    }
    assert_eq!(parse_counter("123\n"), Ok(Some(123)));
    assert_eq!(parse_counter("18446744073709551615\n"), Ok(Some(u64::MAX)));
    assert_eq!(parse_counter("N/A (no PMA)\n"), Ok(None));
    for bad in [
        "",
        "\n",
        "12x\n",
        "-1\n",
        "18446744073709551616\n",
        " 1\n",
        "1 2\n",
    ] {
        assert!(parse_counter(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_port_removed_between_ticks_stops_its_rows() {
    let dir = fixture_copy();
    let mut c = collector(dir.path());
    let first = c.collect(1).unwrap();
    assert_eq!(batch(&first, &PORT).len(), 9);
    let class = dir.path().join("sys/class/infiniband");
    std::fs::remove_dir_all(class.join("mlx5_7/ports/1")).unwrap();
    std::fs::remove_dir_all(class.join("mlx5_8")).unwrap();
    let second = c.collect(2).unwrap();
    let ports = batch(&second, &PORT);
    assert_eq!(ports.len(), 7);
    assert!((0..ports.len())
        .all(|r| !["mlx5_7", "mlx5_8"].contains(&tag(ports, "device", r).as_str())));
    let hw = batch(&second, &HW_COUNTER);
    assert!((0..hw.len()).all(|r| tag(hw, "device", r) != "mlx5_8"));
    // mlx5_7 still exists, without ports.
    assert_eq!(batch(&second, &DEVICE).len(), 8);
    // And it comes back.
    copy_tree(
        &fixture().join("sys/class/infiniband/mlx5_8"),
        &class.join("mlx5_8"),
    );
    assert_eq!(batch(&c.collect(3).unwrap(), &PORT).len(), 8);
}

#[test]
fn a_port_vanishing_mid_walk_is_skipped() {
    // The walk is cached: remove a port without changing the device list,
    // so the next tick finds the cached files missing mid-read.
    let dir = fixture_copy();
    let mut c = collector(dir.path());
    c.collect(1).unwrap();
    let port = dir.path().join("sys/class/infiniband/mlx5_2/ports/1");
    std::fs::remove_dir_all(port.join("counters")).unwrap();
    std::fs::remove_dir_all(port.join("hw_counters")).unwrap();
    // The counters went but the port stayed: nulls.
    let batches = c.collect(2).unwrap();
    let ports = batch(&batches, &PORT);
    assert_eq!(ports.len(), 9);
    let r = row(ports, "mlx5_2", "1");
    assert_eq!(u64_at(ports, "xmit_data_bytes", r), None);
    assert_eq!(u64_at(ports, "state", r), Some(4));
    // Now the whole port goes, between a walk and a read.
    std::fs::remove_dir_all(&port).unwrap();
    c.stale = false;
    c.ticks = 1;
    let batches = c.collect(3).unwrap();
    assert_eq!(batch(&batches, &PORT).len(), 8);
    assert!(c.stale, "a vanished port asks for a new walk");
}

#[test]
fn a_missing_optional_file_is_null() {
    let dir = fixture_copy();
    let port = dir.path().join("sys/class/infiniband/mlx5_0/ports/1");
    std::fs::remove_file(port.join("counters/port_xmit_wait")).unwrap();
    std::fs::remove_file(port.join("rate")).unwrap();
    std::fs::write(port.join("counters/VL15_dropped"), "N/A (no PMA)\n").unwrap();
    let batches = collector(dir.path()).collect(1).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx5_0", "1");
    assert_eq!(u64_at(ports, "xmit_wait", r), None);
    assert_eq!(u64_at(ports, "vl15_dropped", r), None);
    assert_eq!(f64_at(ports, "rate_bytes_per_second", r), None);
    assert_eq!(u64_at(ports, "symbol_error", r), Some(0));
    let link = batch(&batches, &LINK);
    assert_eq!(tag(link, "rate", row(link, "mlx5_0", "1")), "");
}

/// Every tag and value of every row, keyed `table device/port/counter
/// name`: what two reads of a tree can be compared by.
fn cells(batches: &[Batch]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for b in batches {
        for r in 0..b.len() {
            let ids: Vec<String> = ["device", "port", "counter"]
                .iter()
                .filter(|t| b.table.tag_index(t).is_some())
                .map(|t| tag(b, t, r))
                .collect();
            let id = format!("{} {}", b.table.name, ids.join("/"));
            for t in b.table.tags {
                if !["device", "port", "counter"].contains(&t.name) {
                    out.insert(format!("{id} {}", t.name), tag(b, t.name, r));
                }
            }
            for (i, field) in b.table.fields.iter().enumerate() {
                let column = &b.fields[i];
                let shown = if !column.is_valid(r) {
                    "null".to_string()
                } else {
                    match &column.values {
                        Values::U64(v) => v[r].to_string(),
                        Values::F64(v) => v[r].to_string(),
                        Values::I64(v) => v[r].to_string(),
                    }
                };
                out.insert(format!("{id} {}", field.name), shown);
            }
        }
    }
    out
}

/// One file of one port or device holding what the kernel never writes
/// (issue 36, item 6): the tick succeeds, that file's value alone is lost
/// (a null, or an empty tag), every other port, counter and device reads
/// as from the intact tree, and the file is named in `source_errors`.
/// Mended, the next walk reads it with no error.
#[test]
fn a_bad_file_costs_only_its_own_value() {
    let intact = cells(&collector(fixture_copy().path()).collect(1).unwrap());
    for (rel, content, lost, reason) in [
        (
            "mlx5_1/ports/1/counters/symbol_error",
            "12x\n",
            &["infiniband_port mlx5_1/1 symbol_error"][..],
            "\"12x\" is not a counter",
        ),
        (
            "mlx5_1/ports/1/counters/port_rcv_data",
            "",
            &["infiniband_port mlx5_1/1 rcv_data_bytes"],
            "empty",
        ),
        (
            "mlx5_1/ports/1/counters/port_xmit_data",
            "18446744073709551616\n",
            &["infiniband_port mlx5_1/1 xmit_data_bytes"],
            "\"18446744073709551616\" overflows 64 bits",
        ),
        // Fits in 64 bits, but not once scaled to bytes.
        (
            "mlx5_1/ports/1/counters/port_rcv_data",
            "18446744073709551615\n",
            &["infiniband_port mlx5_1/1 rcv_data_bytes"],
            "18446744073709551615 times 4 overflows 64 bits",
        ),
        (
            "mlx5_1/ports/1/state",
            "4: ACTIV\n",
            &[
                "infiniband_port mlx5_1/1 state",
                "infiniband_link mlx5_1/1 state",
            ],
            "\"4: ACTIV\" is not a port state",
        ),
        (
            "mlx5_1/ports/1/phys_state",
            "5\n",
            &[
                "infiniband_port mlx5_1/1 phys_state",
                "infiniband_link mlx5_1/1 phys_state",
            ],
            "\"5\" is not a port state",
        ),
        (
            "mlx5_1/ports/1/rate",
            "fast\n",
            &[
                "infiniband_port mlx5_1/1 rate_bytes_per_second",
                "infiniband_link mlx5_1/1 rate",
            ],
            "\"fast\" is not a rate in Gb/sec",
        ),
        (
            "mlx5_1/ports/1/lid",
            "12\n",
            &["infiniband_link mlx5_1/1 lid"],
            "\"12\" is not a hex LID",
        ),
        (
            "mlx5_1/ports/1/link_layer",
            "Token Ring\n",
            &["infiniband_link mlx5_1/1 link_layer"],
            "unknown link layer \"Token Ring\"",
        ),
        (
            "mlx5_8/ports/1/hw_counters/np_cnp_sent",
            "lots\n",
            &["infiniband_hw mlx5_8/1/np_cnp_sent value"],
            "\"lots\" is not a counter",
        ),
        (
            "mlx5_8/ports/1/hw_counters/out_of_buffer",
            "\u{0}\u{0}\n",
            &["infiniband_hw mlx5_8/1/out_of_buffer value"],
            "\"\\0\\0\" is not a counter",
        ),
        (
            "mlx5_0/fw_ver",
            "\u{ff}\u{fe}\n",
            &["infiniband_device mlx5_0 fw_ver"],
            "not UTF-8 text",
        ),
    ] {
        let dir = fixture_copy();
        let path = dir.path().join("sys/class/infiniband").join(rel);
        if rel.ends_with("fw_ver") {
            std::fs::write(&path, b"\xff\xfe\n").unwrap();
        } else {
            std::fs::write(&path, content).unwrap();
        }
        let mut c = collector(dir.path());
        let damaged = cells(&c.collect(1).unwrap());
        assert_eq!(
            damaged.keys().collect::<Vec<_>>(),
            intact.keys().collect::<Vec<_>>(),
            "{rel}: every row is there"
        );
        let changed: Vec<&str> = intact
            .iter()
            .filter(|(k, v)| damaged[*k] != **v)
            .map(|(k, _)| k.as_str())
            .collect();
        let mut lost = lost.to_vec();
        lost.sort_unstable();
        assert_eq!(changed, lost, "{rel}");
        for key in &lost {
            assert!(
                ["null", ""].contains(&damaged[*key].as_str()),
                "{rel}: {key} = {}",
                damaged[*key]
            );
        }
        let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(errors, [format!("{}: {reason}", path.display())], "{rel}");
        // A file read at the walk is named at every tick until mended.
        assert_eq!(c.collect(2).unwrap().len(), 4);
        assert_eq!(c.source_errors().len(), 1, "{rel}");
        assert!(matches!(c.probe(), Availability::Available(_)), "{rel}");
        // Mended: read again (the walk's files at the next walk) with no error.
        std::fs::copy(fixture().join("sys/class/infiniband").join(rel), &path).unwrap();
        c.stale = true;
        assert_eq!(cells(&c.collect(3).unwrap()), intact, "{rel}");
        assert!(c.source_errors().is_empty(), "{rel}");
    }
}

/// A device whose ports cannot be listed is left out; the others are read.
#[test]
fn a_device_that_cannot_be_listed_costs_only_itself() {
    let dir = fixture_copy();
    let ports = dir.path().join("sys/class/infiniband/mlx5_4/ports");
    std::fs::remove_dir_all(&ports).unwrap();
    std::fs::write(&ports, "not a directory\n").unwrap();
    let mut c = collector(dir.path());
    let batches = c.collect(1).unwrap();
    assert_eq!(batch(&batches, &PORT).len(), 8);
    assert_eq!(batch(&batches, &DEVICE).len(), 8);
    let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&format!("{}: ", ports.display())),
        "{errors:?}"
    );
}

#[test]
fn follows_device_symlinks() {
    // Real sysfs: class/infiniband/mlx5_0 -> ../../devices/pci.../infiniband/mlx5_0
    let dir = tempfile::tempdir().unwrap();
    let real = dir
        .path()
        .join("sys/devices/pci0000:00/0000:00:01.0/infiniband");
    copy_tree(
        &fixture().join("sys/class/infiniband/mlx5_8"),
        &real.join("mlx5_8"),
    );
    let class = dir.path().join("sys/class/infiniband");
    std::fs::create_dir_all(&class).unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/0000:00:01.0/infiniband/mlx5_8",
        class.join("mlx5_8"),
    )
    .unwrap();
    let batches = collector(dir.path()).collect(1).unwrap();
    let ports = batch(&batches, &PORT);
    assert_eq!(ports.len(), 1);
    assert_eq!(
        u64_at(ports, "rcv_packets", 0),
        Some(2_810_394_821 + 8 * 7919)
    );
    assert_eq!(batch(&batches, &HW_COUNTER).len(), 29);
}

#[test]
fn the_walk_is_redone_only_when_needed() {
    let dir = fixture_copy();
    let mut c = collector(dir.path());
    c.collect(1).unwrap();
    // A new counter file appears: not seen until a walk.
    let port = dir.path().join("sys/class/infiniband/mlx5_3/ports/1");
    std::fs::write(port.join("counters/port_xmit_wait"), "77\n").unwrap();
    let batches = c.collect(2).unwrap();
    let ports = batch(&batches, &PORT);
    assert_eq!(u64_at(ports, "xmit_wait", row(ports, "mlx5_3", "1")), None);
    // A device appearing is noticed at once, and rewalks the rest.
    copy_tree(
        &fixture().join("sys/class/infiniband/mlx5_8"),
        &dir.path().join("sys/class/infiniband/mlx5_9"),
    );
    let batches = c.collect(3).unwrap();
    let ports = batch(&batches, &PORT);
    assert_eq!(ports.len(), 10);
    assert_eq!(
        u64_at(ports, "xmit_wait", row(ports, "mlx5_3", "1")),
        Some(77)
    );
}

#[test]
fn kept_files_give_fresh_values_and_descriptions_wait_for_a_walk() {
    let dir = fixture_copy();
    let mut c = collector(dir.path());
    c.collect(1).unwrap();
    let class = dir.path().join("sys/class/infiniband");
    let port = class.join("mlx5_1/ports/1");
    // Rewritten in place, as the kernel renders a counter anew on each read.
    std::fs::write(port.join("counters/symbol_error"), "13\n").unwrap();
    std::fs::write(port.join("state"), "1: DOWN\n").unwrap();
    std::fs::write(port.join("rate"), "200 Gb/sec (4X HDR)\n").unwrap();
    std::fs::write(port.join("hw_counters/out_of_buffer"), "99\n").unwrap();
    // What describes the port and the HCA is read at the walk only.
    std::fs::write(port.join("lid"), "0x2f\n").unwrap();
    std::fs::write(class.join("mlx5_1/fw_ver"), "99.0.1\n").unwrap();
    let batches = c.collect(2).unwrap();
    let ports = batch(&batches, &PORT);
    let r = row(ports, "mlx5_1", "1");
    assert_eq!(u64_at(ports, "symbol_error", r), Some(13));
    assert_eq!(u64_at(ports, "state", r), Some(1));
    assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(25e9));
    let hw = batch(&batches, &HW_COUNTER);
    assert_eq!(hw_value(hw, "mlx5_1", "1", "out_of_buffer"), Some(99));
    let link = batch(&batches, &LINK);
    let r = row(link, "mlx5_1", "1");
    assert_eq!(tag(link, "state", r), "DOWN");
    assert_eq!(tag(link, "rate", r), "200 Gb/sec (4X HDR)");
    assert_eq!(tag(link, "lid", r), "0x1e");
    let devices = batch(&batches, &DEVICE);
    assert_eq!(tag(devices, "fw_ver", 1), "28.39.2048");
    // The periodic walk picks them up.
    c.ticks = RESCAN_TICKS;
    let batches = c.collect(3).unwrap();
    let link = batch(&batches, &LINK);
    assert_eq!(tag(link, "lid", row(link, "mlx5_1", "1")), "0x2f");
    assert_eq!(tag(batch(&batches, &DEVICE), "fw_ver", 1), "99.0.1");
    // A rate that goes unreadable leaves an empty tag, not the last text.
    std::fs::remove_file(port.join("rate")).unwrap();
    c.stale = true;
    let batches = c.collect(4).unwrap();
    let link = batch(&batches, &LINK);
    assert_eq!(tag(link, "rate", row(link, "mlx5_1", "1")), "");
}

#[test]
fn a_port_deleted_under_its_kept_files_is_noticed_without_its_directory() {
    // Where the walk could not hold the port directory open, the kept
    // state file tells that the port was deleted.
    let dir = fixture_copy();
    let mut c = collector(dir.path());
    c.collect(1).unwrap();
    for device in &mut c.devices {
        for port in &mut device.ports {
            port.dir_file = None;
        }
    }
    let port = dir.path().join("sys/class/infiniband/mlx5_4/ports/1");
    std::fs::remove_dir_all(&port).unwrap();
    c.stale = false;
    let batches = c.collect(2).unwrap();
    let ports = batch(&batches, &PORT);
    assert_eq!(ports.len(), 8);
    assert!((0..ports.len()).all(|r| tag(ports, "device", r) != "mlx5_4"));
    assert!(c.stale, "a vanished port asks for a new walk");
}

/// An InfiniBand controller on the PCI bus that the kernel made no RDMA
/// device of (the driver did not bring it up) is named as a source that
/// reads badly while the other HCAs are read; with none brought up, the
/// collector fails rather than waiting as on a node without HCAs. A
/// virtual function without a device is idle, not missing.
#[test]
fn an_hca_on_the_bus_without_an_rdma_device_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    crate::testutil::copy_tree(&fixture().join("sys"), &sys);
    let function = |address: &str| {
        std::fs::canonicalize(sys.join("bus/pci/devices").join(address)).unwrap()
    };
    // 0000:3b:00.0 is mlx5_2.
    std::fs::remove_dir_all(function("0000:3b:00.0").join("infiniband")).unwrap();
    std::fs::remove_dir_all(sys.join("class/infiniband/mlx5_2")).unwrap();
    let mut c = collector(dir.path());
    assert!(matches!(c.probe(), Availability::Available(_)));
    let batches = c.collect(1_000_000).unwrap();
    let errors = c.source_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0].path,
        sys.join("bus/pci/devices/0000:3b:00.0").display().to_string()
    );
    assert!(
        errors[0]
            .reason
            .starts_with("an InfiniBand controller bound to mlx5_core with no RDMA device"),
        "{}",
        errors[0].reason
    );
    let port = batch(&batches, &PORT);
    let devices: std::collections::BTreeSet<String> =
        (0..port.len()).map(|r| tag(port, "device", r)).collect();
    assert_eq!(devices.len(), 8, "the others are read: {devices:?}");
    // Named again at every tick, not only when the list changed.
    c.collect(2_000_000).unwrap();
    assert_eq!(c.source_errors().len(), 1);

    // Made a virtual function: idle, not missing.
    std::os::unix::fs::symlink("../0000:37:01.0", function("0000:3b:00.0").join("physfn")).unwrap();
    std::fs::remove_dir_all(sys.join("class/infiniband/mlx5_3")).unwrap();
    c.collect(3_000_000).unwrap();
    assert_eq!(c.source_errors(), []);

    // No RDMA device at all (mlx5_ib not loaded): not a node without HCAs.
    std::fs::remove_dir_all(sys.join("class/infiniband")).unwrap();
    for entry in std::fs::read_dir(sys.join("bus/pci/devices")).unwrap() {
        let rdma = entry.unwrap().path().join("infiniband");
        if rdma.is_dir() {
            std::fs::remove_dir_all(rdma).unwrap();
        }
    }
    let mut c = collector(dir.path());
    let Availability::Failed(error) = c.probe() else {
        panic!("an HCA on the bus, none read, is not absent");
    };
    // Seven: 0000:3b:00.0 is a virtual function now.
    assert!(
        error.starts_with("7 InfiniBand controllers on the PCI bus and no RDMA device of any ("),
        "{error}"
    );
    assert!(error.contains("bus/pci/devices/0000:19:00.0, "), "{error}");
    assert!(!error.contains("0000:3b:00.0"), "{error}");
}
