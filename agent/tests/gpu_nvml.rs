//! The GPU collector's NVML backend end to end, on a fake NVML
//! (`fake_nvml/libnvidia-ml.c`) put first on `LD_LIBRARY_PATH`: what NVML
//! says in its units reaches /metrics and the store in ours, the backend
//! makes only the driver calls its read plan asks for, a GPU that falls off
//! the bus stops nothing else (nor one lost when the agent starts), XID
//! counting outlives failures, and older drivers are read through the calls
//! they have, losing only the values they lack. The simulated backend
//! stands in for NVML everywhere else; this is the real backend's one run
//! without a GPU.

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::fake_nvml::{Driver, FakeNvml, Tick};
use common::Agent;

const GPU0: &str = "gpu=\"0\",gpu_uuid=\"GPU-fa4e0000-0000-0000-0000-000000000000\"";
const GPU1: &str = "gpu=\"1\",gpu_uuid=\"GPU-fa4e0000-0000-0000-0000-000000000001\"";

/// `vtax run` on the fake, with `config` as its config file.
fn start(fake: &FakeNvml, dir: &std::path::Path, config: &str) -> Agent {
    start_with_args(fake, dir, config, &[])
}

/// [`start`] with `more` flags.
fn start_with_args(fake: &FakeNvml, dir: &std::path::Path, config: &str, more: &[&str]) -> Agent {
    let config_path = dir.join("vtax.toml");
    std::fs::write(&config_path, config).unwrap();
    let data = dir.join("data");
    let env = fake.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut args = vec![
        "--config",
        config_path.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--no-collector.cgroups",
        "--no-collector.jitter",
    ];
    args.extend_from_slice(more);
    Agent::start_with_env(&args, &env)
}

/// The value of the one series `series` (name and labels, exactly) in `body`.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// The value of `series` on the agent's /metrics now.
fn served(agent: &Agent, series: &str) -> Option<f64> {
    value(&agent.get("/metrics", &[]).text(), series)
}

fn sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

/// Seconds of the day of a store row's RFC 3339 time.
fn seconds_of(row: &serde_json::Value) -> f64 {
    let time = row["time"].as_str().unwrap();
    let clock = time.split('T').nth(1).unwrap().trim_end_matches('Z');
    let mut parts = clock.split(':').map(|p| p.parse::<f64>().unwrap());
    let (h, m, s) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    h * 3600.0 + m * 60.0 + s
}

