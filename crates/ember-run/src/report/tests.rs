use super::base::{Client, Failure};
use super::worker::Worker;
use super::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a fake tracker saw.
#[derive(Default)]
struct Seen {
    opened: usize,
    steps: Vec<i64>,
    ended: Option<End>,
}

/// A tracker that fails its first `fail` requests, then takes up to `take` rows a request;
/// `hang` makes every request take that long.
struct Fake {
    seen: Arc<Mutex<Seen>>,
    fail: usize,
    take: usize,
    hang: Duration,
    /// A step whose row the tracker refuses (in any request that carries it).
    refuse: Option<i64>,
    /// `open` waits until the test sends on (or drops) this gate's other end.
    gate: Option<std::sync::mpsc::Receiver<()>>,
}

impl Client for Fake {
    fn open(&mut self) -> Result<(), Failure> {
        if let Some(gate) = self.gate.take() {
            let _ = gate.recv();
        }
        std::thread::sleep(self.hang);
        if self.fail > 0 {
            self.fail -= 1;
            return Err(Failure::Retry("down".into()));
        }
        self.seen.lock().unwrap().opened += 1;
        Ok(())
    }

    fn send(&mut self, rows: &[Stamped]) -> Result<usize, Failure> {
        std::thread::sleep(self.hang);
        let n = rows.len().min(self.take);
        if rows[..n].iter().any(|r| Some(r.step) == self.refuse) {
            return Err(Failure::Reject("refused".into()));
        }
        let mut seen = self.seen.lock().unwrap();
        seen.steps.extend(rows[..n].iter().map(|r| r.step));
        Ok(n)
    }

    fn close(&mut self, end: End) -> Result<(), Failure> {
        self.seen.lock().unwrap().ended = Some(end);
        Ok(())
    }
}

fn stamped(step: i64) -> Stamped {
    let row: Row = [("step".to_string(), step as f64), ("x".to_string(), 1.0)].into();
    Stamped { step, ms: 0, row }
}

fn fake(fail: usize, hang: Duration, grace: Duration) -> (Worker, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let client = Fake {
        seen: seen.clone(),
        fail,
        take: if hang.is_zero() { 2 } else { 100 },
        hang,
        refuse: None,
        gate: None,
    };
    (
        Worker::spawn("fake", Box::new(client), grace).unwrap(),
        seen,
    )
}

/// A tracker that is down at first gets every row, in order, once it answers; the failed
/// attempts are counted.
#[test]
fn rows_reach_a_tracker_that_comes_up_late_in_order() {
    let (w, seen) = fake(2, Duration::ZERO, Duration::from_secs(10));
    for s in 0..7 {
        w.push(stamped(s));
    }
    w.end(End::Stopped);
    let c = w.wait();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.steps, (0..7).collect::<Vec<_>>());
    assert_eq!((seen.opened, seen.ended), (1, Some(End::Stopped)));
    assert_eq!(
        c,
        Counts {
            sent: 7,
            failed_requests: 2,
            dropped: 0
        }
    );
}

/// A tracker that never answers costs the run nothing: rows are queued without waiting, and
/// the end gives up after the grace, counting what was never sent.
#[test]
fn a_tracker_that_is_down_never_blocks_and_is_counted() {
    let (w, seen) = fake(usize::MAX, Duration::ZERO, Duration::from_millis(300));
    let t = Instant::now();
    for s in 0..3000 {
        w.push(stamped(s));
    }
    assert!(t.elapsed() < Duration::from_secs(2), "pushing waited");
    w.end(End::Finished);
    let c = w.wait();
    assert_eq!(c.sent, 0);
    assert!(c.failed_requests >= 1);
    assert_eq!(c.dropped, 3000, "every row is counted as dropped");
    assert_eq!(seen.lock().unwrap().ended, None);
}

/// A tracker that cannot keep up fills the queue and the rows waiting for it: the rows beyond
/// them are dropped and counted, the others arrive (the tracker is held at its first request
/// until every row was pushed, so no timing decides how many are kept).
#[test]
fn a_slow_tracker_drops_what_its_queue_cannot_hold() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (release, gate) = std::sync::mpsc::channel();
    let client = Fake {
        seen: seen.clone(),
        fail: 0,
        take: 1000,
        hang: Duration::ZERO,
        refuse: None,
        gate: Some(gate),
    };
    let w = Worker::spawn("fake", Box::new(client), Duration::from_secs(30)).unwrap();
    let pushed = 20_000u64;
    for s in 0..pushed as i64 {
        w.push(stamped(s));
    }
    release.send(()).unwrap();
    w.end(End::Finished);
    let c = w.wait();
    let held = (super::worker::QUEUE + super::worker::PENDING) as u64;
    assert!(c.dropped >= pushed - held && c.sent > 0, "{c:?}");
    assert_eq!(c.sent + c.dropped, pushed, "{c:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.steps.len() as u64, c.sent);
    assert!(seen.steps.windows(2).all(|p| p[0] < p[1]), "in order");
}

#[test]
fn report_to_names() {
    let all = ReportTo::parse_trackers("all").unwrap();
    assert_eq!(all, Tracker::ALL.to_vec());
    assert_eq!(
        ReportTo::parse_trackers(" mlflow, file,mlflow,tensorboard").unwrap(),
        vec![Tracker::Mlflow, Tracker::File]
    );
    assert!(ReportTo::parse_trackers("none").unwrap().is_empty());
    let e = ReportTo::parse_trackers("wandb").unwrap_err().to_string();
    assert!(e.contains("scripts/wandb_import.py"), "{e}");
    let e = ReportTo::parse_trackers("mlfow").unwrap_err().to_string();
    assert!(
        e.contains("unknown tracker `mlfow`") && e.contains("mlflow, trackio"),
        "{e}"
    );
}

/// A refused batch is sent again a row at a time: only the refused row is lost.
#[test]
fn a_refused_row_costs_only_itself() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let client = Fake {
        seen: seen.clone(),
        fail: 0,
        take: 2,
        hang: Duration::ZERO,
        refuse: Some(3),
        gate: None,
    };
    let w = Worker::spawn("fake", Box::new(client), Duration::from_secs(10)).unwrap();
    for s in 0..7 {
        w.push(stamped(s));
    }
    w.end(End::Finished);
    let c = w.wait();
    assert_eq!(seen.lock().unwrap().steps, vec![0, 1, 2, 4, 5, 6]);
    assert_eq!((c.sent, c.dropped), (6, 1));
    assert_eq!(seen.lock().unwrap().ended, Some(End::Finished));
}

/// The end's kind survives a queue too full to carry the message.
#[test]
fn a_full_queue_keeps_the_end_it_was_told() {
    let (w, seen) = fake(0, Duration::from_millis(20), Duration::from_secs(5));
    for s in 0..1100 {
        w.push(stamped(s));
    }
    w.end(End::Stopped);
    let _ = w.wait();
    assert_eq!(seen.lock().unwrap().ended, Some(End::Stopped));
}
