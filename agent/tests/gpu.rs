//! The GPU collector end to end on the simulated backend: `vtax run
//! --simulate-gpus` serves every GPU's series, a lost GPU stops nothing else,
//! and the rows reach the Parquet store. (CI has no GPU; the NVML path runs
//! only on a lent GPU machine, through scripts/gpu-smoke.sh.)

mod common;

use std::time::Duration;

use common::Agent;

#[test]
fn simulated_gpus_are_served_stored_and_a_lost_one_stops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--simulate-gpus",
        "8",
        "--simulate-gpu-scenarios",
        "training,memory-bound,thermal-throttle,power-throttle,pcie-degraded,nvlink-hidden,xid,gpu-lost",
        "--no-collector.cgroups",
    ]);
    agent.wait_for_metric(
        "vtax_collector_success{collector=\"gpu\"} 1",
        Duration::from_secs(20),
    );
    // A second tick, so the store has more than one row per GPU.
    std::thread::sleep(Duration::from_millis(1500));
    let body = agent.get("/metrics", &[]).text();
    let up = |gpu: u32| {
        body.lines()
            .find(|l| l.starts_with("vtax_gpu_health_up{") && l.contains(&format!("gpu=\"{gpu}\"")))
            .unwrap_or_else(|| panic!("no health row for GPU {gpu}:\n{body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
    };
    for gpu in 0..7 {
        assert_eq!(up(gpu), "1", "GPU {gpu}");
    }
    assert_eq!(up(7), "0", "the lost GPU");
    let utilization_rows = body
        .lines()
        .filter(|l| l.starts_with("vtax_gpu_utilization_ratio{"))
        .count();
    assert_eq!(
        utilization_rows, 7,
        "every GPU but the lost one has samples"
    );
    assert!(
        body.contains("vtax_gpu_xid_errors_total{gpu=\"7\""),
        "XID 79 counted"
    );
    assert!(body.contains("vtax_gpu_hbm_peak_bytes_per_second{gpu=\"0\""));
    assert!(agent
        .log()
        .lines()
        .any(|l| l.contains("GPU lost") && l.contains("gpu=7")));
    assert!(agent.stop());

    // Every tick's rows reached the store, the event of the lost GPU too.
    let query = |table: &str, filter: &str| {
        let data_dir = data.to_str().unwrap();
        common::vtax_stdout([
            "query",
            "--data-dir",
            data_dir,
            table,
            "--where",
            filter,
            "--format",
            "csv",
        ])
    };
    let events = query("gpu_event", "gpu=7");
    assert!(events.contains("lost"), "{events}");
    let samples = query("gpu", "gpu=2");
    assert!(
        samples.lines().count() >= 3,
        "a header and two ticks:\n{samples}"
    );
    assert!(
        query("gpu", "gpu=7").lines().count() <= 1,
        "no sample of a lost GPU"
    );
}