#[test]
fn what_nvml_says_is_served_and_stored_in_our_units() {
    let mut processes = [sleeper(), sleeper(), sleeper(), sleeper()];
    let pids: Vec<u32> = processes.iter().map(Child::id).collect();
    let dir = tempfile::tempdir().unwrap();
    // GPU 0 at work with two processes and a third that uses none of it,
    // 16 of its 18 NVLink links up; GPU 1 with MIG on, two instances and
    // one process in the first.
    let fake = FakeNvml::new(
        Driver::Current,
        &format!(
            "gpu=0 utilization=80 memory_utilization=35 memory_used=21474836480 power_mw=350500 \
             temperature=61 memory_temperature=70 sm_mhz=1980 clock_event_reasons=4 pcie_gen=5 \
             gpm_sm=62.5 gpm_occupancy=40 gpm_tensor=30 gpm_dram=55 gpm_pcie_rx_mib=100 \
             gpm_pcie_tx_mib=200 gpm_nvlink_rx_mib=1600 gpm_nvlink_tx_mib=800 nvlinks_up=16 \
             nvlink_crc_errors=5 ecc_corrected=3 ecc_uncorrected=1 remapped_correctable=2 \
             remap_pending=1 pcie_replays=7 \
             processes={}:2147483648:40:20,{}:1073741824:10:5,{}:1048576\n\
             gpu=1 mig=1 mig_instances=2 power_mw=90000 processes={}:536870912\n",
            pids[0], pids[1], pids[3], pids[2]
        ),
    );
    let agent = start(
        &fake,
        dir.path(),
        "[collectors.gpu]\nenergy_interval_secs = 2\nprocess_shares_interval_secs = 0\n",
    );
    // The third tick: GPM has two samples, and the links' rates are asked
    // for the links up.
    agent.wait_for_value(
        &format!("vtax_gpu_nvlink_rx_bytes_per_second{{{GPU0},link=\"15\"}}"),
        |_| true,
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(2500));
    let body = agent.get("/metrics", &[]).text();
    let mib = 1024.0 * 1024.0;
    for (series, expected) in [
        ("vtax_gpu_utilization_ratio", 0.8),
        ("vtax_gpu_memory_utilization_ratio", 0.35),
        ("vtax_gpu_memory_used_bytes", 21474836480.0),
        ("vtax_gpu_memory_total_bytes", 85899345920.0),
        ("vtax_gpu_power_watts", 350.5),
        ("vtax_gpu_power_limit_watts", 700.0),
        ("vtax_gpu_temperature_celsius", 61.0),
        ("vtax_gpu_memory_temperature_celsius", 70.0),
        ("vtax_gpu_sm_clock_hertz", 1.98e9),
        ("vtax_gpu_sm_clock_max_hertz", 1.98e9),
        ("vtax_gpu_memory_clock_hertz", 2.619e9),
        ("vtax_gpu_clock_event_reasons", 4.0),
        ("vtax_gpu_sm_active_ratio", 0.625),
        ("vtax_gpu_sm_occupancy_ratio", 0.4),
        ("vtax_gpu_tensor_active_ratio", 0.3),
        ("vtax_gpu_dram_bandwidth_ratio", 0.55),
        ("vtax_gpu_pcie_rx_bytes_per_second", 100.0 * mib),
        ("vtax_gpu_pcie_tx_bytes_per_second", 200.0 * mib),
        ("vtax_gpu_nvlink_total_rx_bytes_per_second", 1600.0 * mib),
        ("vtax_gpu_nvlink_total_tx_bytes_per_second", 800.0 * mib),
        ("vtax_gpu_nvlink_links_up", 16.0),
        ("vtax_gpu_pcie_link_gen", 5.0),
        ("vtax_gpu_pcie_link_width", 16.0),
        ("vtax_gpu_pcie_link_gen_max", 5.0),
        ("vtax_gpu_pcie_replays_total", 7.0),
        ("vtax_gpu_ecc_corrected_errors_total", 3.0),
        ("vtax_gpu_ecc_uncorrected_errors_total", 1.0),
        ("vtax_gpu_remapped_rows_correctable", 2.0),
        ("vtax_gpu_remapping_pending", 1.0),
        ("vtax_gpu_health_up", 1.0),
    ] {
        let series = format!("{series}{{{GPU0}}}");
        assert_eq!(value(&body, &series), Some(expected), "{series}\n{body}");
    }
    // Each link up carries its share of GPM's rates; the two down, none.
    let link = |name: &str, link: u32| value(&body, &format!("{name}{{{GPU0},link=\"{link}\"}}"));
    assert_eq!(
        link("vtax_gpu_nvlink_rx_bytes_per_second", 0),
        Some(100.0 * mib)
    );
    assert_eq!(
        link("vtax_gpu_nvlink_tx_bytes_per_second", 15),
        Some(50.0 * mib)
    );
    assert_eq!(link("vtax_gpu_nvlink_rx_bytes_per_second", 16), None);
    assert_eq!(link("vtax_gpu_nvlink_up", 16), Some(0.0));
    assert_eq!(link("vtax_gpu_nvlink_up", 15), Some(1.0));
    assert_eq!(link("vtax_gpu_nvlink_crc_errors_total", 0), Some(5.0));
    assert!(body.contains(&format!(
        "vtax_gpu_info{{{GPU0},name=\"NVIDIA H100 80GB HBM3\",pci_bus_id=\"00000000:18:00.0\",\
         architecture=\"hopper\",virtualization_mode=\"passthrough\",mig=\"off\",\
         driver_version=\"550.54.15\",backend=\"nvml\"}} 1"
    )));

    // The processes, found by pid, named from /proc, with their shares.
    let process = |name: &str, pid: u32| process_series(&body, name, pid).to_string();
    let memory = process("vtax_gpu_process_used_memory_bytes", pids[0]);
    assert!(memory.starts_with(&format!("vtax_gpu_process_used_memory_bytes{{{GPU0},")));
    assert!(memory.contains("command=\"sleep\""), "{memory}");
    assert!(memory.ends_with(" 2147483648"), "{memory}");
    assert!(process("vtax_gpu_process_sm_utilization_ratio", pids[1]).ends_with(" 0.1"));
    assert!(process("vtax_gpu_process_memory_utilization_ratio", pids[0]).ends_with(" 0.2"));
    // The driver gives no sample for a process that used none of the GPU:
    // its share is 0, not unknown.
    let idle = process("vtax_gpu_process_sm_utilization_ratio", pids[3]);
    assert!(idle.ends_with(" 0"), "{idle}");

    // MIG: no GPU-wide utilisation; each instance by the id the driver
    // gives it, which is not its handle's index; the process in its instance.
    assert_eq!(
        value(&body, &format!("vtax_gpu_utilization_ratio{{{GPU1}}}")),
        None
    );
    assert!(body.contains(&format!("vtax_gpu_info{{{GPU1},")) && body.contains("mig=\"on\""));
    let instances: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with(&format!("vtax_gpu_mig_memory_total_bytes{{{GPU1},")))
        .collect();
    assert_eq!(instances.len(), 2, "{body}");
    for instance in ["1", "3"] {
        assert!(
            instances
                .iter()
                .any(|l| l.contains(&format!("gpu_instance=\"{instance}\""))
                    && l.ends_with(" 42949672960")),
            "instance {instance}: {instances:?}"
        );
    }
    // The profile, not NVML's whole name for the device ("<product> MIG 1g.40GB").
    assert!(
        instances.iter().all(|l| l.contains("profile=\"1g.40GB\"")),
        "{instances:?}"
    );
    assert!(process("vtax_gpu_process_gpu_instance", pids[2]).ends_with(" 1"));
    assert!(agent.stop());

    // The energy counter in joules, rising at the power drawn, over exact
    // reads (every 2 s) and the integration between them alike.
    let rows: Vec<_> = common::query_rows(&dir.path().join("data"), "gpu")
        .into_iter()
        .filter(|r| r["gpu"] == "0")
        .collect();
    assert!(rows.len() >= 4, "{rows:?}");
    let exact_reads = rows
        .iter()
        .filter(|r| r["energy_exact_age_seconds"].as_f64() == Some(0.0))
        .count();
    assert!(exact_reads >= 2, "{rows:?}");
    for pair in rows.windows(2) {
        let seconds = seconds_of(&pair[1]) - seconds_of(&pair[0]);
        let joules =
            pair[1]["energy_joules"].as_f64().unwrap() - pair[0]["energy_joules"].as_f64().unwrap();
        let watts = joules / seconds;
        assert!((watts - 350.5).abs() < 350.5 * 0.05, "{watts} W: {pair:?}");
    }
    for p in &mut processes {
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// Gaps in seconds between the ticks that made `call`.
fn gaps_seconds(ticks: &[Tick], call: &str) -> Vec<f64> {
    let at: Vec<i64> = ticks
        .iter()
        .filter(|t| t.made(call))
        .map(|t| t.at_us)
        .collect();
    at.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e6).collect()
}

