//! `vtax probe-gpu`: the probe once, now, on every GPU or the ones asked for.

use anyhow::Result;

use crate::collectors::gpu_probe::engine::{Engine, Sizes};

/// Arguments of `vtax probe-gpu`.
#[derive(clap::Args, Debug)]
pub struct ProbeGpuArgs {
    /// Only these GPUs (NVML's index, as `nvidia-smi` numbers them), e.g. `--gpu 0,3`.
    #[arg(long, value_name = "N", value_delimiter = ',')]
    pub gpu: Option<Vec<u32>>,
    /// Print JSON for scripts instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Size of each large copy (host↔device, device→device, peer to peer),
    /// e.g. `256MiB`, `1GB`, or bytes; from 4 bytes to 16 GiB.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = copy_bytes)]
    pub copy_bytes: u64,
    /// Timed repetitions of each large copy; each figure is their median.
    #[arg(long, value_name = "N", default_value_t = crate::collectors::gpu_probe::engine::DEFAULT_REPEATS,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeats: u32,
    /// Uncounted copies before the timed ones.
    #[arg(long, value_name = "N", default_value_t = crate::collectors::gpu_probe::engine::DEFAULT_WARMUP,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub warmup: u32,
    /// Timed kernel launches and small round trips; each figure is their median.
    #[arg(long, value_name = "N", default_value_t = crate::collectors::gpu_probe::engine::DEFAULT_LATENCY_REPEATS,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub latency_repeats: u32,
    /// Probe this many simulated GPUs (H100 SXMs) instead of the real ones.
    #[arg(long = "simulate-gpus", value_name = "N")]
    pub simulate_gpus: Option<u32>,
}

/// The largest copy `--copy-bytes` takes: each GPU holds two buffers of it.
const MAX_COPY_BYTES: u64 = 16 << 30;

/// Reads `--copy-bytes`: a size with a unit, at least the small copy's 4 bytes.
fn copy_bytes(text: &str) -> Result<u64, String> {
    let bytes = vtax_exporters::size::parse_bytes(text)?;
    if !(crate::collectors::gpu_probe::engine::SMALL_COPY_BYTES..=MAX_COPY_BYTES).contains(&bytes) {
        return Err(format!(
            "{bytes} bytes is out of range: from {} bytes to 16 GiB",
            crate::collectors::gpu_probe::engine::SMALL_COPY_BYTES
        ));
    }
    Ok(bytes)
}

impl ProbeGpuArgs {
    fn sizes(&self) -> Sizes {
        Sizes {
            copy_bytes: self.copy_bytes,
            repeats: self.repeats,
            warmup: self.warmup,
            latency_repeats: self.latency_repeats,
        }
    }
}

/// Runs `vtax probe-gpu`.
pub fn probe_gpu(args: ProbeGpuArgs) -> Result<()> {
    let (mut engine, facts): (Box<dyn Engine>, _) = match args.simulate_gpus {
        Some(n) => (
            Box::new(crate::collectors::gpu_probe::engine::fake::FakeEngine::simulated(n)),
            Ok(crate::collectors::gpu_probe::engine::fake::simulated_facts(
                n,
            )),
        ),
        None => (
            Box::new(crate::collectors::gpu_probe::engine::cuda::CudaEngine::new()?),
            crate::collectors::gpu_probe::engine::facts::read_nvml(),
        ),
    };
    let report = crate::collectors::gpu_probe::engine::probe_and_report(
        engine.as_mut(),
        facts,
        args.gpu.as_deref(),
        &args.sizes(),
    )?;
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        report.table()
    };
    crate::print_stdout(&text)?;
    if !report.complete() {
        anyhow::bail!("the probe failed on some GPUs or pairs (see above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectors::gpu_probe::engine::DEFAULT_COPY_BYTES;

    #[test]
    fn copy_sizes_take_units_and_stay_in_range() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ProbeGpuArgs,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("probe-gpu").chain(args.iter().copied()))
                .map(|c| c.args.copy_bytes)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]), Ok(DEFAULT_COPY_BYTES));
        assert_eq!(parse(&["--copy-bytes", "64MiB"]), Ok(64 << 20));
        assert_eq!(parse(&["--copy-bytes", "1GB"]), Ok(1_000_000_000));
        assert_eq!(parse(&["--copy-bytes", "4096"]), Ok(4096));
        let small = parse(&["--copy-bytes", "2"]).unwrap_err();
        assert!(small.contains("2 bytes is out of range"), "{small}");
        let large = parse(&["--copy-bytes", "17GiB"]).unwrap_err();
        assert!(large.contains("out of range"), "{large}");
        let junk = parse(&["--copy-bytes", "lots"]).unwrap_err();
        assert!(junk.contains("is not a size"), "{junk}");
    }
}
