//! Host work in stream order. A host callback (`cuLaunchHostFunc`, `cuStreamAddCallback`) runs
//! once the work queued before it on its stream is done, earlier host callbacks included (and
//! those of the events the stream waits for); what is queued after it (later callbacks, events
//! recorded, synchronizations) waits until it has returned, as on the real driver. Copies and
//! memsets are done when they are called, so only host work needs following.
//!
//! Without this a runtime that finishes a transfer in one callback and signals it in the next
//! (XLA copies a staged device-to-host transfer into the caller's array that way) handed the
//! array over before it was written.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use gpufence_mock_node::timeline;

/// One host callback's completion.
#[derive(Clone, Default)]
pub(crate) struct Done(Arc<(Mutex<bool>, Condvar)>);

impl Done {
    fn finish(&self) {
        let (m, cv) = &*self.0;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }

    fn is_done(&self) -> bool {
        *self.0.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait(&self) {
        let (m, cv) = &*self.0;
        let mut done = m.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Marks the callback done however it ends.
struct FinishOnDrop(Done);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// The host callbacks that a stream's (or an event's) later work waits for.
#[derive(Clone, Default)]
pub(crate) struct Pending(Vec<Done>);

impl Pending {
    /// Every callback has returned.
    pub(crate) fn ready(&self) -> bool {
        self.0.iter().all(Done::is_done)
    }

    /// Block until every callback has returned.
    pub(crate) fn wait(&self) {
        self.0.iter().for_each(Done::wait);
    }

    /// Also wait for `other`'s callbacks (a stream waiting for an event).
    pub(crate) fn join(&mut self, other: &Pending) {
        self.0.retain(|d| !d.is_done());
        self.0
            .extend(other.0.iter().filter(|d| !d.is_done()).cloned());
    }
}

/// Run `f` on a thread of its own once the callbacks of `before` have returned and the device
/// timeline has reached `tail`. The answer stands for `f` (and so for `before` too): it becomes
/// what the stream's later work waits for.
pub(crate) fn spawn_after(
    before: Pending,
    tail: u64,
    f: Box<dyn FnOnce() + Send>,
) -> std::io::Result<Pending> {
    let done = Done::default();
    let mine = FinishOnDrop(done.clone());
    std::thread::Builder::new()
        .name("mock-cuda-callback".into())
        .spawn(move || {
            let _finish = mine;
            before.wait();
            timeline::sleep_until(tail);
            f();
        })?;
    Ok(Pending(vec![done]))
}

/// event → the host callbacks it was recorded after
static EVENTS: Mutex<Option<HashMap<usize, Pending>>> = Mutex::new(None);

fn events<R>(f: impl FnOnce(&mut HashMap<usize, Pending>) -> R) -> R {
    let mut m = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
    f(m.get_or_insert_with(HashMap::new))
}

/// `event` was recorded on a stream whose host work is `pending`.
pub(crate) fn recorded(event: usize, pending: &Pending) {
    let mut p = Pending::default();
    p.join(pending);
    events(|m| m.insert(event, p));
}

/// The host work an event waits for (none for an event never recorded after a callback).
pub(crate) fn of_event(event: usize) -> Pending {
    events(|m| m.get(&event).cloned()).unwrap_or_default()
}

pub(crate) fn event_destroyed(event: usize) {
    events(|m| m.remove(&event));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn callbacks_run_in_order_and_later_work_waits_for_them() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (o1, o2) = (order.clone(), order.clone());
        // the first callback is slow: the second, queued after it, still runs after it
        let first = spawn_after(
            Pending::default(),
            0,
            Box::new(move || {
                std::thread::sleep(Duration::from_millis(200));
                o1.lock().unwrap().push(1);
            }),
        )
        .unwrap();
        // an event recorded after the first callback, another stream waiting for it
        recorded(0xe1, &first);
        let mut other = Pending::default();
        other.join(&of_event(0xe1));
        assert!(
            !other.ready(),
            "the event is not complete while its callback runs"
        );
        let second = spawn_after(other, 0, Box::new(move || o2.lock().unwrap().push(2))).unwrap();
        second.wait();
        assert_eq!(*order.lock().unwrap(), vec![1, 2]);
        assert!(first.ready() && of_event(0xe1).ready());
        event_destroyed(0xe1);
        assert!(of_event(0xe1).ready());
    }

    #[test]
    fn a_panicking_callback_still_completes() {
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let p = spawn_after(
            Pending::default(),
            0,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                panic!("callback failed");
            }),
        )
        .unwrap();
        p.wait();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