#[test]
fn the_backend_calls_the_driver_only_for_the_reads_its_plan_asks_for() {
    let dir = tempfile::tempdir().unwrap();
    // GPU 0 under load with its link at its maximum and one process; GPU 1 quiet.
    let busy = "gpu=0 utilization=90 pcie_gen=5 gpm_pcie_rx_mib=10 gpm_pcie_tx_mib=10 processes=4242:1024\n";
    let fake = FakeNvml::new(Driver::Current, busy);
    let agent = start(
        &fake,
        dir.path(),
        "[collectors.gpu]\nenergy_interval_secs = 3\nslow_reads_interval_secs = 4\n\
         loaded_link_interval_secs = 3\n",
    );
    agent.wait_for_value(
        &format!("vtax_gpu_pcie_link_gen{{{GPU0}}}"),
        |v| v == 5.0,
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_secs(9));

    let busy_ticks = fake.ticks(0);
    assert!(busy_ticks.len() >= 8, "{busy_ticks:?}");
    for (i, tick) in busy_ticks.iter().enumerate() {
        // GPM every tick; its PCIe rates spare NVML's 20 ms throughput reads
        // from the second tick on.
        assert!(tick.made("nvmlGpmSampleGet"), "tick {i}: {tick:?}");
        assert_eq!(
            tick.made("nvmlDeviceGetPcieThroughput"),
            i == 0,
            "tick {i}: {tick:?}"
        );
        // One process: its shares are the GPU's utilisation, no driver call.
        assert!(
            !tick.made("nvmlDeviceGetProcessUtilization"),
            "tick {i}: {tick:?}"
        );
        // Everything slow together.
        let slow = tick.made("nvmlDeviceGetMigMode");
        for call in [
            "nvmlDeviceGetNvLinkState",
            "nvmlDeviceGetPcieReplayCounter",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetVirtualizationMode",
            "nvmlDeviceGetEnforcedPowerLimit",
        ] {
            assert_eq!(tick.made(call), slow, "tick {i}, {call}: {tick:?}");
        }
    }
    // Half a tick of slack on each cadence, as the plan has, and the ticks'
    // own lateness on this machine.
    let at_least = |call: &str, secs: f64, ticks: &[Tick]| {
        let gaps = gaps_seconds(ticks, call);
        assert!(!gaps.is_empty(), "{call} read once at most: {ticks:?}");
        assert!(
            gaps.iter().all(|&g| g >= secs - 0.6),
            "{call}: gaps {gaps:?}"
        );
    };
    at_least("nvmlDeviceGetTotalEnergyConsumption", 3.0, &busy_ticks);
    at_least("nvmlDeviceGetMigMode", 4.0, &busy_ticks);
    // The link at its maximum under load is held between reads.
    at_least("nvmlDeviceGetCurrPcieLinkGeneration", 3.0, &busy_ticks);
    assert_eq!(
        gaps_seconds(&busy_ticks, "nvmlDeviceGetCurrPcieLinkGeneration"),
        gaps_seconds(&busy_ticks, "nvmlDeviceGetCurrPcieLinkWidth")
    );

    // The quiet GPU: past its first two ticks, GPM and the PCIe link only
    // every slow_reads_interval_secs, together (NVML's PCIe throughput
    // never: GPM has it); the exact energy counter once.
    let quiet_ticks = fake.ticks(1);
    for (i, tick) in quiet_ticks.iter().enumerate().skip(2) {
        assert_eq!(
            tick.made("nvmlGpmSampleGet"),
            tick.made("nvmlDeviceGetCurrPcieLinkGeneration"),
            "tick {i}: {quiet_ticks:?}"
        );
        assert!(
            !tick.made("nvmlDeviceGetPcieThroughput"),
            "tick {i}: {quiet_ticks:?}"
        );
    }
    at_least("nvmlGpmSampleGet", 4.0, &quiet_ticks[1..]);
    let energy_reads = quiet_ticks
        .iter()
        .filter(|t| t.made("nvmlDeviceGetTotalEnergyConsumption"))
        .count();
    assert_eq!(energy_reads, 1, "{quiet_ticks:?}");

    // Under load the link trains down to Gen3: shown within the hold, then
    // read every tick while below its maximum.
    fake.set(&busy.replace("pcie_gen=5", "pcie_gen=3"));
    let changed_us = fake.calls().last().unwrap().at_us;
    agent.wait_for_value(
        &format!("vtax_gpu_pcie_link_gen{{{GPU0}}}"),
        |v| v == 3.0,
        Duration::from_secs(6),
    );
    std::thread::sleep(Duration::from_secs(3));
    let degraded: Vec<Tick> = fake
        .ticks(0)
        .into_iter()
        .filter(|t| t.at_us > changed_us)
        .collect();
    let first_read = degraded
        .iter()
        .position(|t| t.made("nvmlDeviceGetCurrPcieLinkGeneration"))
        .expect("the link read again");
    assert!(first_read <= 3, "{degraded:?}");
    assert!(degraded.len() - first_read >= 3, "{degraded:?}");
    assert!(
        degraded[first_read..]
            .iter()
            .all(|t| t.made("nvmlDeviceGetCurrPcieLinkGeneration")),
        "{degraded:?}"
    );
    assert!(agent.stop());

    // Every GPM sample allocated was freed but the one kept per GPU, which
    // the library keeps until it is unloaded.
    let calls = fake.calls();
    let count = |name: &str| calls.iter().filter(|c| c.name == name).count();
    let live = count("nvmlGpmSampleAlloc") - count("nvmlGpmSampleFree");
    assert!(live <= 2, "{live} GPM samples left");
}

