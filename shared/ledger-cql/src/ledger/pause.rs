//! Test-only pause points: a test holds one task of the ledger at a named point of a write
//! (between two of its round trips) while other tasks run, then lets it go on. This is how the
//! tests interleave two producers deterministically (a producer that stalls past a grace, a
//! GC pause, an LWT retried for seconds) without any public API. Compiled only under
//! `cfg(test)`; outside tests the points are empty functions.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// The points armed by a test, each for one run id and one pass.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    armed: Mutex<HashMap<(&'static str, String), Armed>>,
}

#[derive(Debug)]
struct Armed {
    reached: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

/// The test's side of an armed point.
#[derive(Debug)]
pub(crate) struct Gate {
    reached: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl Gate {
    /// Waits until a task stops at the point.
    pub(crate) async fn reached(&mut self) {
        (&mut self.reached)
            .await
            .expect("the paused task is still alive");
    }

    /// Lets the stopped task go on.
    pub(crate) fn release(self) {
        // The task may have been dropped meanwhile; then there is nothing to release.
        let _ = self.release.send(());
    }
}

impl Pauses {
    /// Arms `point` for the next task of run `run` that reaches it.
    pub(crate) fn arm(&self, point: &'static str, run: &str) -> Gate {
        let (reached_tx, reached_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        self.armed.lock().expect("pause map").insert(
            (point, run.to_owned()),
            Armed {
                reached: reached_tx,
                release: release_rx,
            },
        );
        Gate {
            reached: reached_rx,
            release: release_tx,
        }
    }

    /// Called by the ledger at `point`: waits there if a test armed it for `run`.
    pub(crate) async fn at(&self, point: &'static str, run: &str) {
        let armed = self
            .armed
            .lock()
            .expect("pause map")
            .remove(&(point, run.to_owned()));
        if let Some(armed) = armed {
            let _ = armed.reached.send(());
            let _ = armed.release.await;
        }
    }
}
