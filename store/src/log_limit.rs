//! Rate-limiting of log lines that repeat while a fault lasts.
//!
//! A full or failing disk fails every write: the WAL's sync every second,
//! every publish, every merge and every append past the backlog bound. One
//! line per failure buries the log (and the journal's own disk) in copies of
//! the first. Each place that logs such a failure keeps a [`Repeats`]: the
//! first occurrence of a kind of fault is logged at once, later ones of the
//! same kind are counted, and at most one line per [`REPEAT_INTERVAL`] is
//! logged for it, carrying the count of those not logged since the line
//! before. The counters on `/metrics` (`vtax_store_write_errors_total` and
//! the like) still count every one.

use std::time::{Duration, Instant};

/// How often a line that repeats is logged: once a minute.
pub const REPEAT_INTERVAL: Duration = Duration::from_secs(60);

/// Kinds of fault a place remembers; past this the one logged longest ago
/// is forgotten (and its next occurrence logged at once).
const MAX_KINDS: usize = 16;

/// The occurrences of faults at one place in the code, by kind.
#[derive(Debug)]
pub struct Repeats {
    every: Duration,
    kinds: Vec<Kind>,
}

#[derive(Debug)]
struct Kind {
    key: String,
    logged_at: Instant,
    not_logged: u64,
}

impl Default for Repeats {
    fn default() -> Self {
        Repeats::new(REPEAT_INTERVAL)
    }
}

impl Repeats {
    /// Logs each kind of fault at most once per `every`.
    pub fn new(every: Duration) -> Self {
        Repeats {
            every,
            kinds: Vec::new(),
        }
    }

    /// Records an occurrence of the fault `kind` (what tells one fault from
    /// another here, such as [`crate::Error::kind`]). Returns `Some(n)` when a
    /// line is due, `n` being the occurrences of this kind since its last
    /// line that were not logged; `None` when this one is only counted.
    pub fn occurred(&mut self, kind: &str) -> Option<u64> {
        self.occurred_at(kind, Instant::now())
    }

    /// [`Self::occurred`] at `now`.
    pub fn occurred_at(&mut self, kind: &str, now: Instant) -> Option<u64> {
        if let Some(seen) = self.kinds.iter_mut().find(|k| k.key == kind) {
            if now.saturating_duration_since(seen.logged_at) < self.every {
                seen.not_logged += 1;
                return None;
            }
            seen.logged_at = now;
            return Some(std::mem::take(&mut seen.not_logged));
        }
        if self.kinds.len() >= MAX_KINDS {
            let oldest = (0..self.kinds.len())
                .min_by_key(|&i| self.kinds[i].logged_at)
                .expect("at least one kind");
            self.kinds.swap_remove(oldest);
        }
        self.kinds.push(Kind {
            key: kind.to_owned(),
            logged_at: now,
            not_logged: 0,
        });
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_fault_is_logged_once_a_minute_with_the_count_not_logged() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut repeats = Repeats::default();
        assert_eq!(repeats.occurred_at("disk full", at(0)), Some(0));
        // Once a second for three minutes: three more lines, each with the 59
        // occurrences between it and the line before.
        let logged: Vec<(u64, u64)> = (1..=180)
            .filter_map(|s| repeats.occurred_at("disk full", at(s)).map(|n| (s, n)))
            .collect();
        assert_eq!(logged, [(60, 59), (120, 59), (180, 59)]);
    }

    #[test]
    fn another_kind_of_fault_is_logged_at_once() {
        let start = Instant::now();
        let mut repeats = Repeats::default();
        assert_eq!(repeats.occurred_at("disk full", start), Some(0));
        assert_eq!(repeats.occurred_at("disk full", start), None);
        assert_eq!(repeats.occurred_at("permission denied", start), Some(0));
        assert_eq!(repeats.occurred_at("permission denied", start), None);
        let later = start + REPEAT_INTERVAL;
        assert_eq!(repeats.occurred_at("disk full", later), Some(1));
        assert_eq!(repeats.occurred_at("permission denied", later), Some(1));
    }

    #[test]
    fn a_place_remembers_a_bounded_number_of_kinds() {
        let start = Instant::now();
        let mut repeats = Repeats::default();
        for i in 0..100u64 {
            let now = start + Duration::from_millis(i);
            assert_eq!(repeats.occurred_at(&format!("kind {i}"), now), Some(0));
        }
        assert_eq!(repeats.kinds.len(), MAX_KINDS);
        // The newest kinds are still remembered.
        let now = start + Duration::from_millis(100);
        assert_eq!(repeats.occurred_at("kind 99", now), None);
    }
}
