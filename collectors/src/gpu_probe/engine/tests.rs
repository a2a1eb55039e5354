//! The probe driven by the fake engine: the pairs it measures, the errors it
//! keeps to one GPU, the report's peaks, table and JSON.

use std::collections::HashMap;

use super::fake::{h100_figures, simulated_bus_id, simulated_facts, FakeEngine};
use super::render::Report;
use super::*;

fn sizes() -> Sizes {
    Sizes {
        copy_bytes: 1 << 20,
        repeats: 3,
        warmup: 1,
        latency_repeats: 5,
    }
}

fn call_failed(call: &'static str) -> ProbeError {
    ProbeError::Call {
        call,
        name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        description: "out of memory".into(),
    }
}

#[test]
fn every_ordered_pair_once_and_never_a_gpu_with_itself() {
    assert_eq!(ordered_pairs(&[]), vec![]);
    assert_eq!(ordered_pairs(&[3]), vec![]);
    assert_eq!(
        ordered_pairs(&[0, 1, 2]),
        vec![(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    );
    assert_eq!(ordered_pairs(&(0..8).collect::<Vec<_>>()).len(), 56);
}

#[test]
fn the_median_of_odd_and_even_counts() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0]), Some(3.0));
    assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    // One slow outlier moves the mean, not the median.
    assert_eq!(median(&[1.0, 1.0, 1.0, 1.0, 90.0]), Some(1.0));
}

#[test]
fn the_probe_measures_each_gpu_then_each_pair_with_the_sizes_asked() {
    let mut engine = FakeEngine::simulated(3);
    let probe = probe(&mut engine, None, &sizes()).unwrap();
    assert_eq!(
        engine.calls,
        [
            "gpu 0",
            "gpu 1",
            "gpu 2",
            "peer 0->1",
            "peer 0->2",
            "peer 1->0",
            "peer 1->2",
            "peer 2->0",
            "peer 2->1"
        ]
    );
    assert!(engine.sizes_seen.iter().all(|s| *s == sizes()));
    assert_eq!(probe.gpus.len(), 3);
    assert_eq!(probe.peers.len(), 6);
    // GPU time is the sum of the GPUs' and the pairs' own.
    let expected: f64 = probe
        .gpus
        .iter()
        .map(|g| g.figures.as_ref().unwrap().gpu_busy_seconds)
        .chain(probe.peers.iter().map(|p| match p.outcome {
            Ok(PeerOutcome::Measured {
                gpu_busy_seconds, ..
            }) => gpu_busy_seconds,
            _ => 0.0,
        }))
        .sum();
    // 3 GPUs: 4 copies each way of 1 MiB at 53.6 and 52.9 GB/s, 4 of 2 MiB
    // of HBM traffic at 2620 GB/s, 15 launches of 2.4 µs; 6 pairs: 4 copies at 372 GB/s.
    let mib = (1 << 20) as f64;
    let per_gpu = 4.0 * (mib / 53.6e9 + mib / 52.9e9 + 2.0 * mib / 2.62e12) + 15.0 * 2.4e-6;
    let per_pair = 4.0 * mib / 372e9;
    assert!(
        (expected - (3.0 * per_gpu + 6.0 * per_pair)).abs() < 1e-12,
        "{expected}"
    );
    assert!((probe.cost.gpu_busy_seconds - expected).abs() < 1e-12);
}