#[test]
fn a_gpu_that_falls_off_the_bus_stops_nothing_else_and_is_back_when_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeNvml::new(Driver::Current, "gpu=1 xids=79\n");
    let agent = start(&fake, dir.path(), "");
    // The XID reaches the event thread, then the GPU falls off the bus.
    agent.wait_for_value(
        &format!("vtax_gpu_xid_errors_total{{{GPU1},xid=\"79\"}}"),
        |v| v == 1.0,
        Duration::from_secs(20),
    );
    let energy_before = served(&agent, &format!("vtax_gpu_energy_joules_total{{{GPU1}}}")).unwrap();
    fake.set("gpu=1 xids=79 lost=1\ngpu=0 power_mw=123000\n");
    agent.wait_for_value(
        &format!("vtax_gpu_health_up{{{GPU1}}}"),
        |v| v == 0.0,
        Duration::from_secs(10),
    );
    // GPU 0 goes on, with the value it says now.
    agent.wait_for_value(
        &format!("vtax_gpu_power_watts{{{GPU0}}}"),
        |v| v == 123.0,
        Duration::from_secs(5),
    );
    let body = agent.get("/metrics", &[]).text();
    assert_eq!(
        value(&body, &format!("vtax_gpu_health_up{{{GPU0}}}")),
        Some(1.0)
    );
    assert_eq!(
        value(&body, &format!("vtax_gpu_power_watts{{{GPU1}}}")),
        None,
        "{body}"
    );
    assert_eq!(
        value(&body, &format!("vtax_gpu_health_last_xid{{{GPU1}}}")),
        Some(79.0)
    );
    assert_eq!(
        value(&body, "vtax_collector_success{collector=\"gpu\"}"),
        Some(1.0)
    );
    // A lost GPU costs the driver one read a tick, after its handle.
    let lost_ticks = fake.ticks(1);
    let last = lost_ticks.last().unwrap();
    let calls: Vec<&str> = last.calls.keys().map(String::as_str).collect();
    assert_eq!(
        calls,
        [
            "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetMemoryInfo_v2"
        ],
        "{last:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let log = agent.log();
    assert_eq!(
        log.lines().filter(|l| l.contains("GPU lost")).count(),
        1,
        "{log}"
    );

    // It answers again after a reset, its energy counter started again: its
    // series come back, and the exported counter does not go back.
    fake.set("gpu=1 xids=79 energy_mj=5000\n");
    agent.wait_for_value(
        &format!("vtax_gpu_health_up{{{GPU1}}}"),
        |v| v == 1.0,
        Duration::from_secs(10),
    );
    agent.wait_for_value(
        &format!("vtax_gpu_power_watts{{{GPU1}}}"),
        |v| v == 70.0,
        Duration::from_secs(5),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let energy_after = served(&agent, &format!("vtax_gpu_energy_joules_total{{{GPU1}}}")).unwrap();
    assert!(
        energy_after >= energy_before,
        "{energy_after} after {energy_before}"
    );
    assert!(agent.stop());
    // In the order they happened (the store orders rows by series first).
    let mut rows: Vec<_> = common::query_rows(&dir.path().join("data"), "gpu_event")
        .into_iter()
        .filter(|r| r["gpu"] == "1")
        .collect();
    rows.sort_by(|a, b| a["time"].as_str().cmp(&b["time"].as_str()));
    let events: Vec<&str> = rows.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(events, ["xid", "lost", "recovered"], "{events:?}");
}

/// `vtax doctor --gpu` on the fake: its stdout.
fn doctor(fake: &FakeNvml) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(common::VTAX);
    command
        .args(["doctor", "--gpu", "--no-collector.cgroups", "--data-dir"])
        .arg(dir.path().join("data"))
        .envs(fake.env());
    common::stdout_of(&mut command)
}

/// A sysfs tree holding NVIDIA GPUs on the PCI bus at `functions`
/// (address, the driver bound to it), each a link into `devices/`.
fn pci_bus_with_gpus(sys: &std::path::Path, functions: &[(&str, Option<&str>)]) {
    let devices = sys.join("bus/pci/devices");
    std::fs::create_dir_all(&devices).unwrap();
    for (address, driver) in functions {
        let function = sys.join("devices/pci0000:00").join(address);
        std::fs::create_dir_all(&function).unwrap();
        std::fs::write(function.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(function.join("class"), "0x030200\n").unwrap();
        if let Some(driver) = driver {
            std::fs::create_dir_all(sys.join("bus/pci/drivers").join(driver)).unwrap();
            std::os::unix::fs::symlink(
                format!("../../../../bus/pci/drivers/{driver}"),
                function.join("driver"),
            )
            .unwrap();
        }
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{address}"),
            devices.join(address),
        )
        .unwrap();
    }
}

/// `vtax doctor --gpu` on the fake with the PCI bus of `sys`, and `env`.
fn doctor_on(fake: &FakeNvml, sys: &std::path::Path, env: &[(&str, &str)]) -> String {
    doctor_with(fake, sys, env, &[])
}

/// [`doctor_on`] with more arguments.
fn doctor_with(
    fake: &FakeNvml,
    sys: &std::path::Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(common::VTAX);
    command
        .args(["doctor", "--gpu", "--no-collector.cgroups", "--path.sysfs"])
        .arg(sys)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(args)
        .envs(fake.env())
        .envs(env.iter().copied());
    common::stdout_of(&mut command)
}

