//! `vtax probe-gpu` end to end: the simulated probe's table and JSON, and the
//! one line it prints where there is no CUDA driver.

use std::process::{Command, Output};

const VTAX: &str = env!("CARGO_BIN_EXE_vtax");

fn probe_gpu(args: &[&str]) -> Output {
    Command::new(VTAX)
        .arg("probe-gpu")
        .args(args)
        .output()
        .expect("vtax runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn simulated_gpus_print_a_table_and_the_same_as_json() {
    let out = probe_gpu(&["--simulate-gpus", "2", "--copy-bytes", "64MiB"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for line in [
        "GPU 0  NVIDIA H100 80GB HBM3 (simulated)",
        "GPU 1  NVIDIA H100 80GB HBM3 (simulated)",
        "0.85 of Gen5 x16 (53.6 of 63.0 GB/s)",
        "0.78 of HBM peak (2620 of 3352 GB/s)",
        "GPU 1 → GPU 0",
        "10 copies of 64 MiB after 2 warm-up",
        "cost: ",
    ] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }

    let out = probe_gpu(&["--simulate-gpus", "2", "--json", "--gpu", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0]["gpu"], 1);
    let h2d = gpus[0]["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["what"] == "host_to_device")
        .expect("host_to_device");
    assert_eq!(h2d["bytes_per_second"], 53.6e9);
    assert_eq!(h2d["peak"]["label"], "Gen5 x16");
    assert_eq!(json["peers"], serde_json::json!([]));
    assert!(json["cost"]["gpu_busy_seconds"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_gpu_that_is_not_there_is_an_error_naming_those_that_are() {
    let out = probe_gpu(&["--simulate-gpus", "2", "--gpu", "9"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "vtax: error: no GPU 9: the CUDA driver sees GPU 0, 1\n"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn without_a_cuda_driver_the_probe_fails_in_one_line() {
    let out = probe_gpu(&[
        "--copy-bytes",
        "4KiB",
        "--repeats",
        "1",
        "--latency-repeats",
        "1",
    ]);
    if out.status.success() {
        // A machine with a GPU and its driver: the probe ran.
        assert!(text(&out.stdout).contains("host→device"));
        return;
    }
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("vtax: error: no CUDA driver: libcuda.so.1 could not be loaded")
            || stderr.starts_with("vtax: error: cuInit failed: "),
        "{stderr}"
    );
}
