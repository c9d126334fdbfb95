//! This process's own lifecycle events, handed with the whole command to whoever in the same
//! process waits for it: the producer's long polls and `Prefer: wait` submissions.
//!
//! The events topic carries the public projection of a command (docs/events.md), not the
//! command, so a waiter woken by an event that ends its wait reads the command from the ledger.
//! In one process (`sluice dev`, where the dispatcher that settles a command runs beside the
//! producer that waits for it) that read is not needed: the pipeline hands the command as
//! stored here as it publishes its event, before the bus delivers it. The read cost about a
//! quarter more pipeline CPU per effect in `sluice bench --mode agents` (C=64: 262 → 351 µs;
//! docs/performance-history.md). A producer of its own (distributed) receives nothing here for
//! the dispatcher's commands and reads the ledger, once per settled wait.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use sluice_core::command::Command;

/// Who receives the commands: the producer's waiters.
pub type Sink = Arc<dyn Fn(&Command) + Send + Sync>;

/// The hand-over point, shared by the services of one process through their `Context`.
#[derive(Default)]
pub struct LocalEvents {
    sink: RwLock<Option<Sink>>,
}

impl LocalEvents {
    /// Hands the commands of this process's events to `sink` from now on (the last one set
    /// receives them: a producer started again in the same process replaces the one before).
    pub fn deliver_to(&self, sink: Sink) {
        *self.sink.write().unwrap_or_else(PoisonError::into_inner) = Some(sink);
    }

    /// The event of `command` (as stored) is being published: hands it over, if anyone takes
    /// them. Nobody set costs one uncontended read lock.
    pub fn published(&self, command: &Command) {
        let sink = self
            .sink
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(sink) = sink {
            sink(command);
        }
    }
}

impl fmt::Debug for LocalEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.sink.read().map(|sink| sink.is_some()).unwrap_or(false);
        f.debug_struct("LocalEvents").field("sink", &set).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use sluice_core::command::{EffectSemantics, Intent};
    use sluice_core::ids::{CommandKey, RunId};
    use sluice_core::time::Timestamp;

    use super::*;

    #[test]
    fn the_last_sink_set_receives_the_published_commands() {
        let local = LocalEvents::default();
        let command = Command::from_intent(
            Intent {
                run_id: RunId::parse("r").expect("a run id"),
                command_key: CommandKey::parse("d-1/email/send/0").expect("a command key"),
                semantics: EffectSemantics::Idempotent,
                args: serde_json::json!({}),
                business_key: None,
                policy_version: "p-1".into(),
                max_attempts: 3,
                not_before: None,
            },
            Timestamp::from_millis(1),
            5_000,
        );
        local.published(&command); // nobody receives: nothing happens
        let (first, second) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(Vec::new())));
        let counted = Arc::clone(&first);
        local.deliver_to(Arc::new(move |_| *counted.lock().expect("count") += 1));
        local.published(&command);
        let seen = Arc::clone(&second);
        local.deliver_to(Arc::new(move |command: &Command| {
            seen.lock()
                .expect("seen")
                .push(command.command_key.to_string())
        }));
        local.published(&command);
        assert_eq!(*first.lock().expect("count"), 1, "replaced after one");
        assert_eq!(*second.lock().expect("seen"), vec!["d-1/email/send/0"]);
    }
}
