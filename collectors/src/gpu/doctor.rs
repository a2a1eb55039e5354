//! `vtax doctor --gpu`: every GPU with each metric's value in its unit, and
//! what each driver read cost.

use vtax_store::schema::{FieldDef, Unit};
use vtax_store::Batch;

use super::backend::GpuBackend;
use super::tables::PROCESS;
use super::{Gpu, GpuConfig, CLOCK_EVENT_REASONS, GPU};
use crate::{Availability, Collector, Roots};

/// The reads `vtax doctor --gpu` makes, a second apart; the last is timed
/// and shown. GPM's first tick has no earlier sample to difference against,
/// and its first computation of metrics in a process carries the driver's
/// one-time setup (5.0 ms of CPU on an H100, against 0.3-0.5 ms a tick
/// after it: `bench/agent/nvml_call_costs.py --first-ticks 5`), so only the
/// third read costs what every tick of a running agent will.
const DOCTOR_GPU_READS: usize = 3;

/// `vtax doctor --gpu`: every GPU with each metric's value in its unit, or
/// that it is not supported there, a lost one as lost, and what each driver
/// read cost in the last of `DOCTOR_GPU_READS` reads a second apart.
pub fn doctor_lines(config: &GpuConfig, roots: &Roots) -> Vec<String> {
    doctor_report(config, roots, std::time::Duration::from_secs(1))
}

/// [`doctor_lines`] with its reads `pause` apart.
fn doctor_report(config: &GpuConfig, roots: &Roots, pause: std::time::Duration) -> Vec<String> {
    // Every read on every tick, the ones a running agent spaces out too, so
    // that the timed tick shows what each costs.
    let every_read = GpuConfig {
        energy_interval_secs: 0.0,
        process_shares_interval_secs: 0.0,
        slow_reads_interval_secs: 0.0,
        single_process_shares_from_utilization: false,
        ..config.clone()
    };
    let mut collector = Gpu::new(&every_read, roots);
    let found = match collector.probe() {
        Availability::Absent(reason) | Availability::Failed(reason) => {
            return vec![format!("no GPU read: {reason}")]
        }
        Availability::Available(found) => found,
    };
    let mut lines = vec![found];
    if let Some(backend) = collector.backend.as_deref() {
        let driver = backend.driver_version();
        for call in backend.older_driver_calls() {
            lines.push(format!("driver {driver}: {call}"));
        }
    }
    let batches = match doctor_reads(&mut collector, pause) {
        Ok(batches) => batches,
        Err(e) => return vec![format!("reading the GPUs failed: {e:#}")],
    };
    let samples = batches.iter().find(|b| std::ptr::eq(b.table, &GPU));
    for (gpu, state) in collector.gpus.iter().zip(&collector.states) {
        let head = format!("GPU {} {} {}", gpu.index, gpu.uuid, gpu.name);
        let sample = samples.and_then(|batch| {
            (0..batch.len())
                .find(|&row| tag_at(batch, "gpu_uuid", row) == gpu.uuid)
                .map(|row| (batch, row))
        });
        let Some((batch, row)) = sample else {
            // No sample: lost, or its read failed; the problem says which.
            let prefix = format!("GPU {} ({}): ", gpu.index, gpu.uuid);
            let why = state
                .problems
                .first()
                .map_or("no sample", |p| p.strip_prefix(&prefix).unwrap_or(p));
            lines.push(format!("{head}: {why}; no values until it answers again"));
            continue;
        };
        lines.push(format!("{head}: up"));
        for (field, column) in GPU.fields.iter().zip(&batch.fields) {
            let value = if !column.is_valid(row) {
                "not supported".to_string()
            } else {
                match &column.values {
                    vtax_store::batch::Values::F64(v) => human(field, v[row]),
                    vtax_store::batch::Values::I64(v) => human(field, v[row] as f64),
                    vtax_store::batch::Values::U64(v) if field.name == "clock_event_reasons" => {
                        clock_event_reasons(v[row])
                    }
                    vtax_store::batch::Values::U64(v) if field.unit == Unit::None => {
                        v[row].to_string()
                    }
                    vtax_store::batch::Values::U64(v) => human(field, v[row] as f64),
                }
            };
            lines.push(format!("  {:<34} {value}", field.name));
        }
        let processes = batches.iter().find(|b| std::ptr::eq(b.table, &PROCESS));
        lines.extend(process_lines(processes, &gpu.uuid));
        lines.extend(read_time_lines(collector.backend.as_deref(), gpu.index));
    }
    for problem in collector.problems() {
        lines.push(format!("problem: {problem}"));
    }
    lines
}

