//! Conversations a client names itself (`_meta["dev.sluice/conversation"]`): what gives a
//! stateless MCP client (protocol 2026-07-28 over HTTP, no session) an order to count journal
//! positions by, without naming every position.
//!
//! A named conversation is a [`Conversation`] like a session's, kept in this process's memory,
//! per caller (the caller's token, hashed with this process's random key, is part of its name:
//! another token naming the same id gets a conversation of its own). A new id is a new
//! conversation, so a re-driven agent that starts a new id walks its run from the start and gets
//! the same keys and stored results; a retry keeps the id and the position ([`super::position`]).
//!
//! **Replicas.** The journal position of a named conversation is this process's memory, so a
//! conversation's calls must reach one `sluice mcp` process (one replica, or a load balancer
//! with client affinity, e.g. on the source address). A client that runs behind several replicas
//! without affinity names its positions instead (`dev.sluice/call`): a named position is the
//! same key on every replica, with nothing remembered. Deriving a conversation's count from the
//! ledger would need the ledger to know conversations, which it does not: a re-drive *is* a new
//! conversation over the same commands.
//!
//! Idle conversations are forgotten after [`IDLE`], and past [`MAX`] the least recently used
//! goes first: a forgotten conversation's next call starts its journal again, which Sluice's
//! same-arguments check guards (other arguments at a used position are refused as drift).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::position::Conversation;

/// How long a named conversation is kept without a call.
pub const IDLE: Duration = Duration::from_secs(3600);
/// The most named conversations one process keeps.
pub const MAX: usize = 10_000;
/// The longest conversation id taken.
pub const MAX_ID_LEN: usize = 128;

/// The named conversations of this process.
#[derive(Debug, Default)]
pub struct Conversations {
    by_name: Mutex<HashMap<(u64, String), Entry>>,
    hasher: std::collections::hash_map::RandomState,
}

#[derive(Debug)]
struct Entry {
    conversation: Arc<Mutex<Conversation>>,
    used: Instant,
}

/// Checks a conversation id: 1 to [`MAX_ID_LEN`] printable ASCII characters.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("must be 1 to {MAX_ID_LEN} characters"));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may contain only printable ASCII characters, no spaces".to_owned());
    }
    Ok(())
}

impl Conversations {
    /// The conversation `id` of the caller holding `token` (new if unknown), as of `now`.
    pub fn get(&self, token: Option<&str>, id: &str, now: Instant) -> Arc<Mutex<Conversation>> {
        let caller = self.hasher.hash_one(token.unwrap_or_default());
        let mut by_name = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = by_name.get_mut(&(caller, id.to_owned())) {
            entry.used = now;
            return entry.conversation.clone();
        }
        by_name.retain(|_, entry| now.saturating_duration_since(entry.used) < IDLE);
        while by_name.len() >= MAX {
            let Some(oldest) = by_name
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(name, _)| name.clone())
            else {
                break;
            };
            by_name.remove(&oldest);
        }
        let conversation = Arc::<Mutex<Conversation>>::default();
        by_name.insert(
            (caller, id.to_owned()),
            Entry {
                conversation: conversation.clone(),
                used: now,
            },
        );
        conversation
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_name
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_id_is_one_conversation_per_caller() {
        let conversations = Conversations::default();
        let now = Instant::now();
        let mine = conversations.get(Some("token-a"), "c-1", now);
        assert!(Arc::ptr_eq(
            &mine,
            &conversations.get(Some("token-a"), "c-1", now)
        ));
        assert!(!Arc::ptr_eq(
            &mine,
            &conversations.get(Some("token-b"), "c-1", now)
        ));
        assert!(!Arc::ptr_eq(
            &mine,
            &conversations.get(Some("token-a"), "c-2", now)
        ));
    }

    #[test]
    fn idle_conversations_are_forgotten() {
        let conversations = Conversations::default();
        let then = Instant::now();
        let old = conversations.get(None, "c-1", then);
        let later = then + IDLE + Duration::from_secs(1);
        conversations.get(None, "c-2", later);
        assert_eq!(conversations.len(), 1);
        assert!(!Arc::ptr_eq(&old, &conversations.get(None, "c-1", later)));
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("agent-7:conversation-1").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("has space").is_err());
        assert!(check_id(&"x".repeat(MAX_ID_LEN + 1)).is_err());
    }
}
