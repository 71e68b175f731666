//! A tracker's thread: rows arrive through a bounded queue and leave in batches; a failed
//! request is retried with exponential backoff; at the end, what is left is sent within a
//! bounded wait.

use super::base::{Client, End, Failure, REQUEST_TIMEOUT, Stamped};
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// Rows the queue to a worker holds; a row that finds it full is dropped (and counted).
pub(super) const QUEUE: usize = 1024;
/// Rows a worker keeps unsent while its tracker is unreachable; the oldest go beyond it.
pub(super) const PENDING: usize = 8192;
/// The first wait after a failed request; doubled after each failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long the end of a run waits for a tracker to take what is left.
pub(crate) const END_GRACE: Duration = Duration::from_secs(15);

/// What a tracker took and what it did not.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Rows the tracker took.
    pub sent: u64,
    /// Requests that failed (each retried, or its rows dropped when refused).
    pub failed_requests: u64,
    /// Rows never sent (a full queue, a tracker down past the bounds, a refused request).
    pub dropped: u64,
}

impl Counts {
    /// `{"rows_sent", "failed_requests", "rows_dropped"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "rows_sent": self.sent,
            "failed_requests": self.failed_requests,
            "rows_dropped": self.dropped,
        })
    }
}

/// The counts as the worker and its handle update them, and how the run ended (kept here too:
/// an end message that finds the queue full is lost, and the worker finds the end by the
/// queue's closing).
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    failed_requests: AtomicU64,
    dropped: AtomicU64,
    /// 0: not yet said; 1 + the [`End`]'s index.
    end: AtomicU8,
}

const ENDS: [End; 3] = [End::Finished, End::Stopped, End::Failed];

impl Tally {
    fn get(&self) -> Counts {
        Counts {
            sent: self.sent.load(Ordering::Relaxed),
            failed_requests: self.failed_requests.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// Messages to a worker.
enum Msg {
    Row(Stamped),
    End(End),
}

/// The handle of a tracker's thread.
pub(crate) struct Worker {
    name: &'static str,
    tx: SyncSender<Msg>,
    counts: Arc<Tally>,
    /// The thread said it is done.
    done: Receiver<()>,
    grace: Duration,
    /// A full queue was warned of.
    warned_full: AtomicBool,
}

impl Worker {
    /// Starts `client`'s thread; after the end of the run it keeps trying for `grace`.
    pub fn spawn(name: &'static str, client: Box<dyn Client>, grace: Duration) -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let (done_tx, done) = std::sync::mpsc::channel();
        let counts = Arc::new(Tally::default());
        let c = counts.clone();
        std::thread::Builder::new()
            .name(format!("report-{name}"))
            .spawn(move || {
                Loop::new(name, client, c, grace).run(rx);
                let _ = done_tx.send(());
            })
            .with_context(|| format!("starting the {name} reporter's thread"))?;
        Ok(Self {
            name,
            tx,
            counts,
            done,
            grace,
            warned_full: AtomicBool::new(false),
        })
    }

    /// The tracker's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Queues a row; a full queue drops it (warned once).
    pub fn push(&self, row: Stamped) {
        match self.tx.try_send(Msg::Row(row)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.warned_full.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "{}: the tracker is not keeping up; rows are dropped from it (metrics.jsonl \
                         keeps every row; the count ends in summary.json)",
                        self.name
                    );
                }
            }
        }
    }

    /// Tells the thread the run ended (with a full queue, the thread reads the end from the
    /// counts when the queue closes).
    pub fn end(&self, end: End) {
        let i = ENDS.iter().position(|e| *e == end).unwrap_or(2);
        self.counts.end.store(1 + i as u8, Ordering::SeqCst);
        let _ = self.tx.try_send(Msg::End(end));
    }

    /// Waits for the thread (at most its grace and the timeout of one request) and returns the
    /// counts.
    pub fn wait(self) -> Counts {
        let Self {
            name,
            tx,
            counts,
            done,
            grace,
            ..
        } = self;
        drop(tx);
        let finished = done.recv_timeout(grace + REQUEST_TIMEOUT).is_ok();
        let c = counts.get();
        if !finished || c.failed_requests > 0 || c.dropped > 0 {
            log::warn!(
                "{name}: {} rows sent, {} requests failed, {} rows dropped{}",
                c.sent,
                c.failed_requests,
                c.dropped,
                if finished {
                    ""
                } else {
                    " (still sending at exit: given up)"
                }
            );
        }
        c
    }
}

/// The worker thread's state.
struct Loop {
    name: &'static str,
    client: Box<dyn Client>,
    counts: Arc<Tally>,
    pending: VecDeque<Stamped>,
    opened: bool,
    retry_at: Instant,
    backoff: Duration,
    /// The end, and how long to keep trying after it.
    end: Option<(End, Instant)>,
    /// After a refused batch, rows go one a request until the refused one is found.
    one_at_a_time: bool,
    grace: Duration,
    warned: bool,
}

