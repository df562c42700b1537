//! Threads kept for the next request: each request is served on a thread of its own (a slow one
//! never holds up the reader or another request), and a decision runs on one more so its
//! deadline can be answered while it finishes ([`crate::service`]). Starting a thread is a
//! dozen syscalls (`clone3`, the stack's `mmap`/`mprotect`/`munmap`, signal masks, `rseq`…);
//! a pod's requests (CreateContainer, its validation, PostStartContainer, StopContainer,
//! RemoveContainer) started seven. A thread that finished its job waits for the next one, up to
//! [`MAX_IDLE`] waiting; when none waits, a new one starts, so a job never waits for another
//! (a stuck decision keeps its thread, and the next request gets another).

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};

/// Most threads kept waiting for a job.
pub const MAX_IDLE: usize = 8;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A set of threads named `name` that run jobs.
#[derive(Debug)]
pub struct Workers {
    name: &'static str,
    /// One sender per thread waiting in `recv` for its next job.
    idle: Mutex<Vec<Sender<Job>>>,
}

impl Workers {
    pub fn new(name: &'static str) -> Arc<Workers> {
        Arc::new(Workers {
            name,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Threads waiting for a job now.
    pub fn idle(&self) -> usize {
        self.idle.lock().map_or(0, |i| i.len())
    }

    /// Run `job` on a waiting thread, or on a new one when none waits. A job that panics ends
    /// its thread (the caller catches what it must answer). Err: no thread could be started.
    pub fn run(self: &Arc<Self>, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let mut job: Job = Box::new(job);
        loop {
            let waiting = self.idle.lock().ok().and_then(|mut i| i.pop());
            let Some(tx) = waiting else { break };
            // A thread whose receiver is gone (it ended) hands the job back.
            match tx.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(j)) => job = j,
            }
        }
        // The thread holds the set weakly and, while it waits, no sender of its own: when the
        // set is dropped (its connection ended) the waiting threads' channels close and they end.
        let workers = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || {
                let mut job = job;
                loop {
                    job();
                    let (tx, rx) = mpsc::channel::<Job>();
                    let waiting = workers.upgrade().is_some_and(|w| match w.idle.lock() {
                        Ok(mut idle) if idle.len() < MAX_IDLE => {
                            idle.push(tx);
                            true
                        }
                        _ => false,
                    });
                    match rx.recv() {
                        Ok(next) if waiting => job = next,
                        _ => return,
                    }
                }
            })
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn thread_id_of(w: &Arc<Workers>) -> std::thread::ThreadId {
        let (tx, rx) = mpsc::channel();
        w.run(move || tx.send(std::thread::current().id()).unwrap())
            .unwrap();
        rx.recv_timeout(Duration::from_secs(5)).unwrap()
    }

    fn wait_idle(w: &Workers, n: usize) {
        for _ in 0..500 {
            if w.idle() == n {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("{} idle threads, not {n}", w.idle());
    }

    #[test]
    fn a_finished_thread_serves_the_next_job() {
        let w = Workers::new("test-worker");
        let first = thread_id_of(&w);
        wait_idle(&w, 1);
        assert_eq!(thread_id_of(&w), first);
    }

    #[test]
    fn a_busy_thread_never_holds_up_another_job_and_a_panic_ends_only_its_thread() {
        let w = Workers::new("test-worker");
        let (release, held) = mpsc::channel::<()>();
        w.run(move || {
            let _ = held.recv();
        })
        .unwrap();
        // The first thread is busy: the next job gets a thread of its own at once.
        let (tx, rx) = mpsc::channel();
        w.run(move || tx.send(1).unwrap()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        release.send(()).unwrap();
        wait_idle(&w, 2);
        w.run(|| panic!("job bug")).unwrap();
        wait_idle(&w, 1);
        let (tx, rx) = mpsc::channel();
        w.run(move || tx.send(2).unwrap()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(2));
    }

    #[test]
    fn a_dropped_set_lets_its_waiting_threads_end() {
        let w = Workers::new("test-worker");
        let (tx, rx) = mpsc::channel();
        w.run(move || {
            // Told when this thread's locals are dropped (the thread ended).
            struct Ended(mpsc::Sender<()>);
            impl Drop for Ended {
                fn drop(&mut self) {
                    let _ = self.0.send(());
                }
            }
            thread_local!(static ENDED: std::cell::RefCell<Option<Ended>> = const { std::cell::RefCell::new(None) });
            ENDED.with(|e| *e.borrow_mut() = Some(Ended(tx)));
        })
        .unwrap();
        wait_idle(&w, 1);
        drop(w);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(()));
    }

    #[test]
    fn at_most_max_idle_threads_wait() {
        let w = Workers::new("test-worker");
        let (release, held) = mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        for _ in 0..MAX_IDLE + 3 {
            let (started, running) = mpsc::channel();
            let held = Arc::clone(&held);
            w.run(move || {
                started.send(()).unwrap();
                let _ = held.lock().unwrap().recv();
            })
            .unwrap();
            running.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        for _ in 0..MAX_IDLE + 3 {
            release.send(()).unwrap();
        }
        wait_idle(&w, MAX_IDLE);
    }
}
