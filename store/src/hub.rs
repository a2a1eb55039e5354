//! The hub: one bounded queue from every source of rows (the collectors'
//! threads, the web server, remote write, the uploader) to the thread that
//! stores them, shows them to the detector and ships them. Bounded, so that
//! a consumer held up (a slow disk, a stalled filesystem) costs rows that are
//! counted as dropped, never memory without end; a sender never waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use crate::Batch;

/// One send: the batches a source produced together.
pub type Rows = Vec<Arc<Batch>>;

/// What the hub carries: rows, and whether they are every series their
/// source has now. Of a source that sends such snapshots (a collector's
/// tick), a series of its last snapshot missing from the next has ended:
/// remote write then sends it a stale marker, as a scrape that no longer
/// finds a series makes Prometheus mark it stale.
#[derive(Debug)]
pub struct Sent {
    /// The batches.
    pub rows: Rows,
    /// The source, when `rows` are all its series now.
    pub snapshot_of: Option<Arc<str>>,
}

/// The sending side, cloned for every source.
#[derive(Clone, Debug)]
pub struct RowSender {
    queue: SyncSender<Sent>,
    dropped: Arc<AtomicU64>,
}

/// The receiving side is gone: the agent is stopping.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

impl RowSender {
    /// Queues `rows`, or drops and counts them when the queue is full.
    /// Fails only once the receiver is gone.
    pub fn send(&self, rows: Rows) -> Result<(), Closed> {
        self.queue_sent(Sent {
            rows,
            snapshot_of: None,
        })
    }

    /// Queues `rows` as every series `source` has now (see [`Sent`]).
    pub fn send_snapshot(&self, source: &Arc<str>, rows: Rows) -> Result<(), Closed> {
        self.queue_sent(Sent {
            rows,
            snapshot_of: Some(source.clone()),
        })
    }

    fn queue_sent(&self, sent: Sent) -> Result<(), Closed> {
        match self.queue.try_send(sent) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(sent)) => {
                self.dropped
                    .fetch_add(sent.rows.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => Err(Closed),
        }
    }

    /// Batches dropped because the queue was full, by every clone.
    pub fn dropped_batches(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// A hub holding at most `capacity` sends.
pub fn channel(capacity: usize) -> (RowSender, Receiver<Sent>) {
    let (queue, received) = std::sync::mpsc::sync_channel(capacity);
    let sender = RowSender {
        queue,
        dropped: Arc::new(AtomicU64::new(0)),
    };
    (sender, received)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables;
    use crate::BatchBuilder;

    fn rows(n: usize) -> Rows {
        (0..n)
            .map(|_| Arc::new(BatchBuilder::new(&tables::SCRAPED).finish()))
            .collect()
    }

    #[test]
    fn a_full_hub_drops_and_counts_what_comes_after_and_keeps_what_it_holds() {
        let (sender, received) = channel(2);
        let other = sender.clone();
        assert_eq!(sender.send(rows(1)), Ok(()));
        assert_eq!(other.send(rows(2)), Ok(()));
        // Full: neither waits, and every clone counts in one total.
        assert_eq!(sender.send(rows(3)), Ok(()));
        assert_eq!(other.send(rows(1)), Ok(()));
        assert_eq!(sender.dropped_batches(), 4);
        let kept: Vec<usize> = received.try_iter().map(|r| r.rows.len()).collect();
        assert_eq!(kept, [1, 2]);
        // Room again.
        assert_eq!(sender.send(rows(5)), Ok(()));
        assert_eq!(received.try_iter().map(|r| r.rows.len()).sum::<usize>(), 5);
        assert_eq!(other.dropped_batches(), 4);
    }

    #[test]
    fn a_send_after_the_receiver_is_gone_says_so() {
        let (sender, received) = channel(1);
        drop(received);
        assert_eq!(sender.send(rows(1)), Err(Closed));
        assert_eq!(sender.dropped_batches(), 0);
    }
}
