//! The collectors' sections of the config file, as the loader reads them:
//! an error names the file, the line and the key; a value out of range
//! names its key and range.

use crate::config::Config;

#[test]
fn cgroups_errors_point_at_the_line() {
    let err = Config::parse(
        "[collectors.cgroups]\nmax_depth = 3\ninclude = [\"ok\", \"(\"]\n",
        "v.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("v.toml:3: collectors.cgroups.include = \"(\""),
        "{err}"
    );
    let config = Config::parse(
        "[collectors.cgroups]\nmax_depth = 6\nexclude = [\"^/user\\\\.slice\"]\nmax_cgroups = 50\n",
        "v.toml",
    )
    .unwrap();
    assert_eq!(config.collectors.cgroups.max_depth, 6);
    assert_eq!(config.collectors.cgroups.exclude, [r"^/user\.slice"]);
    assert!(Config::parse("[collectors.cgroups]\nmaxdepth = 3\n", "v.toml").is_err());
}

#[test]
fn gpu_intervals_out_of_range_name_their_key() {
    for key in [
        "energy_interval_secs",
        "quiet_energy_interval_secs",
        "process_shares_interval_secs",
        "slow_reads_interval_secs",
    ] {
        let text = format!("[collectors.gpu]\n{key} = -1\n");
        let config: Config = toml::from_str(&text).unwrap();
        let message = config.validate().unwrap_err().1;
        assert!(
            message.contains(&format!("collectors.gpu.{key} = -1")),
            "{message}"
        );
        let text = format!("[collectors.gpu]\n{key} = 0\n");
        let config: Config = toml::from_str(&text).unwrap();
        assert!(config.validate().is_ok(), "{key} = 0");
    }
}

#[test]
fn the_gpu_probe_is_off_by_default_and_its_keys_are_range_checked() {
    assert!(!crate::collectors::gpu_probe::GpuProbeConfig::default().enabled);
    for (key, bad, good) in [
        ("period_secs", "59", "60"),
        ("idle_secs", "604801", "0"),
        ("copy_bytes", "1000", "1048576"),
        ("repeats", "0", "1"),
        ("latency_repeats", "0", "1"),
        ("simulate_gpus", "65", "64"),
    ] {
        let text = format!("[collectors.gpu_probe]\n{key} = {bad}\n");
        let message = Config::parse(&text, "t.toml")
            .map(|c| c.validate().unwrap_err().1)
            .unwrap_or_else(|e| e.to_string());
        assert!(
            message.contains(&format!("collectors.gpu_probe.{key}")),
            "{key} = {bad}: {message}"
        );
        let text = format!("[collectors.gpu_probe]\n{key} = {good}\n");
        let config = Config::parse(&text, "t.toml").unwrap();
        assert!(config.validate().is_ok(), "{key} = {good}");
    }
}

#[test]
fn jitter_errors_name_the_key_and_line() {
    let parse = |body: &str| {
        Config::parse(&format!("[collectors.jitter]\n{body}\n"), "v.toml")
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        parse("interval_us = 1000\nslice_us = 600"),
        "v.toml:3: collectors.jitter.slice_us = 600: must be at most half of interval_us (1000), so that a spin ends before the next wake-up"
    );
    assert_eq!(
        parse("cpus = [1, 1]"),
        "v.toml:2: collectors.jitter.cpus = [1, 1]: CPU 1 is listed twice"
    );
    assert!(parse("cpu_budget_ratio = 0")
        .starts_with("v.toml:2: collectors.jitter.cpu_budget_ratio = 0: must be above 0"));
    assert!(parse("window_secs = 0").contains("between 1 and 3600"));
    assert!(parse("interval_us = 10").contains("between 50 and 1000000"));
    assert!(parse("fifo_priority = 100").contains("between 1 and 99"));
    assert!(parse("cpus = [-1]").contains("line 2"));
    assert!(parse("budget = 1").contains("unknown field `budget`"));
}