impl Loop {
    fn new(
        name: &'static str,
        client: Box<dyn Client>,
        counts: Arc<Tally>,
        grace: Duration,
    ) -> Self {
        Self {
            name,
            client,
            counts,
            pending: VecDeque::new(),
            opened: false,
            retry_at: Instant::now(),
            backoff: FIRST_BACKOFF,
            end: None,
            one_at_a_time: false,
            grace,
            warned: false,
        }
    }

    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            self.receive(&rx);
            let idle_failure = self.pending.is_empty()
                && !self.opened
                && self.end.is_some_and(|(e, _)| e == End::Failed);
            if Instant::now() >= self.retry_at
                && !idle_failure
                && (!self.pending.is_empty() || self.end.is_some())
            {
                self.attempt();
            }
            if let Some((end, deadline)) = self.end {
                if self.pending.is_empty()
                    && !self.opened
                    && self.counts.sent.load(Ordering::Relaxed) == 0
                    && end == End::Failed
                {
                    // A run that failed before its first row leaves the tracker alone.
                    return;
                }
                if self.pending.is_empty() && self.opened {
                    if let Err(f) = self.client.close(end) {
                        self.failed(&f);
                    }
                    return;
                }
                let now = Instant::now();
                if now >= deadline {
                    self.drop_rows(self.pending.len());
                    return;
                }
                std::thread::sleep(self.retry_at.min(deadline).saturating_duration_since(now));
            }
        }
    }

    /// Takes what the queue holds: waits for a row when nothing is pending, or until the next
    /// attempt when rows wait for a tracker that failed; never waits once the run has ended.
    fn receive(&mut self, rx: &Receiver<Msg>) {
        if self.end.is_none() {
            let first = match self.pending.is_empty() {
                true => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                false => rx.recv_timeout(self.retry_at.saturating_duration_since(Instant::now())),
            };
            match first {
                Ok(m) => self.take(m),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    let said = self.counts.end.load(Ordering::SeqCst);
                    let end = ENDS.get((said as usize).wrapping_sub(1)).copied();
                    self.take(Msg::End(end.unwrap_or(End::Failed)));
                }
            }
        }
        while let Ok(m) = rx.try_recv() {
            self.take(m);
        }
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Row(r) => {
                if self.pending.len() >= PENDING {
                    self.pending.pop_front();
                    self.drop_rows(1);
                }
                self.pending.push_back(r);
            }
            Msg::End(e) => {
                if self.end.is_none() {
                    // A tracker that answers gets the grace to take what is left; one that is
                    // failing gets one last attempt now.
                    let now = Instant::now();
                    let failing = self.backoff > FIRST_BACKOFF;
                    if failing {
                        self.retry_at = now;
                    }
                    self.end = Some((e, if failing { now } else { now + self.grace }));
                }
            }
        }
    }

    /// Opens the tracker's run if needed, then sends the pending rows batch by batch; on a
    /// failure, waits before the next attempt.
    fn attempt(&mut self) {
        let r = self.send_pending();
        match r {
            Ok(()) => self.backoff = FIRST_BACKOFF,
            Err(Failure::Reject(m)) if self.opened => {
                self.failed(&Failure::Reject(m));
                if self.one_at_a_time {
                    // This row itself was refused: it goes, so the rest can follow.
                    if self.pending.pop_front().is_some() {
                        self.drop_rows(1);
                    }
                    self.retry_at = Instant::now() + FIRST_BACKOFF;
                }
                // A refused batch is tried again a row at a time, at once.
                self.one_at_a_time = true;
            }
            Err(f) => {
                self.failed(&f);
                self.retry_at = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    fn send_pending(&mut self) -> Result<(), Failure> {
        if !self.opened {
            self.client.open()?;
            self.opened = true;
        }
        while !self.pending.is_empty() {
            if self
                .end
                .is_some_and(|(_, deadline)| Instant::now() >= deadline)
            {
                return Ok(());
            }
            let rows = self.pending.make_contiguous();
            let rows = if self.one_at_a_time { &rows[..1] } else { rows };
            let n = self.client.send(rows)?.clamp(1, rows.len());
            self.pending.drain(..n);
            self.counts.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        self.one_at_a_time = false;
        Ok(())
    }

    fn failed(&mut self, f: &Failure) {
        self.counts.failed_requests.fetch_add(1, Ordering::Relaxed);
        if !self.warned {
            self.warned = true;
            log::warn!(
                "{}: {f} (training goes on; the tracker is retried in the background, and \
                 metrics.jsonl keeps every row)",
                self.name
            );
        }
    }

    fn drop_rows(&self, n: usize) {
        self.counts.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }
}
