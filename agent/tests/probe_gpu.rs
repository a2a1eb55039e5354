//! `vtax probe-gpu` end to end: the simulated probe's table and JSON, the one
//! line it prints where there is no CUDA driver, and the CUDA engine itself
//! against a fake driver (`fake_cuda/libcuda.c`, compiled here with `cc`,
//! which a Rust toolchain on Linux links with), so its calls, its timing
//! arithmetic and its freeing run without a GPU; with the fake NVML
//! (`fake_nvml/libnvidia-ml.c`) beside it, the GPUs' numbers and peaks.

mod common;

use std::path::{Path, PathBuf};
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

/// The fake driver, compiled into a directory of its own as `libcuda.so.1`.
fn fake_driver(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda/libcuda.c");
    let lib = dir.join("libcuda.so.1");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .expect("cc runs");
    assert!(out.status.success(), "cc: {}", text(&out.stderr));
    dir.to_path_buf()
}

/// `vtax probe-gpu --json` on the fake driver with `env`; the exit code, the
/// report, stderr, and the fake's ledger of what was left allocated.
fn probe_fake(
    env: &[(&str, &str)],
    args: &[&str],
) -> (Option<i32>, serde_json::Value, String, String) {
    let dir = tempfile::tempdir().unwrap();
    probe_fake_in(dir.path(), env, args)
}

