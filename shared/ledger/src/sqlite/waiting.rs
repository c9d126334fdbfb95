//! The process's cache of the commands it left waiting for dispatch (`CommandStore::cached`): a hint
//! kept beside the ledger, never the truth; a miss costs a read.

use std::collections::HashMap;

use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};

/// At most this many commands are kept in [`Inner::waiting`](super::Inner::waiting); past it
/// the map starts afresh.
const MAX_WAITING: usize = 65_536;

/// The commands behind [`CommandStore::cached`](crate::CommandStore::cached), by a hash of their run id and
/// command key, so that noting a command (every reservation and transition) builds no key. Two
/// commands whose hashes collide take turns in one slot: the cache is a hint, and a miss costs a
/// read.
#[derive(Default)]
pub(super) struct Waiting {
    /// A collision only costs a cache miss, so the fast, randomly seeded hash will do.
    hasher: foldhash::fast::RandomState,
    commands: HashMap<u64, Noted>,
}

/// A waiting command, with a hash of its stored identity text when this process wrote it.
struct Noted {
    command: Command,
    /// Lets the command's next transition reuse this identity instead of decoding the stored
    /// one: it does when the text the writer read back hashes the same.
    identity: Option<u64>,
}

impl std::fmt::Debug for Waiting {
    // The count only: the commands carry their arguments, which stay out of debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("commands", &self.commands.len())
            .finish()
    }
}

impl Waiting {
    fn slot(&self, run_id: &RunId, command_key: &CommandKey) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, (run_id, command_key))
    }

    pub(super) fn identity_hash(&self, identity: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, identity)
    }

    /// Keeps `command`; `identity` is its stored identity text, when the caller has it.
    pub(super) fn insert(&mut self, command: Command, identity: Option<&str>) {
        if self.commands.len() >= MAX_WAITING {
            self.commands.clear();
        }
        let slot = self.slot(&command.run_id, &command.command_key);
        let identity = identity.map(|text| self.identity_hash(text));
        self.commands.insert(slot, Noted { command, identity });
    }

    pub(super) fn get(&self, run_id: &RunId, command_key: &CommandKey) -> Option<&Command> {
        let slot = self.slot(run_id, command_key);
        self.at(slot, run_id, command_key)
            .map(|noted| &noted.command)
    }

    /// The entry in `slot`, if it holds this very command (a collision may hold another).
    fn at(&self, slot: u64, run_id: &RunId, command_key: &CommandKey) -> Option<&Noted> {
        self.commands
            .get(&slot)
            .filter(|n| &n.command.run_id == run_id && &n.command.command_key == command_key)
    }

    /// Takes the command out, if kept with its identity's hash.
    pub(super) fn take(
        &mut self,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Option<(Command, u64)> {
        let slot = self.slot(run_id, command_key);
        let hash = self.at(slot, run_id, command_key)?.identity?;
        let noted = self.commands.remove(&slot)?;
        Some((noted.command, hash))
    }

    pub(super) fn remove(&mut self, run_id: &RunId, command_key: &CommandKey) {
        let slot = self.slot(run_id, command_key);
        if self.at(slot, run_id, command_key).is_some() {
            self.commands.remove(&slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Waiting;
    use crate::contract::{command, fresh_run};

    #[test]
    fn the_waiting_cache_answers_for_the_exact_command_only() {
        let run = fresh_run("waiting");
        let first = command(&run, 0, "email/send", 0, json!({}));
        let second = command(&run, 0, "email/send", 1, json!({}));
        let elsewhere = command(&fresh_run("waiting"), 0, "email/send", 0, json!({}));
        let mut waiting = Waiting::default();
        waiting.insert(first.clone(), None);
        let cached = waiting.get(&first.run_id, &first.command_key);
        assert_eq!(cached.map(|c| &c.command_key), Some(&first.command_key));
        assert!(waiting.get(&second.run_id, &second.command_key).is_none());
        assert!(
            waiting
                .get(&elsewhere.run_id, &elsewhere.command_key)
                .is_none()
        );

        waiting.remove(&second.run_id, &second.command_key);
        assert!(waiting.get(&first.run_id, &first.command_key).is_some());
        waiting.remove(&first.run_id, &first.command_key);
        assert!(waiting.get(&first.run_id, &first.command_key).is_none());

        waiting.insert(first.clone(), None);
        assert!(
            waiting.take(&first.run_id, &first.command_key).is_none(),
            "a command kept without its identity text is not taken"
        );
        waiting.insert(first.clone(), Some("stored text"));
        assert!(waiting.take(&second.run_id, &second.command_key).is_none());
        let (taken, hash) = waiting
            .take(&first.run_id, &first.command_key)
            .expect("kept with its identity");
        assert_eq!(taken.command_key, first.command_key);
        assert_eq!(hash, waiting.identity_hash("stored text"));
        assert!(waiting.get(&first.run_id, &first.command_key).is_none());
    }
}