/// The value of the tag `name` at `row` of `batch`; empty when its table
/// has no such tag.
fn tag_at<'a>(batch: &'a Batch, name: &str, row: usize) -> &'a str {
    batch.table.tag_index(name).map_or("", |i| {
        let column = &batch.tags[i];
        &column.dict[column.codes[row] as usize]
    })
}

/// The compute processes the driver listed on the GPU `uuid`: pid,
/// command, whose (workload and cgroup) and memory, one line each.
fn process_lines(batch: Option<&Batch>, uuid: &str) -> Vec<String> {
    let Some(batch) = batch else {
        return Vec::new();
    };
    let tag = |name: &str, row: usize| tag_at(batch, name, row);
    let memory = PROCESS
        .field_index("used_memory_bytes")
        .map(|i| (&PROCESS.fields[i], &batch.fields[i]));
    let mut lines = Vec::new();
    for row in (0..batch.len()).filter(|&row| tag("gpu_uuid", row) == uuid) {
        let used = match memory {
            Some((field, column)) if column.is_valid(row) => match &column.values {
                vtax_store::batch::Values::U64(v) => human(field, v[row] as f64),
                _ => "memory not reported".to_string(),
            },
            _ => "memory not reported".to_string(),
        };
        let command = match tag("command", row) {
            "" => "(another PID namespace)",
            command => command,
        };
        let whose = format!("{} {}", tag("workload", row), tag("cgroup", row));
        lines.push(format!(
            "  process {:<8} {command:<24} {used:>12}  {}",
            tag("pid", row),
            whose.trim_end()
        ));
    }
    lines
}

/// A value as a person reads it, in its field's unit: 93.1%, 412.0 W,
/// 67 °C, 1980 MHz, 79.6 GiB, 3352.3 GB/s (decimal, as the vendors quote
/// bandwidth; memory sizes are binary, as NVML and nvidia-smi give them).
fn human(field: &FieldDef, value: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    match field.unit {
        Unit::Ratio => format!("{:.1}%", value * 100.0),
        Unit::Watts => format!("{value:.1} W"),
        Unit::Celsius => format!("{value:.0} °C"),
        Unit::Hertz => format!("{:.0} MHz", value / 1e6),
        Unit::Bytes if value.abs() >= GIB => format!("{:.1} GiB", value / GIB),
        Unit::Bytes => format!("{:.1} MiB", value / MIB),
        Unit::BytesPerSecond if value.abs() >= 1e8 || value == 0.0 => {
            format!("{:.1} GB/s", value / 1e9)
        }
        Unit::BytesPerSecond => format!("{:.1} MB/s", value / 1e6),
        Unit::Joules if value.abs() >= 1e6 => format!("{:.2} MJ", value / 1e6),
        Unit::Joules => format!("{:.1} kJ", value / 1e3),
        Unit::Seconds => format!("{value:.3} s"),
        Unit::None if value.fract() == 0.0 => format!("{value:.0}"),
        Unit::None => value.to_string(),
    }
}

/// NVML's clock event reasons bitmask, with the reasons it holds by name.
fn clock_event_reasons(mask: u64) -> String {
    let held: Vec<&str> = CLOCK_EVENT_REASONS
        .iter()
        .filter(|(_, bit)| mask & bit != 0)
        .map(|(reason, _)| *reason)
        .collect();
    if held.is_empty() {
        format!("{mask:#x}: none")
    } else {
        format!("{mask:#x}: {}", held.join(", "))
    }
}

/// Reads every GPU `DOCTOR_GPU_READS` times, `pause` apart, with the driver
/// reads of the last one timed; that read's rows.
fn doctor_reads(collector: &mut Gpu, pause: std::time::Duration) -> anyhow::Result<Vec<Batch>> {
    let mut read = collector.collect(crate::ticks::now_us())?;
    for done in 1..DOCTOR_GPU_READS {
        std::thread::sleep(pause);
        if done + 1 == DOCTOR_GPU_READS {
            if let Some(backend) = collector.backend.as_mut() {
                backend.time_reads();
            }
        }
        read = collector.collect(crate::ticks::now_us())?;
    }
    Ok(read)
}

