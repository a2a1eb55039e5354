//! Values no GPU can have, taken out of a sample before the energy
//! integration and the rows take it (and after the collector has put its
//! held reads on it, so a held value is taken out on every tick it is held).
//!
//! A driver answers SUCCESS with a sentinel now and then: `0xFFFFFFFF`
//! milliwatts or MHz from a board whose sensor is not ready, a percentage
//! past 100, a GPM rate that is NaN or negative after a counter glitch.
//! Exported as they came, such values are wrong figures an operator would
//! act on, and one of them does lasting harm: a single power reading of
//! 4.29 MW, integrated into the energy counter between exact reads, runs the
//! counter megajoules ahead, and since the counter never goes back it would
//! stand still for hours until the exact counter caught up. So each value
//! is checked against what any GPU can physically report; one outside is
//! left out (absent, as a read that failed), and the collector names it
//! once in the log and, while it lasts, among the GPU's problems.
//!
//! The bounds are wide on purpose: they catch sentinels and garbage, not
//! an unusual but real reading.

use super::backend::{GpmMetrics, GpuSample};

/// Ratios (NVML's percentages / 100) may come a hair over 1 from GPM's
/// rounding of a fully busy interval; a percentage past 101 is not a
/// rounding.
const RATIO_MAX: f64 = 1.01;

/// Above any board's power: the largest limits today are around 1.2 kW a
/// GPU; the sentinel `u32::MAX` mW is 4.29 MW.
pub const POWER_WATTS_MAX: f64 = 5_000.0;

/// A century at [`POWER_WATTS_MAX`]: more than any driver's counter (joules
/// since the driver loaded) can hold; the sentinel `u64::MAX` mJ is 1.8e16 J.
/// How far one exact read may run past the one before it is the energy
/// counter's own check (`energy.rs`).
const ENERGY_JOULES_MAX: f64 = POWER_WATTS_MAX * 100.0 * 365.25 * 86_400.0;

/// Silicon and HBM shut down well below this; the sentinel reads billions.
const TEMPERATURE_CELSIUS_MAX: f64 = 200.0;
/// Below anything a powered GPU reads, even in a cold aisle.
const TEMPERATURE_CELSIUS_MIN: f64 = -50.0;

/// Ten times the fastest SM or HBM clock shipped (about 3 GHz): the
/// sentinel `u32::MAX` MHz is 4.3 PHz.
const CLOCK_HZ_MAX: f64 = 30e9;

/// A PCIe link's one direction: Gen6 x16 moves 128 GB/s; allow for Gen7
/// and beyond, never for the 4 EB/s of a sentinel's MiB/s.
const PCIE_BYTES_PER_SECOND_MAX: f64 = 1e12;

/// NVLink, one direction of one link or of all a GPU's links together:
/// NVLink 5 gives a GPU 0.9 TB/s each way in all.
const NVLINK_BYTES_PER_SECOND_MAX: f64 = 1e13;

/// PCIe generations and lane counts the spec defines, with room for the
/// next generation.
const PCIE_GEN_MAX: u32 = 8;
const PCIE_WIDTH_MAX: u32 = 32;

/// Why a value is left out, as [`Implausible::why`] says it.
pub const NO_GPU_CAN: &str = "which no GPU can";

/// One value taken out of a sample: which, what the driver gave and why it
/// is not believed.
#[derive(Clone, Debug, PartialEq)]
pub struct Implausible {
    /// The value, as the collector's field names it.
    pub field: &'static str,
    /// What the driver reported, in the field's unit.
    pub value: f64,
    /// A clause that follows the value: [`NO_GPU_CAN`], or the check's own.
    pub why: &'static str,
}

/// What one screen found: the values it took out, and the fields it found
/// read and in range (so a field that was out is said to be back only when
/// it was read again, not when a tick did not read it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Screened {
    pub left_out: Vec<Implausible>,
    pub kept: Vec<&'static str>,
}

impl Screened {
    /// Whether `field` is in range again: read in range, and not out
    /// elsewhere on the same tick (one link in range, another not).
    pub fn back_in_range(&self, field: &str) -> bool {
        self.kept.contains(&field) && !self.left_out.iter().any(|i| i.field == field)
    }
}