/// The GPUs on the PCI bus are what NVML should read. One that NVML leaves
/// out is named as a source that reads badly; when NVML does not start at
/// all, the collector reads badly (it fails, and is probed again) rather
/// than waiting as on a node without GPUs, and says what mends it. A GPU
/// bound to vfio-pci is a virtual machine's, not the host's to read.
#[test]
fn gpus_on_the_pci_bus_that_nvml_does_not_read_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    // The fake's two GPUs, a third that the driver did not bring up, a
    // fourth handed to a VM, and a vGPU host's SR-IOV slice of the first
    // (a virtual function, which NVML does not list as a GPU of its own).
    pci_bus_with_gpus(
        &sys,
        &[
            ("0000:18:00.0", Some("nvidia")),
            ("0000:28:00.0", Some("nvidia")),
            ("0000:38:00.0", Some("nvidia")),
            ("0000:48:00.0", Some("vfio-pci")),
            ("0000:18:00.4", Some("nvidia")),
        ],
    );
    std::os::unix::fs::symlink(
        "../0000:18:00.0",
        sys.join("devices/pci0000:00/0000:18:00.4/physfn"),
    )
    .unwrap();
    let fake = FakeNvml::new(Driver::Current, "");
    let stdout = doctor_on(&fake, &sys, &[]);
    let unlisted = format!("- gpu: {}/bus/pci/devices/0000:38:00.0: ", sys.display());
    let problem = line_of(&stdout, &unlisted);
    assert!(
        problem.contains("an NVIDIA GPU bound to the nvidia driver that NVML does not list"),
        "{problem}"
    );
    let problems: Vec<&str> = stdout.lines().filter(|l| l.contains("- gpu:")).collect();
    assert_eq!(problems.len(), 1, "{stdout}");
    assert!(
        line_of(&stdout, "gpu ").contains("2 × NVIDIA H100"),
        "{stdout}"
    );
    // The running agent counts it where the VtaxGpuNotRead alert reads it,
    // and logs it once.
    let agent = start_with_args(
        &fake,
        dir.path(),
        "",
        &["--path.sysfs", sys.to_str().unwrap()],
    );
    agent.wait_for_value(
        "vtax_collector_failed_sources{collector=\"gpu\"}",
        |v| v == 1.0,
        Duration::from_secs(20),
    );
    assert_eq!(
        served(&agent, &format!("vtax_gpu_health_up{{{GPU1}}}")),
        Some(1.0),
        "the listed GPUs are read"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let log = agent.log();
    assert_eq!(
        log.lines().filter(|l| l.contains("0000:38:00.0")).count(),
        1,
        "{log}"
    );
    assert!(agent.stop());

    // NVML does not start: the driver upgraded without a reboot. The
    // library is the new one, the kernel module still the old one; the
    // problem names both.
    fake.name_library_version("580.159.04");
    let proc = dir.path().join("proc");
    std::fs::create_dir_all(proc.join("driver/nvidia")).unwrap();
    std::fs::write(
        proc.join("driver/nvidia/version"),
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  \
         (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:23:31 UTC 2025\n",
    )
    .unwrap();
    let stdout = doctor_with(
        &fake,
        &sys,
        &[("FAKE_NVML_INIT", "18")],
        &["--path.procfs", proc.to_str().unwrap()],
    );
    assert!(
        line_of(&stdout, "gpu ").contains("its source reads badly"),
        "{stdout}"
    );
    let problem = line_of(&stdout, "- gpu: 3 NVIDIA GPUs are on the PCI bus (");
    assert!(
        problem.contains(
            "0000:18:00.0 (bound to nvidia), 0000:28:00.0 (bound to nvidia), \
             0000:38:00.0 (bound to nvidia)), but NVML did not initialise: the loaded NVIDIA \
             kernel driver and libnvidia-ml.so.1 are of different versions (kernel module \
             580.95.05, library 580.159.04)"
        ),
        "{problem}"
    );
    assert!(problem.contains("reboot the node"), "{problem}");

    // With no GPU on the bus (or each given to a VM) it waits, as before.
    let vm_host = dir.path().join("vm-host-sys");
    pci_bus_with_gpus(&vm_host, &[("0000:48:00.0", Some("vfio-pci"))]);
    for sys in [vm_host, dir.path().join("no-pci")] {
        let stdout = doctor_on(&fake, &sys, &[("FAKE_NVML_INIT", "9")]);
        let gpu = line_of(&stdout, "gpu ");
        assert!(
            gpu.contains("off  NVML did not initialise: the NVIDIA kernel driver is not loaded")
                && gpu.contains("(probed again every 60 s)"),
            "{stdout}"
        );
        assert!(!stdout.contains("- gpu:"), "{stdout}");
    }
}

/// The line of `stdout` that starts with `start` (after its indent).
fn line_of<'a>(stdout: &'a str, start: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no line {start:?}:\n{stdout}"))
}

/// `vtax run` on the fake with `config`, once GPU 0 shows the 50%
/// utilisation the test's state gives it and `settle` more has passed: the
/// agent and its /metrics then, where the collector succeeded.
fn started_at_half_load(
    fake: &FakeNvml,
    dir: &std::path::Path,
    config: &str,
    settle: Duration,
) -> (Agent, String) {
    let agent = start(fake, dir, config);
    agent.wait_for_value(
        &format!("vtax_gpu_utilization_ratio{{{GPU0}}}"),
        |v| v == 0.5,
        Duration::from_secs(20),
    );
    std::thread::sleep(settle);
    let body = agent.get("/metrics", &[]).text();
    assert_eq!(
        value(&body, "vtax_collector_success{collector=\"gpu\"}"),
        Some(1.0),
        "{body}"
    );
    (agent, body)
}

/// The line of series `name` for process `pid` in `body`.
fn process_series<'a>(body: &'a str, name: &str, pid: u32) -> &'a str {
    body.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!(",pid=\"{pid}\",")))
        .unwrap_or_else(|| panic!("no {name} of pid {pid}:\n{body}"))
}

