//! The two procfs sources of the interruption probe: a CPU's irq, softirq,
//! steal and idle ticks from `<procfs>/stat` (the host's, `--path.procfs`), and the
//! probe thread's own run delay from `/proc/thread-self/schedstat` (the
//! agent's own procfs, since the thread is the agent's).

use crate::host::{fail, parse_u64, per_cpu_lines};
use crate::ParseError;

/// Ticks (USER_HZ) one CPU spent where the guest itself can account for a
/// spinning thread's lost time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTicks {
    /// The CPU.
    pub cpu: usize,
    /// irq + softirq.
    pub irq: u64,
    /// steal: the hypervisor ran something else on this vCPU's core.
    pub steal: u64,
    /// idle + iowait: the CPU had nothing to run, and a vCPU halted.
    pub idle: u64,
    /// All eight columns: user, nice, system, idle, iowait, irq, softirq
    /// and steal (guest time is already in user and nice).
    pub total: u64,
}

/// Parses the `cpuN` lines of `/proc/stat` (`cpuN user nice system idle
/// iowait irq softirq steal ...`).
pub fn parse_stat(text: &[u8], path: &str) -> Result<Vec<CpuTicks>, ParseError> {
    Ok(stat_columns(text, path)?
        .into_iter()
        .map(|(cpu, ticks)| CpuTicks {
            cpu,
            irq: ticks[5].saturating_add(ticks[6]),
            steal: ticks[7],
            idle: ticks[3].saturating_add(ticks[4]),
            total: ticks.iter().fold(0, |sum, t| sum.saturating_add(*t)),
        })
        .collect())
}

/// Whether the kernel accounts no hard-IRQ time: the `irq` column of
/// `/proc/stat` is 0 on every CPU while `softirq` is not. Without
/// `CONFIG_IRQ_TIME_ACCOUNTING` a tick charges time in an interrupt handler
/// to whatever it interrupted, so `irq_ratio` misses it and
/// `unexplained_ratio` holds the guest's own interrupt handling.
pub fn hard_irq_unaccounted(text: &[u8], path: &str) -> Result<bool, ParseError> {
    let cpus = stat_columns(text, path)?;
    Ok(cpus.iter().all(|(_, t)| t[5] == 0) && cpus.iter().any(|(_, t)| t[6] > 0))
}

/// The first eight columns of each `cpuN` line, by CPU.
fn stat_columns(text: &[u8], path: &str) -> Result<Vec<(usize, [u64; 8])>, ParseError> {
    let text = std::str::from_utf8(text).map_err(|_| fail(path, 0, "not UTF-8"))?;
    let mut cpus = Vec::new();
    for (n, cpu, words) in per_cpu_lines(text) {
        let cpu = cpu
            .parse::<usize>()
            .map_err(|_| fail(path, n + 1, format!("bad CPU number {cpu:?}")))?;
        let mut ticks = [0u64; 8];
        let mut columns = 0;
        for (slot, word) in ticks.iter_mut().zip(words) {
            *slot = parse_u64(word, "tick count").map_err(|e| fail(path, n + 1, e))?;
            columns += 1;
        }
        if columns < ticks.len() {
            return Err(fail(
                path,
                n + 1,
                format!("{columns} columns where idle, irq, softirq and steal need 8"),
            ));
        }
        cpus.push((cpu, ticks));
    }
    if cpus.is_empty() {
        return Err(fail(path, 0, "no per-CPU lines"));
    }
    Ok(cpus)
}

/// Parses a task's `schedstat` (`<on-cpu ns> <run delay ns> <timeslices>`)
/// into its run delay: nanoseconds spent runnable but waiting for a CPU.
pub fn parse_run_delay(text: &[u8], path: &str) -> Result<u64, ParseError> {
    let text = std::str::from_utf8(text).map_err(|_| fail(path, 0, "not UTF-8"))?;
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    if words.len() != 3 {
        return Err(fail(
            path,
            1,
            format!("{} words where a task's schedstat has 3", words.len()),
        ));
    }
    parse_u64(words[1], "run delay in nanoseconds").map_err(|e| fail(path, 1, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irq_softirq_and_steal_per_cpu() {
        let text = b"cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 1 2 3 4 5 60 70 80 0 0\nintr 5 0\n";
        assert_eq!(
            parse_stat(text, "stat").unwrap(),
            [
                CpuTicks {
                    cpu: 0,
                    irq: 13,
                    steal: 8,
                    idle: 9,
                    total: 36,
                },
                CpuTicks {
                    cpu: 1,
                    irq: 130,
                    steal: 80,
                    idle: 9,
                    total: 225,
                }
            ]
        );
    }

    #[test]
    fn hard_irq_time_unaccounted_when_irq_is_0_and_softirq_is_not() {
        // This build VM's kernel (CONFIG_IRQ_TIME_ACCOUNTING off).
        let off = b"cpu  4720970 104196 1151525 7035817 68133 0 25942 15921 0 0\n\
            cpu0 2251056 50418 540297 3678427 22243 0 6333 8183 0 0\n\
            cpu1 2469914 53777 611227 3357389 45889 0 19608 7737 0 0\n";
        assert!(hard_irq_unaccounted(off, "stat").unwrap());
        let on = b"cpu0 2251056 50418 540297 3678427 22243 0 6333 8183 0 0\n\
            cpu1 2469914 53777 611227 3357389 45889 17 19608 7737 0 0\n";
        assert!(!hard_irq_unaccounted(on, "stat").unwrap());
        // Nothing accounted at all (a fixture, a CPU just up): no claim.
        let none = b"cpu0 1 0 1 9 0 0 0 0 0 0\n";
        assert!(!hard_irq_unaccounted(none, "stat").unwrap());
    }

    #[test]
    fn garbage_stat_names_the_file_and_line() {
        let err = |t: &[u8]| parse_stat(t, "/p/stat").unwrap_err().to_string();
        assert_eq!(
            err(b"cpu 1 1 1 1 1 1 1 1\ncpu0 1 2 3 4 5 x 7 8\n"),
            "/p/stat:2: \"x\" is not a tick count"
        );
        assert_eq!(
            err(b"cpu0 1 2 3 4\n"),
            "/p/stat:1: 4 columns where idle, irq, softirq and steal need 8"
        );
        assert_eq!(
            err(b"cpuX 1 2 3 4 5 6 7 8\n"),
            "/p/stat:1: bad CPU number \"X\""
        );
        assert_eq!(err(b"intr 1\n"), "/p/stat: no per-CPU lines");
        assert_eq!(err(b"\xff\xfe"), "/p/stat: not UTF-8");
    }

    #[test]
    fn run_delay_is_the_second_word() {
        assert_eq!(
            parse_run_delay(b"139226 78707 2\n", "schedstat").unwrap(),
            78707
        );
        let err = |t: &[u8]| parse_run_delay(t, "/p/schedstat").unwrap_err().to_string();
        assert_eq!(
            err(b"1 2\n"),
            "/p/schedstat:1: 2 words where a task's schedstat has 3"
        );
        assert_eq!(
            err(b"1 -2 3\n"),
            "/p/schedstat:1: \"-2\" is not a run delay in nanoseconds"
        );
        assert!(err(b"1 99999999999999999999 3").contains("overflows"));
    }
}