#[test]
fn a_gpu_failing_half_way_leaves_the_others_measured() {
    let mut engine = FakeEngine::simulated(3);
    engine.gpus[1].figures = Err(call_failed("cuMemAlloc_v2"));
    let probe = probe(&mut engine, None, &sizes()).unwrap();
    assert!(probe.gpus[0].figures.is_ok());
    assert!(probe.gpus[2].figures.is_ok());
    assert_eq!(
        probe.gpus[1].figures.as_ref().unwrap_err().to_string(),
        "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    );
    // The failed GPU is in no pair; the others' pairs are measured.
    let pairs: Vec<_> = probe.peers.iter().map(|p| (p.src, p.dst)).collect();
    assert_eq!(pairs, [(0, 2), (2, 0)]);

    let report = Report::new(&probe, &Ok(simulated_facts(3)));
    assert!(!report.complete());
    let table = report.table();
    assert!(
        table.contains("GPU 1  NVIDIA H100 80GB HBM3 (simulated)")
            && table.contains(
                "  not measured: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
            ),
        "{table}"
    );
    let h2d_lines = table
        .lines()
        .filter(|l| l.starts_with("  host→device"))
        .count();
    assert_eq!(h2d_lines, 2, "{table}");
}

#[test]
fn a_pair_that_fails_or_has_no_peer_access_says_so() {
    let mut engine = FakeEngine::simulated(2);
    engine
        .peers
        .insert((0, 1), Err(call_failed("cuMemcpyPeerAsync")));
    engine.peers.remove(&(1, 0));
    let probe = probe(&mut engine, None, &sizes()).unwrap();
    let report = Report::new(&probe, &Ok(simulated_facts(2)));
    assert_eq!(report.peers[0].outcome, "error");
    assert_eq!(report.peers[1].outcome, "no_peer_access");
    assert!(!report.complete());
    let table = report.table();
    assert!(table.contains("GPU 1 → GPU 0"), "{table}");
    assert!(table.contains("no peer access"), "{table}");
    assert!(
        table.contains("failed: cuMemcpyPeerAsync failed: CUDA_ERROR_OUT_OF_MEMORY"),
        "{table}"
    );
}

#[test]
fn no_driver_fails_the_whole_probe_with_one_line() {
    let mut engine = FakeEngine {
        listing_error: Some(ProbeError::NoDriver(
            "libcuda.so.1 could not be loaded (libcuda.so.1: cannot open shared object file)"
                .into(),
        )),
        ..FakeEngine::default()
    };
    let e = probe(&mut engine, None, &sizes()).unwrap_err();
    let line = e.to_string();
    assert!(line.starts_with("no CUDA driver: libcuda.so.1 could not be loaded"));
    assert!(!line.contains('\n'));
    assert!(engine.calls.is_empty());
}

#[test]
fn the_real_engine_without_a_driver_is_an_error_not_a_panic() {
    // CI machines have no libcuda.so.1; a GPU machine has one, and then the
    // engine must load. Either way no panic.
    match cuda::CudaEngine::new() {
        Ok(mut engine) => {
            engine.gpus().expect("a loaded driver lists its GPUs");
        }
        Err(e) => {
            let line = e.to_string();
            assert!(
                line.starts_with("no CUDA driver:") || line.starts_with("cuInit failed:"),
                "{line}"
            );
        }
    }
}

#[test]
fn only_the_gpus_asked_for_and_their_pairs_are_measured() {
    let mut engine = FakeEngine::simulated(4);
    let probe = probe(&mut engine, Some(&[1, 3]), &sizes()).unwrap();
    assert_eq!(engine.calls, ["gpu 1", "gpu 3", "peer 1->3", "peer 3->1"]);
    assert_eq!(probe.gpus.len(), 2);
    let mut engine = FakeEngine::simulated(2);
    let e = super::probe(&mut engine, Some(&[5]), &sizes()).unwrap_err();
    assert_eq!(e.to_string(), "no GPU 5: the driver lists 2");
}

/// Two GPUs that CUDA numbers the other way round from NVML (as
/// `CUDA_DEVICE_ORDER=FASTEST_FIRST` or `CUDA_VISIBLE_DEVICES=1,0` can).
fn swapped() -> (FakeEngine, HashMap<String, facts::GpuFacts>) {
    let mut engine = FakeEngine::simulated(2);
    engine.gpus[0].gpu.pci_bus_id = simulated_bus_id(1);
    engine.gpus[1].gpu.pci_bus_id = simulated_bus_id(0);
    let mut facts = simulated_facts(2);
    // GPU 1 (NVML) sits in a slot trained at Gen4 at most.
    facts
        .get_mut(&simulated_bus_id(1))
        .unwrap()
        .pcie_link_gen_max = Some(4);
    (engine, facts)
}

#[test]
fn gpus_are_matched_to_nvml_by_bus_id_not_by_index() {
    let (mut engine, facts) = swapped();
    let report = probe_and_report(&mut engine, Ok(facts.clone()), None, &sizes()).unwrap();
    // CUDA ordinal 0 is NVML's GPU 1, with NVML's GPU 1's link as its peak.
    assert_eq!(report.gpus[0].gpu, 1);
    assert_eq!(report.gpus[0].cuda_ordinal, 0);
    let h2d = &report.gpus[0].measurements[0];
    assert_eq!(h2d.what, "host_to_device");
    assert_eq!(h2d.peak.as_ref().unwrap().label, "Gen4 x16");
    assert_eq!(
        report.gpus[1].measurements[0].peak.as_ref().unwrap().label,
        "Gen5 x16"
    );
    assert_eq!((report.peers[0].src, report.peers[0].dst), (1, 0));

    // `--gpu 1` is NVML's 1: CUDA ordinal 0.
    let (mut engine, _) = swapped();
    let report = probe_and_report(&mut engine, Ok(facts), Some(&[1]), &sizes()).unwrap();
    assert_eq!(engine.calls, ["gpu 0"]);
    assert_eq!(report.gpus[0].gpu, 1);
}

#[test]
fn without_nvml_the_figures_stand_without_peaks() {
    let mut engine = FakeEngine::simulated(1);
    let report = probe_and_report(
        &mut engine,
        Err("no NVIDIA driver: libnvidia-ml.so.1 could not be loaded".into()),
        None,
        &sizes(),
    )
    .unwrap();
    assert!(report.complete());
    assert!(report.gpus[0]
        .measurements
        .iter()
        .all(|m| m.peak.is_none() && m.ratio.is_none()));
    let table = report.table();
    assert!(table.contains("53.6 GB/s, no peak known"), "{table}");
    assert!(
        table.contains("no peaks: no NVIDIA driver: libnvidia-ml.so.1 could not be loaded"),
        "{table}"
    );
}

#[test]
fn the_table_sets_each_figure_against_its_peak_in_words() {
    let mut engine = FakeEngine::simulated(2);
    engine.gpus[0].figures = Ok(GpuFigures {
        host_to_device_bytes_per_second: 24.1e9,
        ..h100_figures()
    });
    let report = probe_and_report(&mut engine, Ok(simulated_facts(2)), None, &sizes()).unwrap();
    let table = report.table();
    let line = |start: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no {start} line in\n{table}"))
            .to_string()
    };
    assert!(
        table.starts_with(
            "GPU 0  NVIDIA H100 80GB HBM3 (simulated)  00000000:18:00.0  \
             PCIe Gen1 x16 now, Gen5 x16 at most; 18 NVLink links up\n"
        ),
        "{table}"
    );
    assert!(line("host→device").ends_with("24.1 GB/s   0.38 of Gen5 x16 (24.1 of 63.0 GB/s)"));
    assert!(line("device→device").contains(
        "2620 GB/s   0.78 of HBM peak (2620 of 3352 GB/s); HBM traffic, 2 × bytes copied / time"
    ));
    assert!(line("small-copy round trip").contains("19.5 µs"));
    assert!(line("kernel launch ").contains("6.8 µs"));
    assert!(line("kernel launch (events)").contains("2.4 µs"));
    assert!(line("GPU 0 → GPU 1")
        .ends_with("372.0 GB/s   0.83 of 18 NVLink links × 25 GB/s (372.0 of 450.0 GB/s)"));
    assert!(line("each figure").contains("3 copies of 1 MiB after 1 warm-up, 5 launches"));
    assert!(line("cost:").contains("s GPU busy (event-timed)"));
}