/// The doctor's table of what each driver read of one GPU cost, slowest first.
fn read_time_lines(backend: Option<&dyn GpuBackend>, gpu: u32) -> Vec<String> {
    let mut times = backend.map(|b| b.read_times(gpu)).unwrap_or_default();
    if times.is_empty() {
        return Vec::new();
    }
    times.sort_by(|a, b| b.wall_seconds.total_cmp(&a.wall_seconds));
    let row = |read: &str, wall_seconds: f64, cpu_seconds: f64| {
        format!(
            "    {read:<46} {:>9.3} {:>9.3}",
            wall_seconds * 1e3,
            cpu_seconds * 1e3
        )
    };
    let mut lines = vec![format!(
        "  {:<48} {:>9} {:>9}",
        "driver reads, slowest first", "wall ms", "CPU ms"
    )];
    lines.extend(
        times
            .iter()
            .map(|t| row(t.read, t.wall_seconds, t.cpu_seconds)),
    );
    let (wall, cpu) = times.iter().fold((0.0, 0.0), |(w, c), t| {
        (w + t.wall_seconds, c + t.cpu_seconds)
    });
    lines.push(row("all reads", wall, cpu));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::{self, GpuIdentity, GpuSample, SampleError};
    use crate::gpu::tests::simulated;
    use vtax_store::schema::FieldType;

    #[test]
    fn doctor_lists_a_lost_gpu_as_lost_and_values_in_their_units() {
        let config = GpuConfig {
            simulate_gpus: 2,
            simulate_scenarios: vec!["training".into(), "gpu-lost".into()],
            ..GpuConfig::default()
        };
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        let lines = doctor_report(&config, &roots, std::time::Duration::ZERO);
        let text = lines.join("\n");
        let uuid = |i: u32| format!("GPU-5a1e0000-0000-4000-8000-00000000000{i}");
        let head = |i: u32| format!("GPU {i} {} NVIDIA H100 80GB HBM3: ", uuid(i));
        assert!(text.contains(&format!("{}up", head(0))), "{text}");
        assert!(
            text.contains(&format!(
                "{}lost: GPU has fallen off the bus (simulated XID 79); no values until it answers again",
                head(1)
            )),
            "{text}"
        );
        // The lost GPU lists no values: its line is followed by the problems.
        let after_lost = lines
            .iter()
            .skip_while(|l| !l.starts_with(&head(1)))
            .nth(1)
            .unwrap();
        assert!(after_lost.starts_with("problem: "), "{after_lost}");
        let value = |field: &str| {
            lines
                .iter()
                .find_map(|l| l.trim_start().strip_prefix(field))
                .unwrap_or_else(|| panic!("no {field}:\n{text}"))
                .trim()
                .to_string()
        };
        assert_eq!(value("memory_total_bytes"), "79.6 GiB");
        assert_eq!(value("hbm_peak_bytes_per_second"), "3352.3 GB/s");
        assert_eq!(value("nvlink_peak_bytes_per_second"), "900.0 GB/s");
        assert_eq!(value("sm_clock_max_hertz"), "1980 MHz");
        assert_eq!(value("power_limit_watts"), "700.0 W");
        assert_eq!(value("pcie_link_width_max"), "16");
        assert_eq!(value("clock_event_reasons"), "0x0: none");
        assert!(value("temperature_celsius").ends_with(" °C"), "{text}");
        let utilization = value("utilization_ratio");
        let percent: f64 = utilization.strip_suffix('%').unwrap().parse().unwrap();
        assert!(percent > 50.0 && percent <= 100.0, "{utilization}");
    }

    #[test]
    fn doctor_values_read_in_their_units() {
        let field = |unit| FieldDef::gauge("x", FieldType::F64, unit, "");
        assert_eq!(human(&field(Unit::Ratio), 0.9312), "93.1%");
        assert_eq!(human(&field(Unit::Watts), 412.04), "412.0 W");
        assert_eq!(human(&field(Unit::Celsius), 66.6), "67 °C");
        assert_eq!(human(&field(Unit::Hertz), 1.98e9), "1980 MHz");
        assert_eq!(
            human(&field(Unit::Bytes), (81_559u64 << 20) as f64),
            "79.6 GiB"
        );
        assert_eq!(
            human(&field(Unit::Bytes), (512u64 << 20) as f64),
            "512.0 MiB"
        );
        assert_eq!(
            human(&field(Unit::BytesPerSecond), 3.35232e12),
            "3352.3 GB/s"
        );
        assert_eq!(human(&field(Unit::BytesPerSecond), 2.5e7), "25.0 MB/s");
        assert_eq!(human(&field(Unit::BytesPerSecond), 0.0), "0.0 GB/s");
        assert_eq!(human(&field(Unit::Joules), 1.234e6), "1.23 MJ");
        assert_eq!(human(&field(Unit::None), 18.0), "18");
        assert_eq!(
            clock_event_reasons(0x60),
            "0x60: sw_thermal_slowdown, hw_thermal_slowdown"
        );
    }

    /// A backend whose only driver reads are the times it was given.
    struct TimedReads(Vec<backend::ReadTime>);

    impl GpuBackend for TimedReads {
        fn kind(&self) -> &'static str {
            "timed"
        }
        fn driver_version(&self) -> String {
            String::new()
        }
        fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
            Ok(Vec::new())
        }
        fn sample(
            &mut self,
            _: &GpuIdentity,
            _: i64,
            _: backend::ReadPlan,
        ) -> Result<GpuSample, SampleError> {
            Err(SampleError::Failed("no GPU".into()))
        }
        fn take_xids(&mut self) -> Vec<backend::XidEvent> {
            Vec::new()
        }
        fn read_times(&self, gpu: u32) -> Vec<backend::ReadTime> {
            if gpu == 0 {
                self.0.clone()
            } else {
                Vec::new()
            }
        }
    }

    /// Reads of the simulator so far, and how many came before the doctor
    /// turned timing on.
    #[derive(Default)]
    struct ReadCount {
        reads: u32,
        timed_after: Option<u32>,
    }

    /// The simulator, counting its reads into a count the test keeps.
    struct CountedReads {
        inner: Box<dyn GpuBackend>,
        count: std::sync::Arc<std::sync::Mutex<ReadCount>>,
    }

    impl GpuBackend for CountedReads {
        fn kind(&self) -> &'static str {
            "counted"
        }
        fn driver_version(&self) -> String {
            self.inner.driver_version()
        }
        fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
            self.inner.identities()
        }
        fn sample(
            &mut self,
            gpu: &GpuIdentity,
            time_us: i64,
            plan: backend::ReadPlan,
        ) -> Result<GpuSample, SampleError> {
            self.count.lock().unwrap().reads += 1;
            self.inner.sample(gpu, time_us, plan)
        }
        fn take_xids(&mut self) -> Vec<backend::XidEvent> {
            self.inner.take_xids()
        }
        fn time_reads(&mut self) {
            let mut count = self.count.lock().unwrap();
            count.timed_after = Some(count.reads);
        }
    }

    /// GPM's first metrics of a process cost the driver ten times a later
    /// tick's (5.0 against 0.3-0.5 ms on an H100), and the second read is the
    /// first with metrics: the doctor must time a later one.
    #[test]
    fn doctor_times_the_third_read_not_the_one_with_gpm_setup() {
        let mut gpu = simulated(&["training"]);
        let count = std::sync::Arc::default();
        gpu.backend = Some(Box::new(CountedReads {
            inner: gpu.backend.take().expect("probed"),
            count: std::sync::Arc::clone(&count),
        }));
        let batches = doctor_reads(&mut gpu, std::time::Duration::ZERO).unwrap();
        assert!(batches
            .iter()
            .any(|b| std::ptr::eq(b.table, &GPU) && b.len() == 1));
        let count = count.lock().unwrap();
        assert_eq!(count.reads, 3);
        assert_eq!(
            count.timed_after,
            Some(2),
            "timing must start after the second read"
        );
    }

    #[test]
    fn doctor_lists_driver_reads_slowest_first_with_their_sum() {
        let read = |read, wall_seconds, cpu_seconds| backend::ReadTime {
            read,
            wall_seconds,
            cpu_seconds,
        };
        let backend = TimedReads(vec![
            read("memory_info", 0.000_050, 0.000_010),
            read("pcie_throughput(rx)", 0.020_100, 0.000_200),
            read("power_usage", 0.000_400, 0.000_300),
        ]);
        let lines = read_time_lines(Some(&backend), 0);
        let names: Vec<&str> = lines[1..]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            names,
            ["pcie_throughput(rx)", "power_usage", "memory_info", "all"]
        );
        assert!(lines[1].ends_with("   20.100     0.200"), "{}", lines[1]);
        assert!(lines[4].ends_with("   20.550     0.510"), "{}", lines[4]);
        // A GPU that was not timed, and the simulator, print nothing.
        assert!(read_time_lines(Some(&backend), 1).is_empty());
        assert!(read_time_lines(None, 0).is_empty());
    }
}