/// [`probe_fake`] with the fake driver compiled into `dir`, which other fake
/// libraries may share.
fn probe_fake_in(
    dir: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> (Option<i32>, serde_json::Value, String, String) {
    let libs = fake_driver(dir);
    let ledger = dir.join("ledger");
    let out = Command::new(VTAX)
        .args([
            "probe-gpu",
            "--json",
            "--copy-bytes",
            "1MiB",
            "--repeats",
            "5",
        ])
        .args(args)
        .env("LD_LIBRARY_PATH", &libs)
        .env("FAKE_CUDA_LEDGER", &ledger)
        .envs(env.iter().copied())
        .output()
        .expect("vtax runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    let ledger = std::fs::read_to_string(&ledger).unwrap_or_default();
    (out.status.code(), json, text(&out.stderr), ledger)
}

const NOTHING_LEFT: &str =
    "device_buffers=0 host_buffers=0 streams=0 events=0 modules=0 contexts=0\n";

/// A GPU's report by CUDA ordinal (the `gpu` number is NVML's where NVML
/// knows the bus id, which on a GPU machine it might).
fn gpu(json: &serde_json::Value, ordinal: u64) -> &serde_json::Value {
    json["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["cuda_ordinal"] == ordinal)
        .unwrap_or_else(|| panic!("no CUDA GPU {ordinal} in {json:#}"))
}

fn figure(gpu: &serde_json::Value, what: &str) -> f64 {
    let m = gpu["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["what"] == what)
        .unwrap_or_else(|| panic!("no {what} in {gpu:#}"));
    m["bytes_per_second"]
        .as_f64()
        .or(m["seconds"].as_f64())
        .unwrap()
}

/// Each ordered pair as (source ordinal, destination ordinal, outcome, bytes/s).
fn pairs(json: &serde_json::Value) -> Vec<(u64, u64, String, Option<f64>)> {
    let ordinal = |shown: &serde_json::Value| {
        json["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| &g["gpu"] == shown)
            .and_then(|g| g["cuda_ordinal"].as_u64())
            .unwrap()
    };
    json["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                ordinal(&p["src"]),
                ordinal(&p["dst"]),
                p["outcome"].as_str().unwrap().to_string(),
                p["bytes_per_second"].as_f64(),
            )
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * b.abs()
}

#[test]
fn the_cuda_engine_times_each_copy_and_frees_everything() {
    let (code, json, stderr, ledger) = probe_fake(&[("FAKE_CUDA_GPUS", "2")], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    // The fake's clock runs host->device at 20 + 10 x GPU GB/s, device->host
    // at 15 + 10 x GPU, device->device at 1000 + 100 x GPU (so twice that in
    // HBM traffic), GPU a to b at 100 + 10a + b; a launch takes 3 us.
    for (ordinal, h2d, d2h, d2d) in [(0, 20e9, 15e9, 2000e9), (1, 30e9, 25e9, 2200e9)] {
        let g = gpu(&json, ordinal);
        assert_eq!(g["name"], format!("Fake GPU {ordinal}"));
        assert!(close(figure(g, "host_to_device"), h2d), "{g:#}");
        assert!(close(figure(g, "device_to_host"), d2h), "{g:#}");
        assert!(close(figure(g, "device_to_device"), d2d), "{g:#}");
        assert!(close(figure(g, "kernel_launch_event"), 3e-6), "{g:#}");
        assert!(figure(g, "kernel_launch") >= 0.0 && figure(g, "small_copy_round_trip") >= 0.0);
    }
    let measured = pairs(&json);
    assert_eq!(measured.len(), 2);
    for (src, dst, outcome, bytes_per_second) in measured {
        assert_eq!(outcome, "measured");
        let expected = (100 + 10 * src + dst) as f64 * 1e9;
        assert!(close(bytes_per_second.unwrap(), expected), "{src}->{dst}");
    }
    // Busy time: per GPU, 7 copies each of 3 kinds and 220 launches; per pair, 7 copies.
    let mib = (1u64 << 20) as f64;
    let per_gpu = |g: f64| {
        7.0 * (mib / ((20.0 + 10.0 * g) * 1e9)
            + mib / ((15.0 + 10.0 * g) * 1e9)
            + mib / ((1000.0 + 100.0 * g) * 1e9))
            + 220.0 * 3e-6
    };
    let busy = per_gpu(0.0) + per_gpu(1.0) + 7.0 * (mib / 101e9 + mib / 110e9);
    let reported = json["cost"]["gpu_busy_seconds"].as_f64().unwrap();
    assert!((reported - busy).abs() < 1e-6, "{reported} against {busy}");
    assert_eq!(ledger, NOTHING_LEFT);
}

#[test]
fn a_driver_call_failing_half_way_on_one_gpu_leaves_the_others_measured() {
    // GPU 1's device-to-device copy fails, after its host copies were timed.
    let env = [
        ("FAKE_CUDA_GPUS", "3"),
        ("FAKE_CUDA_FAIL", "cuMemcpyDtoDAsync_v2@1"),
    ];
    let (code, json, stderr, ledger) = probe_fake(&env, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "vtax: error: the probe failed on some GPUs or pairs (see above)\n"
    );
    assert_eq!(
        gpu(&json, 1)["error"],
        "cuMemcpyDtoDAsync_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    );
    assert!(close(figure(gpu(&json, 0), "device_to_device"), 2000e9));
    assert!(close(figure(gpu(&json, 2), "device_to_device"), 2400e9));
    let measured: Vec<_> = pairs(&json).iter().map(|p| (p.0, p.1)).collect();
    assert_eq!(measured, [(0, 2), (2, 0)]);
    // Everything the failed GPU had allocated was freed all the same.
    assert_eq!(ledger, NOTHING_LEFT);
}

#[test]
fn pairs_without_peer_access_are_named_not_timed() {
    let (code, json, stderr, ledger) = probe_fake(&[("FAKE_CUDA_NO_PEER", "1")], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let outcomes: Vec<_> = pairs(&json).into_iter().map(|p| p.2).collect();
    assert_eq!(outcomes, ["no_peer_access", "no_peer_access"]);
    assert_eq!(ledger, NOTHING_LEFT);
}

#[test]
fn a_driver_without_gpus_fails_in_one_line_naming_the_call() {
    let (code, json, stderr, _) = probe_fake(&[("FAKE_CUDA_GPUS", "0")], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(json, serde_json::Value::Null);
    assert_eq!(
        stderr,
        "vtax: error: cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)\n"
    );
}

#[test]
fn nvml_numbers_the_gpus_and_gives_their_peaks_by_bus_id() {
    // NVML numbers the GPUs the other way round from CUDA; GPU 0 (CUDA's 1)
    // is on a Gen4 slot; four NVLink links join the two, two of GPU 1's up.
    let nvml = common::fake_nvml::FakeNvml::new(
        common::fake_nvml::Driver::Current,
        "gpu=0 bus_id=00000000:28:00.0 pcie_gen_max=4 nvlinks=4 nvlinks_up=4 \
         nvlink_remote=00000000:18:00.0\n\
         gpu=1 bus_id=00000000:18:00.0 nvlinks=4 nvlinks_up=2 nvlink_remote=00000000:28:00.0\n",
    );
    let env = nvml.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, json, stderr, ledger) = probe_fake_in(nvml.lib_dir(), &env, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(ledger, NOTHING_LEFT);
    let peak = |g: &serde_json::Value, what: &str| {
        g["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["what"] == what)
            .map(|m| m["peak"]["label"].as_str().unwrap().to_string())
            .unwrap()
    };
    let (cuda0, cuda1) = (gpu(&json, 0), gpu(&json, 1));
    assert_eq!(
        (&cuda0["gpu"], &cuda1["gpu"]),
        (&1.into(), &0.into()),
        "{json:#}"
    );
    assert_eq!(peak(cuda0, "host_to_device"), "Gen5 x16");
    assert_eq!(peak(cuda1, "host_to_device"), "Gen4 x16");
    assert_eq!(peak(cuda1, "device_to_device"), "HBM peak");
    // Each direction over the links up at its source.
    let peers: Vec<(u64, u64, String)> = json["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["src"].as_u64().unwrap(),
                p["dst"].as_u64().unwrap(),
                p["peak"]["label"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        peers.contains(&(0, 1, "4 NVLink links × 25 GB/s".into())),
        "{peers:?}"
    );
    assert!(
        peers.contains(&(1, 0, "2 NVLink links × 25 GB/s".into())),
        "{peers:?}"
    );
}