#[test]
fn the_json_holds_every_figure_peak_and_ratio() {
    let mut engine = FakeEngine::simulated(2);
    engine.gpus[1].figures = Err(call_failed("cuLaunchKernel"));
    let report = probe_and_report(&mut engine, Ok(simulated_facts(2)), None, &sizes()).unwrap();
    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["sizes"]["copy_bytes"], 1 << 20);
    let gpu0 = &json["gpus"][0];
    assert_eq!(gpu0["gpu"], 0);
    assert_eq!(gpu0["pci_bus_id"], "00000000:18:00.0");
    assert_eq!(gpu0["error"], serde_json::Value::Null);
    let m = |what: &str| {
        gpu0["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["what"] == what)
            .unwrap_or_else(|| panic!("no {what}"))
            .clone()
    };
    assert_eq!(m("host_to_device")["bytes_per_second"], 53.6e9);
    assert_eq!(m("host_to_device")["peak"]["label"], "Gen5 x16");
    let ratio = m("host_to_device")["ratio"].as_f64().unwrap();
    assert!((ratio - 53.6 / 63.008).abs() < 1e-9, "{ratio}");
    assert_eq!(m("device_to_device")["peak"]["label"], "HBM peak");
    assert_eq!(m("kernel_launch")["seconds"], 6.8e-6);
    assert!(m("kernel_launch").get("bytes_per_second").is_none());
    assert_eq!(
        json["gpus"][1]["error"],
        "cuLaunchKernel failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    );
    assert_eq!(json["gpus"][1]["measurements"], serde_json::json!([]));
    // The failed GPU has no pairs.
    assert_eq!(json["peers"], serde_json::json!([]));
    for key in [
        "wall_seconds",
        "gpu_busy_seconds",
        "thread_cpu_seconds",
        "process_cpu_seconds",
    ] {
        assert!(json["cost"][key].as_f64().unwrap() >= 0.0, "{key}");
    }
}

#[test]
fn a_simulated_node_of_eight_gpus_measures_56_pairs_over_nvlink() {
    let mut engine = FakeEngine::simulated(8);
    let report = probe_and_report(&mut engine, Ok(simulated_facts(8)), None, &sizes()).unwrap();
    assert!(report.complete());
    assert_eq!(report.peers.len(), 56);
    assert!(report
        .peers
        .iter()
        .all(|p| p.peak.as_ref().unwrap().label == "18 NVLink links × 25 GB/s"));
}

#[test]
fn a_gpu_asked_for_that_is_not_there_is_named() {
    let mut engine = FakeEngine::simulated(2);
    let e = probe_and_report(&mut engine, Ok(simulated_facts(2)), Some(&[7]), &sizes()).unwrap_err();
    assert_eq!(e.to_string(), "no GPU 7: the CUDA driver sees GPU 0, 1");
    let mut engine = FakeEngine::default();
    let e = probe_and_report(&mut engine, Ok(HashMap::new()), Some(&[0]), &sizes()).unwrap_err();
    assert_eq!(e.to_string(), "no GPU 0: the CUDA driver sees no GPU");
}

