//! Tinker's futures: every submission answers at once with a `request_id`, and
//! `retrieve_future` long-polls for its result (`try_again` after the poll window). Results
//! stay readable (the SDK may read one again after a retry) until the store holds more than
//! its bounds (a count, and [`RESULT_BYTES`] of protobuf results), when the oldest finished ones
//! are dropped. Submissions retried by the SDK carry the same key (model and `seq_id`, session
//! and counter), and get the first one's id back; keys are kept in a bound of their own.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A finished request's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A JSON result.
    Json(serde_json::Value),
    /// A protobuf result (`ForwardBackwardOutput`, `SampleResponse`).
    Proto(Vec<u8>),
    /// A failure, with Tinker's category (`user`, `server`).
    Error {
        /// What went wrong, naming the input at fault.
        message: String,
        /// `user` for bad input, `server` for a failure of ours.
        category: &'static str,
    },
}

impl Outcome {
    /// A failure caused by the request.
    pub fn user(message: impl Into<String>) -> Self {
        Self::Error {
            message: message.into(),
            category: "user",
        }
    }
}

/// What `retrieve_future` finds.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    /// Done.
    Ready(Outcome),
    /// Not done within the poll window.
    Pending,
    /// No such request (never made, or dropped from the store).
    Unknown,
}

/// Bytes of protobuf results kept at most.
pub const RESULT_BYTES: usize = 256 << 20;

/// Submission keys kept per kept result.
const KEYS_PER_RESULT: usize = 4;

#[derive(Default)]
struct Store {
    slots: HashMap<String, Option<Outcome>>,
    /// Finished ids and their sizes, oldest first (what is dropped past the bounds).
    finished: VecDeque<(String, usize)>,
    bytes: usize,
    /// Submission keys already given an id.
    keys: HashMap<String, String>,
    key_order: VecDeque<String>,
    next: u64,
}

/// The futures of one server.
pub struct Futures {
    store: Mutex<Store>,
    done: Notify,
    keep: usize,
}

impl Futures {
    /// A store that keeps at most `keep` finished results (and submission keys).
    pub fn new(keep: usize) -> Self {
        Self {
            store: Mutex::new(Store::default()),
            done: Notify::new(),
            keep: keep.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new pending request's id; with `key`, the id already given for that key when the
    /// submission is a retry (`fresh` false).
    pub fn open(&self, key: Option<String>) -> (String, bool) {
        let mut s = self.lock();
        if let Some(id) = key.as_ref().and_then(|k| s.keys.get(k)) {
            return (id.clone(), false);
        }
        s.next += 1;
        let id = format!("req-{}", s.next);
        s.slots.insert(id.clone(), None);
        if let Some(k) = key {
            s.keys.insert(k.clone(), id.clone());
            s.key_order.push_back(k);
            while s.key_order.len() > self.keep * KEYS_PER_RESULT {
                if let Some(old) = s.key_order.pop_front() {
                    s.keys.remove(&old);
                }
            }
        }
        (id, true)
    }

    /// Records `id`'s outcome and wakes its pollers.
    pub fn finish(&self, id: &str, outcome: Outcome) {
        {
            let size = match &outcome {
                Outcome::Proto(b) => b.len(),
                _ => 0,
            };
            let mut s = self.lock();
            s.slots.insert(id.to_string(), Some(outcome));
            s.finished.push_back((id.to_string(), size));
            s.bytes += size;
            while s.finished.len() > self.keep || s.bytes > RESULT_BYTES {
                let Some((old, n)) = s.finished.pop_front() else {
                    break;
                };
                s.slots.remove(&old);
                s.bytes -= n;
            }
        }
        self.done.notify_waiters();
    }

    fn peek(&self, id: &str) -> Poll {
        match self.lock().slots.get(id) {
            None => Poll::Unknown,
            Some(None) => Poll::Pending,
            Some(Some(o)) => Poll::Ready(o.clone()),
        }
    }

    /// `id`'s outcome, waiting up to `window` for it.
    pub async fn poll(&self, id: &str, window: Duration) -> Poll {
        let deadline = Instant::now() + window;
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.peek(id) {
                Poll::Pending => {}
                other => return other,
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.peek(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn retries_get_the_first_id_and_old_results_are_dropped_past_the_bound() {
        let f = Futures::new(2);
        let (a, fresh) = f.open(Some("m:1".into()));
        for k in 0..2 * KEYS_PER_RESULT - 1 {
            f.open(Some(format!("other {k}")));
        }
        assert!(fresh);
        assert_eq!(f.open(Some("m:1".into())), (a.clone(), false));
        let (b, _) = f.open(None);
        let (c, _) = f.open(None);
        for id in [&a, &b, &c] {
            f.finish(id, Outcome::Json(serde_json::json!({"id": id})));
        }
        assert_eq!(f.peek(&a), Poll::Unknown);
        assert!(matches!(f.peek(&c), Poll::Ready(Outcome::Json(_))));
        assert_eq!(f.peek("req-99"), Poll::Unknown);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_poll_waits_for_the_result_or_its_window() {
        let f = Arc::new(Futures::new(8));
        let (id, _) = f.open(None);
        assert_eq!(f.poll(&id, Duration::from_millis(20)).await, Poll::Pending);
        let g = f.clone();
        let id2 = id.clone();
        let waiter = tokio::spawn(async move { g.poll(&id2, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        f.finish(&id, Outcome::user("bad"));
        assert_eq!(waiter.await.unwrap(), Poll::Ready(Outcome::user("bad")));
    }
}