/// R470 (the last branch before R510's v2 memory and v3 process-list
/// calls, still on many V100 and A100 nodes): every GPU read, memory and
/// processes through the older calls, and the doctor saying so; a product
/// without MIG (NOT_SUPPORTED) has it off, and is quiet when idle.
#[test]
fn an_r470_driver_is_read_through_its_older_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut process = sleeper();
    let pid = process.id();
    let fake = FakeNvml::new(
        Driver::R470,
        &format!(
            "memory_used=1073741824 memory_reserved=536870912\n\
             gpu=0 utilization=50 processes={pid}:2147483648\n\
             gpu=1 mig_supported=0\n"
        ),
    );
    let (agent, body) = started_at_half_load(
        &fake,
        dir.path(),
        "[collectors.gpu]\nslow_reads_interval_secs = 4\n",
        Duration::from_secs(6),
    );
    // The v1 call counts the driver's reservation as used.
    assert_eq!(
        value(&body, &format!("vtax_gpu_memory_used_bytes{{{GPU0}}}")),
        Some(1.5 * (1u64 << 30) as f64)
    );
    for series in [
        "vtax_gpu_power_watts",
        "vtax_gpu_remapped_rows_correctable",
        "vtax_gpu_energy_joules_total",
    ] {
        assert!(
            value(&body, &format!("{series}{{{GPU0}}}")).is_some(),
            "{series}\n{body}"
        );
    }
    // No GPM before R525: absent, not zero.
    assert_eq!(
        value(&body, &format!("vtax_gpu_sm_active_ratio{{{GPU0}}}")),
        None
    );
    let memory = process_series(&body, "vtax_gpu_process_used_memory_bytes", pid);
    assert!(
        memory.contains("command=\"sleep\"") && memory.ends_with(" 2147483648"),
        "{memory}"
    );
    assert!(
        body.lines().any(|l| l.starts_with(&format!("vtax_gpu_info{{{GPU1},")) && l.contains("mig=\"off\"")),
        "{body}"
    );

    // The busy GPU: NVML's PCIe throughput every tick (no GPM has it); one
    // process with MIG off: its shares from the utilisation, no driver call.
    let busy = fake.ticks(0);
    assert!(busy.len() >= 6, "{busy:?}");
    for (i, tick) in busy.iter().enumerate() {
        for call in [
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetPcieThroughput",
        ] {
            assert!(tick.made(call), "tick {i}, {call}: {tick:?}");
        }
        assert!(
            !tick.made("nvmlDeviceGetProcessUtilization"),
            "tick {i}: {tick:?}"
        );
    }
    // GPU 1, idle with MIG not supported (an L40S, say), is quiet: past its
    // first two ticks its PCIe throughput and link are read together, only
    // every slow_reads_interval_secs.
    let quiet = fake.ticks(1);
    assert!(quiet.len() >= 6, "{quiet:?}");
    for (i, tick) in quiet.iter().enumerate().skip(2) {
        assert_eq!(
            tick.made("nvmlDeviceGetPcieThroughput"),
            tick.made("nvmlDeviceGetCurrPcieLinkGeneration"),
            "tick {i}: {quiet:?}"
        );
    }
    let gaps = gaps_seconds(&quiet[1..], "nvmlDeviceGetPcieThroughput");
    assert!(
        !gaps.is_empty() && gaps.iter().all(|&g| g >= 4.0 - 0.6),
        "gaps {gaps:?}: {quiet:?}"
    );
    assert!(!agent.log().contains("panicked"));
    assert!(agent.stop());

    // The doctor names the older calls and what they change, and lists the process.
    let stdout = doctor(&fake);
    assert!(
        line_of(
            &stdout,
            "driver 470.256.02: memory through nvmlDeviceGetMemoryInfo "
        )
        .contains("includes what the driver reserves"),
        "{stdout}"
    );
    line_of(
        &stdout,
        "driver 470.256.02: processes through nvmlDeviceGetComputeRunningProcesses_v2 ",
    );
    let listed = line_of(&stdout, &format!("process {pid} "));
    assert!(
        listed.contains("sleep") && listed.contains("2.0 GiB"),
        "{listed}"
    );
    let _ = process.kill();
    let _ = process.wait();

    // A current driver needs no such word.
    let current = doctor(&FakeNvml::new(Driver::Current, ""));
    assert!(current.contains("GPU 0 "), "{current}");
    assert!(!current.contains("driver 550.54.15: "), "{current}");
}

/// R418, before MIG: processes listed through the unversioned call, without
/// instance ids; what it lacks (remapped rows, MIG) is absent, not zero,
/// and MIG counts as off.
#[test]
fn an_r418_driver_lists_processes_and_loses_only_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut process = sleeper();
    let pid = process.id();
    let fake = FakeNvml::new(
        Driver::R418,
        &format!("gpu=0 utilization=50 processes={pid}:2048\n"),
    );
    let (agent, body) = started_at_half_load(
        &fake,
        dir.path(),
        "[collectors.gpu]\nslow_reads_interval_secs = 0\n",
        Duration::from_millis(2500),
    );
    for series in [
        "vtax_gpu_sm_active_ratio",
        "vtax_gpu_remapped_rows_correctable",
    ] {
        assert_eq!(
            value(&body, &format!("{series}{{{GPU0}}}")),
            None,
            "{series}\n{body}"
        );
    }
    let memory = process_series(&body, "vtax_gpu_process_used_memory_bytes", pid);
    assert!(memory.ends_with(" 2048"), "{memory}");
    assert!(
        body.lines().any(|l| l.starts_with(&format!("vtax_gpu_info{{{GPU0},")) && l.contains("mig=\"off\"")),
        "{body}"
    );
    let ticks = fake.ticks(0);
    assert!(!ticks.is_empty());
    for (i, tick) in ticks.iter().enumerate() {
        assert!(
            tick.made("nvmlDeviceGetComputeRunningProcesses"),
            "tick {i}: {tick:?}"
        );
        // One process with MIG off (no MIG at all): no per-process call.
        assert!(
            !tick.made("nvmlDeviceGetProcessUtilization"),
            "tick {i}: {tick:?}"
        );
    }
    assert!(!agent.log().contains("panicked"), "{}", agent.log());
    assert!(agent.stop());
    let stdout = doctor(&fake);
    assert!(
        line_of(
            &stdout,
            "driver 418.226.00: processes through nvmlDeviceGetComputeRunningProcesses "
        )
        .contains("no GPU instance ids"),
        "{stdout}"
    );
    line_of(&stdout, "driver 418.226.00: MPS clients not listed");
    line_of(&stdout, &format!("process {pid} "));
    let _ = process.kill();
    let _ = process.wait();
}

