//! One thread owns the engine (MPI's `MPI_THREAD_FUNNELED`; an NCCL communicator is not
//! `Send`), and the job's threads hand it operations through a channel: the [`Collective`] the
//! world holds.

use ember_dist::{At, Collective, DistError};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

/// An engine as its own thread drives it; every rank calls the same operations in order.
pub(crate) trait Engine {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Processes in the world.
    fn size(&self) -> usize;
    /// The sum over the ranks.
    fn sum(&mut self, v: Vec<f32>, at: At) -> Result<Vec<f32>, DistError>;
    /// Every rank's bytes, in rank order.
    fn gather(&mut self, b: Vec<u8>, at: At) -> Result<Vec<Vec<u8>>, DistError>;
    /// Rank 0's bytes.
    fn broadcast(&mut self, b: Vec<u8>, at: At) -> Result<Vec<u8>, DistError>;
    /// Ends every process of the world.
    fn abort(&mut self, code: i32) -> !;
}

enum Op {
    Sum(Vec<f32>),
    Gather(Vec<u8>),
    Broadcast(Vec<u8>),
    Abort(i32),
}

enum Out {
    Floats(Vec<f32>),
    Parts(Vec<Vec<u8>>),
    Bytes(Vec<u8>),
}

struct Call {
    op: Op,
    at: At,
    reply: Sender<Result<Out, DistError>>,
}

/// A [`Collective`] whose engine runs on a thread of its own.
pub(crate) struct OnThread {
    engine: &'static str,
    rank: usize,
    size: usize,
    calls: Mutex<Option<Sender<Call>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl OnThread {
    /// Starts the thread, which makes the engine with `make` and answers calls until the
    /// handle is dropped (the engine is dropped there: MPI finalises).
    pub(crate) fn start<E: Engine>(
        engine: &'static str,
        make: impl FnOnce() -> Result<E, DistError> + Send + 'static,
    ) -> Result<Self, DistError> {
        let fail = |message: String| DistError::Engine {
            engine,
            what: "initialisation",
            step: 0,
            message,
        };
        let (ready_tx, ready_rx) = channel();
        let (tx, rx) = channel::<Call>();
        let thread = std::thread::Builder::new()
            .name(format!("ember-{engine}"))
            .spawn(move || match make() {
                Ok(e) => {
                    let _ = ready_tx.send(Ok((e.rank(), e.size())));
                    serve(e, &rx);
                }
                Err(err) => {
                    let _ = ready_tx.send(Err(err));
                }
            })
            .map_err(|e| fail(e.to_string()))?;
        let (rank, size) = ready_rx
            .recv()
            .map_err(|_| fail("the engine's thread ended while starting".into()))??;
        Ok(Self {
            engine,
            rank,
            size,
            calls: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn call(&self, op: Op, at: At) -> Result<Out, DistError> {
        let gone = || DistError::Engine {
            engine: self.engine,
            what: at.what,
            step: at.step,
            message: "the engine's thread has ended".into(),
        };
        let (reply, answer) = channel();
        {
            let calls = self.calls.lock().map_err(|_| gone())?;
            let tx = calls.as_ref().ok_or_else(gone)?;
            tx.send(Call { op, at, reply }).map_err(|_| gone())?;
        }
        answer.recv().map_err(|_| gone())?
    }

    fn unexpected(&self, at: At) -> DistError {
        DistError::Engine {
            engine: self.engine,
            what: at.what,
            step: at.step,
            message: "the engine answered another operation".into(),
        }
    }
}

fn serve<E: Engine>(mut e: E, calls: &Receiver<Call>) {
    for call in calls {
        let out = match call.op {
            Op::Abort(code) => e.abort(code),
            Op::Sum(v) => e.sum(v, call.at).map(Out::Floats),
            Op::Gather(b) => e.gather(b, call.at).map(Out::Parts),
            Op::Broadcast(b) => e.broadcast(b, call.at).map(Out::Bytes),
        };
        let _ = call.reply.send(out);
    }
}

impl Drop for OnThread {
    /// Ends the engine's thread, which drops the engine (every rank reaches this at the run's
    /// end, so MPI finalises together).
    fn drop(&mut self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.take();
        }
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = h.join();
        }
    }
}

impl Collective for OnThread {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn engine(&self) -> &'static str {
        self.engine
    }

    fn all_reduce_sum(&self, buf: Vec<f32>, at: At) -> Result<Vec<f32>, DistError> {
        match self.call(Op::Sum(buf), at)? {
            Out::Floats(v) => Ok(v),
            _ => Err(self.unexpected(at)),
        }
    }

    fn all_gather(&self, bytes: Vec<u8>, at: At) -> Result<Vec<Vec<u8>>, DistError> {
        match self.call(Op::Gather(bytes), at)? {
            Out::Parts(v) => Ok(v),
            _ => Err(self.unexpected(at)),
        }
    }

    fn broadcast(&self, bytes: Vec<u8>, at: At) -> Result<Vec<u8>, DistError> {
        match self.call(Op::Broadcast(bytes), at)? {
            Out::Bytes(v) => Ok(v),
            _ => Err(self.unexpected(at)),
        }
    }

    fn abort(&self, code: i32) -> ! {
        let at = At {
            step: 0,
            what: "abort",
        };
        let _ = self.call(Op::Abort(code), at);
        // The engine ends the process; if its thread is gone, end it here.
        std::process::exit(code)
    }
}