/// Takes out of `s` every value outside what a GPU can report, and says
/// which it took.
pub fn screen(s: &mut GpuSample) -> Screened {
    let mut out = Vec::new();
    let mut kept = Vec::new();
    let mut keep = |field: &'static str, v: &mut Option<f64>, min: f64, max: f64| {
        if let Some(x) = *v {
            if x.is_finite() && (min..=max).contains(&x) {
                if !kept.contains(&field) {
                    kept.push(field);
                }
            } else {
                out.push(Implausible {
                    field,
                    value: x,
                    why: NO_GPU_CAN,
                });
                *v = None;
            }
        }
    };
    keep("utilization_ratio", &mut s.utilization_gpu_ratio, 0.0, RATIO_MAX);
    keep("memory_utilization_ratio", &mut s.utilization_memory_ratio, 0.0, RATIO_MAX);
    keep("sm_clock_hertz", &mut s.sm_clock_hz, 0.0, CLOCK_HZ_MAX);
    keep("memory_clock_hertz", &mut s.memory_clock_hz, 0.0, CLOCK_HZ_MAX);
    keep("power_watts", &mut s.power_watts, 0.0, POWER_WATTS_MAX);
    keep("power_limit_watts", &mut s.power_limit_watts, 0.0, POWER_WATTS_MAX);
    keep("energy_joules", &mut s.energy_joules, 0.0, ENERGY_JOULES_MAX);
    let temperature = (TEMPERATURE_CELSIUS_MIN, TEMPERATURE_CELSIUS_MAX);
    keep("temperature_celsius", &mut s.temperature_celsius, temperature.0, temperature.1);
    keep(
        "memory_temperature_celsius",
        &mut s.memory_temperature_celsius,
        temperature.0,
        temperature.1,
    );
    let pcie = PCIE_BYTES_PER_SECOND_MAX;
    keep("pcie_rx_bytes_per_second", &mut s.pcie_rx_bytes_per_second, 0.0, pcie);
    keep("pcie_tx_bytes_per_second", &mut s.pcie_tx_bytes_per_second, 0.0, pcie);
    if let Some(gpm) = s.gpm.as_mut() {
        let GpmMetrics {
            sm_active_ratio,
            sm_occupancy_ratio,
            tensor_active_ratio,
            dram_bandwidth_ratio,
            pcie_rx_bytes_per_second,
            pcie_tx_bytes_per_second,
            nvlink_rx_bytes_per_second,
            nvlink_tx_bytes_per_second,
        } = gpm;
        keep("sm_active_ratio", sm_active_ratio, 0.0, RATIO_MAX);
        keep("sm_occupancy_ratio", sm_occupancy_ratio, 0.0, RATIO_MAX);
        keep("tensor_active_ratio", tensor_active_ratio, 0.0, RATIO_MAX);
        keep("dram_bandwidth_ratio", dram_bandwidth_ratio, 0.0, RATIO_MAX);
        keep("pcie_rx_bytes_per_second", pcie_rx_bytes_per_second, 0.0, pcie);
        keep("pcie_tx_bytes_per_second", pcie_tx_bytes_per_second, 0.0, pcie);
        let nvlink = NVLINK_BYTES_PER_SECOND_MAX;
        keep("nvlink_total_rx_bytes_per_second", nvlink_rx_bytes_per_second, 0.0, nvlink);
        keep("nvlink_total_tx_bytes_per_second", nvlink_tx_bytes_per_second, 0.0, nvlink);
    }
    for l in &mut s.links {
        let nvlink = NVLINK_BYTES_PER_SECOND_MAX;
        keep("nvlink rx_bytes_per_second", &mut l.rx_bytes_per_second, 0.0, nvlink);
        keep("nvlink tx_bytes_per_second", &mut l.tx_bytes_per_second, 0.0, nvlink);
    }
    for m in &mut s.mig {
        keep("mig sm_active_ratio", &mut m.sm_active_ratio, 0.0, RATIO_MAX);
    }
    for p in &mut s.processes {
        keep("process sm_utilization_ratio", &mut p.sm_utilization_ratio, 0.0, RATIO_MAX);
        keep(
            "process memory_utilization_ratio",
            &mut p.memory_utilization_ratio,
            0.0,
            RATIO_MAX,
        );
    }
    let mut keep_whole = |field: &'static str, v: &mut Option<u32>, max: u32| {
        if let Some(x) = *v {
            if (1..=max).contains(&x) {
                kept.push(field);
            } else {
                out.push(Implausible {
                    field,
                    value: f64::from(x),
                    why: NO_GPU_CAN,
                });
                *v = None;
            }
        }
    };
    keep_whole("pcie_link_gen", &mut s.pcie_link_gen, PCIE_GEN_MAX);
    keep_whole("pcie_link_width", &mut s.pcie_link_width, PCIE_WIDTH_MAX);
    // Memory in use past the memory there is: both come from one call, so
    // the pair says nothing trustworthy about use.
    if let (Some(used), Some(total)) = (s.memory_used_bytes, s.memory_total_bytes) {
        if used > total {
            out.push(Implausible {
                field: "memory_used_bytes",
                value: used as f64,
                why: NO_GPU_CAN,
            });
            s.memory_used_bytes = None;
        } else {
            kept.push("memory_used_bytes");
        }
    }
    Screened {
        left_out: out,
        kept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::{LinkSample, ProcessSample};

    fn sample() -> GpuSample {
        GpuSample {
            utilization_gpu_ratio: Some(1.0),
            utilization_memory_ratio: Some(0.35),
            gpm: Some(GpmMetrics {
                sm_active_ratio: Some(1.004),
                dram_bandwidth_ratio: Some(0.0),
                pcie_rx_bytes_per_second: Some(55e9),
                nvlink_rx_bytes_per_second: Some(450e9),
                ..GpmMetrics::default()
            }),
            sm_clock_hz: Some(1.98e9),
            power_watts: Some(699.9),
            power_limit_watts: Some(700.0),
            temperature_celsius: Some(83.0),
            memory_temperature_celsius: Some(0.0),
            memory_used_bytes: Some(80 << 30),
            memory_total_bytes: Some(80 << 30),
            pcie_link_gen: Some(5),
            pcie_link_width: Some(16),
            links: vec![LinkSample {
                active: true,
                rx_bytes_per_second: Some(25e9),
                ..LinkSample::default()
            }],
            processes: vec![ProcessSample {
                pid: 7,
                sm_utilization_ratio: Some(1.0),
                ..ProcessSample::default()
            }],
            ..GpuSample::default()
        }
    }

    #[test]
    fn real_readings_at_their_edges_are_kept_whole() {
        let mut s = sample();
        s.energy_joules = Some(4.2e12);
        let before = s.clone();
        let screened = screen(&mut s);
        assert_eq!(screened.left_out, vec![]);
        assert_eq!(s, before);
        // Each field read is named once as kept, a field not read is not.
        for field in ["power_watts", "energy_joules", "nvlink rx_bytes_per_second"] {
            assert_eq!(screened.kept.iter().filter(|f| **f == field).count(), 1, "{field}");
            assert!(screened.back_in_range(field));
        }
        assert!(!screened.kept.contains(&"memory_clock_hertz"));
    }

    #[test]
    fn sentinels_and_garbage_are_taken_out_and_named() {
        let mut s = sample();
        s.power_watts = Some(f64::from(u32::MAX) / 1e3);
        s.sm_clock_hz = Some(f64::from(u32::MAX) * 1e6);
        s.utilization_gpu_ratio = Some(2.55);
        s.temperature_celsius = Some(f64::from(u32::MAX));
        s.pcie_link_width = Some(0);
        s.memory_used_bytes = Some((80 << 30) + 1);
        let gpm = s.gpm.as_mut().unwrap();
        gpm.sm_active_ratio = Some(f64::NAN);
        gpm.pcie_rx_bytes_per_second = Some(-1.0);
        s.links[0].rx_bytes_per_second = Some(f64::INFINITY);
        s.processes[0].sm_utilization_ratio = Some(-0.5);
        s.energy_joules = Some(u64::MAX as f64 / 1e3);
        // A second link in range: the field is out on this tick all the same.
        s.links.push(LinkSample {
            active: true,
            rx_bytes_per_second: Some(25e9),
            ..LinkSample::default()
        });

        let screened = screen(&mut s);
        assert!(!screened.back_in_range("nvlink rx_bytes_per_second"));
        assert!(screened.back_in_range("memory_temperature_celsius"));
        let out = screened.left_out;
        let fields: Vec<&str> = out.iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            [
                "utilization_ratio",
                "sm_clock_hertz",
                "power_watts",
                "energy_joules",
                "temperature_celsius",
                "sm_active_ratio",
                "pcie_rx_bytes_per_second",
                "nvlink rx_bytes_per_second",
                "process sm_utilization_ratio",
                "pcie_link_width",
                "memory_used_bytes",
            ]
        );
        assert_eq!(out[2].value, 4_294_967.295);
        assert!(out.iter().all(|i| i.why == NO_GPU_CAN));
        // Taken out; what was right beside them stays.
        assert_eq!(s.power_watts, None);
        assert_eq!(s.utilization_gpu_ratio, None);
        assert_eq!(s.memory_used_bytes, None);
        assert_eq!(s.memory_total_bytes, Some(80 << 30));
        assert_eq!(s.pcie_link_gen, Some(5));
        assert_eq!(s.power_limit_watts, Some(700.0));
        let gpm = s.gpm.unwrap();
        assert_eq!(gpm.sm_active_ratio, None);
        assert_eq!(gpm.nvlink_rx_bytes_per_second, Some(450e9));
    }
}