/// A GPU lost when the agent starts is identified once it answers, and XID
/// counting outlives what would stop it for good: a GPU that will not
/// register costs neither the other GPUs' XIDs nor its own once it answers,
/// and a failed wait is followed by a new event set; each interruption is
/// logged once.
#[test]
fn a_gpu_lost_at_start_is_identified_later_and_xids_outlive_failures() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeNvml::new(Driver::Current, "gpu=1 lost=1\n");
    let agent = start(&fake, dir.path(), "");
    // Lost when found: no UUID to go by yet.
    agent.wait_for_value(
        "vtax_gpu_health_up{gpu=\"1\",gpu_uuid=\"unknown-1\"}",
        |v| v == 0.0,
        Duration::from_secs(20),
    );
    fake.set("gpu=0 xids=13\ngpu=1 lost=1\n");
    agent.wait_for_value(
        &format!("vtax_gpu_xid_errors_total{{{GPU0},xid=\"13\"}}"),
        |v| v == 1.0,
        Duration::from_secs(5),
    );
    // GPU 1 answers: identified, its series under its UUID, and registered
    // at the next attempt, 10 s apart.
    fake.set("gpu=0 xids=13\ngpu=1 xids=79\n");
    agent.wait_for_value(
        &format!("vtax_gpu_power_watts{{{GPU1}}}"),
        |v| v == 70.0,
        Duration::from_secs(5),
    );
    let body = agent.get("/metrics", &[]).text();
    assert!(!body.contains("unknown-1"), "{body}");
    assert!(
        body.contains(&format!(
            "vtax_gpu_info{{{GPU1},name=\"NVIDIA H100 80GB HBM3\","
        )),
        "{body}"
    );
    agent.wait_for_value(
        &format!("vtax_gpu_xid_errors_total{{{GPU1},xid=\"79\"}}"),
        |v| v == 1.0,
        Duration::from_secs(15),
    );
    // The driver's wait fails for a while (NVML_ERROR_UNKNOWN), then works.
    fake.set("gpu=0 xids=13 event_wait_error=999\ngpu=1 xids=79\n");
    std::thread::sleep(Duration::from_secs(2));
    fake.set("gpu=0 xids=13,31\ngpu=1 xids=79\n");
    agent.wait_for_value(
        &format!("vtax_gpu_xid_errors_total{{{GPU0},xid=\"31\"}}"),
        |v| v == 1.0,
        Duration::from_secs(15),
    );
    let log = agent.log();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("GPU identified now that it answers"), 1, "{log}");
    assert_eq!(count("did not register for XID events"), 1, "{log}");
    assert_eq!(
        count("XID events of this GPU are counted again"),
        1,
        "{log}"
    );
    assert_eq!(count("NVML event wait failed"), 1, "{log}");
    assert_eq!(count("XID errors are counted again"), 1, "{log}");
    assert!(agent.stop());
}

/// A process list the driver refuses (no permission, as on a MIG parent
/// without the monitor capability) is a problem the doctor names and one
/// log line, not an empty list: the idle GPU is not taken as quiet.
#[test]
fn a_process_list_the_driver_refuses_is_a_problem_not_an_empty_list() {
    let dir = tempfile::tempdir().unwrap();
    let refused = "gpu=0 processes_error=4\n";
    let fake = FakeNvml::new(Driver::Current, refused);
    let agent = start(&fake, dir.path(), "");
    agent.wait_for_value(
        &format!("vtax_gpu_power_watts{{{GPU0}}}"),
        |v| v == 70.0,
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_secs(4));
    // Not known to be quiet: GPM every tick, where GPU 1, quiet, skips it.
    let ticks = fake.ticks(0);
    assert!(ticks.len() >= 4, "{ticks:?}");
    assert!(
        ticks[1..].iter().all(|t| t.made("nvmlGpmSampleGet")),
        "{ticks:?}"
    );
    let quiet = fake.ticks(1);
    assert!(
        quiet[2..].iter().any(|t| !t.made("nvmlGpmSampleGet")),
        "{quiet:?}"
    );

    let mut process = sleeper();
    let pid = process.id();
    fake.set(&format!("gpu=0 processes={pid}:4096\n"));
    agent.wait_for_metric(
        &format!("vtax_gpu_process_used_memory_bytes{{{GPU0},pid=\"{pid}\""),
        Duration::from_secs(5),
    );
    let log = agent.log();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        count("does not list this GPU's compute processes"),
        1,
        "{log}"
    );
    assert_eq!(
        count("lists this GPU's compute processes again"),
        1,
        "{log}"
    );
    assert!(agent.stop());

    fake.set(refused);
    let stdout = doctor(&fake);
    let problem = line_of(
        &stdout,
        "problem: GPU 0 (GPU-fa4e0000-0000-0000-0000-000000000000): the driver did not list its compute processes",
    );
    assert!(problem.contains("who uses it is not known"), "{problem}");
    let _ = process.kill();
    let _ = process.wait();
}

/// A driver's sentinel (`u32::MAX` MHz) and a percentage past 100 are left
/// out of what is served, named once in the log and by the doctor, and
/// served again once the driver reports them in range.
#[test]
fn values_no_gpu_can_have_are_left_out_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let garbled = "gpu=0 sm_mhz=4294967295 utilization=250\n";
    let fake = FakeNvml::new(Driver::Current, garbled);
    let agent = start(&fake, dir.path(), "");
    agent.wait_for_value(
        &format!("vtax_gpu_power_watts{{{GPU0}}}"),
        |v| v == 70.0,
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(2500));
    let body = agent.get("/metrics", &[]).text();
    for series in ["vtax_gpu_utilization_ratio", "vtax_gpu_sm_clock_hertz"] {
        assert_eq!(
            value(&body, &format!("{series}{{{GPU0}}}")),
            None,
            "{series}"
        );
        assert!(
            value(&body, &format!("{series}{{{GPU1}}}")).is_some(),
            "{series}"
        );
    }
    assert_eq!(
        value(&body, &format!("vtax_gpu_memory_clock_hertz{{{GPU0}}}")),
        Some(2.619e9)
    );
    // Counted, two a tick on GPU 0 (the lone process's share is not there:
    // the fake lists none), none on GPU 1: the series an alert rule reads.
    let left_out = |gpu: &str| {
        let name = format!("vtax_gpu_health_values_left_out_total{{{gpu}}}");
        served(&agent, &name).unwrap_or_else(|| panic!("{name} is not served"))
    };
    let garbled_count = value(
        &body,
        &format!("vtax_gpu_health_values_left_out_total{{{GPU0}}}"),
    );
    assert!(
        garbled_count.is_some_and(|n| n >= 4.0 && n % 2.0 == 0.0),
        "{garbled_count:?}"
    );
    assert_eq!(left_out(GPU1), 0.0);

    fake.set("gpu=0 sm_mhz=1980 utilization=80\n");
    agent.wait_for_value(
        &format!("vtax_gpu_utilization_ratio{{{GPU0}}}"),
        |v| v == 0.8,
        Duration::from_secs(10),
    );
    let settled = left_out(GPU0);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(left_out(GPU0), settled, "no more once the values are back");
    let log = agent.log();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("a value not believed"), 2, "{log}");
    assert_eq!(count("within range again"), 2, "{log}");
    assert!(agent.stop());

    fake.set(garbled);
    let stdout = doctor(&fake);
    let problem = line_of(
        &stdout,
        "problem: GPU 0 (GPU-fa4e0000-0000-0000-0000-000000000000): the driver reported sm_clock_hertz = 4294967295000000",
    );
    assert!(problem.contains("which no GPU can; left out"), "{problem}");
}

/// Under MPS the compute list names only the server: its clients, the
/// processes whose load it is, come from the MPS list (`_v3`, or `_v2` on
/// R470), read only while a listed process may be a server.
#[test]
fn mps_clients_are_listed_beside_their_server() {
    for driver in [Driver::Current, Driver::R470] {
        let dir = tempfile::tempdir().unwrap();
        // A server by name: the kernel keeps "nvidia-cuda-mps" of it.
        let server_binary = dir.path().join("nvidia-cuda-mps-server");
        std::fs::copy("/bin/sleep", &server_binary).unwrap();
        let mut server = Command::new(&server_binary).arg("60").spawn().unwrap();
        let mut clients = [sleeper(), sleeper()];
        let mut plain = sleeper();
        let fake = FakeNvml::new(
            driver,
            &format!(
                "gpu=0 utilization=60 processes={}:512 mps_clients={}:1024,{}:2048\n\
                 gpu=1 utilization=60 processes={}:4096\n",
                server.id(),
                clients[0].id(),
                clients[1].id(),
                plain.id()
            ),
        );
        let agent = start(&fake, dir.path(), "");
        let memory = "vtax_gpu_process_used_memory_bytes";
        agent.wait_for_metric(
            &format!("{memory}{{{GPU0},pid=\"{}\"", clients[1].id()),
            Duration::from_secs(20),
        );
        std::thread::sleep(Duration::from_secs(2));
        let body = agent.get("/metrics", &[]).text();
        let of = |pid: u32| process_series(&body, memory, pid).to_string();
        assert!(of(server.id()).contains("command=\"nvidia-cuda-mps\""));
        assert!(of(server.id()).ends_with(" 512"));
        assert!(of(clients[0].id()).contains("command=\"sleep\""));
        assert!(of(clients[0].id()).ends_with(" 1024"));
        assert!(of(clients[1].id()).ends_with(" 2048"));
        assert!(of(plain.id()).ends_with(" 4096"));

        let mps_call = if driver == Driver::Current {
            "nvmlDeviceGetMPSComputeRunningProcesses_v3"
        } else {
            "nvmlDeviceGetMPSComputeRunningProcesses_v2"
        };
        let served = fake.ticks(0);
        assert!(served.iter().all(|t| t.made(mps_call)), "{served:?}");
        // No server among GPU 1's processes: no MPS list.
        let unserved = fake.ticks(1);
        assert!(!unserved.is_empty());
        assert!(
            unserved
                .iter()
                .all(|t| !t.calls.keys().any(|c| c.contains("MPS"))),
            "{unserved:?}"
        );
        assert!(agent.stop());
        if driver == Driver::Current {
            // With the process table off, no MPS list either.
            let off = tempfile::tempdir().unwrap();
            let agent = start(&fake, off.path(), "[collectors.gpu]\nprocesses = false\n");
            let since_us = fake.calls().last().unwrap().at_us;
            agent.wait_for_metric(
                &format!("vtax_gpu_power_watts{{{GPU0}}}"),
                Duration::from_secs(20),
            );
            std::thread::sleep(Duration::from_secs(2));
            assert!(agent.stop());
            let calls = fake.calls();
            let after: Vec<_> = calls.iter().filter(|c| c.at_us > since_us).collect();
            assert!(after
                .iter()
                .any(|c| c.name.contains("ComputeRunningProcesses")));
            assert!(!after.iter().any(|c| c.name.contains("MPS")), "{after:?}");
        }
        for child in [&mut server, &mut plain]
            .into_iter()
            .chain(clients.iter_mut())
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
