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
//! Idle conversations are forgotten after [`IDLE`] (a forgotten conversation's next call starts
//! its journal again, which Sluice's same-arguments check guards: other arguments at a used
//! position are refused as drift). A new conversation is kept only for a token Sluice knows
//! (checked first), and when [`MAX`] are in use a new one is refused, never one in use
//! forgotten to make room.

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
#[derive(Debug)]
pub struct Conversations {
    by_name: Mutex<HashMap<(u64, String), Entry>>,
    hasher: std::collections::hash_map::RandomState,
    max: usize,
}

impl Default for Conversations {
    fn default() -> Self {
        Self::with_max(MAX)
    }
}

/// No new conversation can be kept: [`MAX`] are in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "sluice mcp keeps {MAX} conversations, all in use in the last hour: name this call's position (dev.sluice/call) instead, or start the conversation later"
)]
pub struct Full;

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
    /// The conversation `id` of the caller holding `token`, if this process knows it (as of
    /// `now`, which keeps it from going idle).
    pub fn find(
        &self,
        token: Option<&str>,
        id: &str,
        now: Instant,
    ) -> Option<Arc<Mutex<Conversation>>> {
        let name = (self.caller(token), id.to_owned());
        let mut by_name = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = by_name.get_mut(&name)?;
        entry.used = now;
        Some(entry.conversation.clone())
    }

    /// The conversation `id` of the caller holding `token`, new if unknown — once the caller's
    /// token is known to Sluice (the server checks it first, so a stranger cannot fill the
    /// table). Idle conversations are forgotten first; a full table refuses a new one rather
    /// than forget one in use (its next call would start its journal again).
    pub fn open(
        &self,
        token: Option<&str>,
        id: &str,
        now: Instant,
    ) -> Result<Arc<Mutex<Conversation>>, Full> {
        let name = (self.caller(token), id.to_owned());
        let mut by_name = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = by_name.get_mut(&name) {
            entry.used = now;
            return Ok(entry.conversation.clone());
        }
        by_name.retain(|_, entry| now.saturating_duration_since(entry.used) < IDLE);
        if by_name.len() >= self.max {
            return Err(Full);
        }
        let conversation = Arc::<Mutex<Conversation>>::default();
        by_name.insert(
            name,
            Entry {
                conversation: conversation.clone(),
                used: now,
            },
        );
        Ok(conversation)
    }

    fn caller(&self, token: Option<&str>) -> u64 {
        self.hasher.hash_one(token.unwrap_or_default())
    }

    fn with_max(max: usize) -> Self {
        Self {
            by_name: Mutex::default(),
            hasher: std::collections::hash_map::RandomState::new(),
            max,
        }
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

    fn open(
        conversations: &Conversations,
        token: &str,
        id: &str,
        now: Instant,
    ) -> Arc<Mutex<Conversation>> {
        conversations.open(Some(token), id, now).expect("room")
    }

    #[test]
    fn one_id_is_one_conversation_per_caller() {
        let conversations = Conversations::default();
        let now = Instant::now();
        assert!(conversations.find(Some("token-a"), "c-1", now).is_none());
        let mine = open(&conversations, "token-a", "c-1", now);
        let found = conversations
            .find(Some("token-a"), "c-1", now)
            .expect("kept");
        assert!(Arc::ptr_eq(&mine, &found));
        assert!(Arc::ptr_eq(
            &mine,
            &open(&conversations, "token-a", "c-1", now)
        ));
        assert!(conversations.find(Some("token-b"), "c-1", now).is_none());
        assert!(!Arc::ptr_eq(
            &mine,
            &open(&conversations, "token-b", "c-1", now)
        ));
        assert!(!Arc::ptr_eq(
            &mine,
            &open(&conversations, "token-a", "c-2", now)
        ));
    }

    #[test]
    fn idle_conversations_are_forgotten_and_busy_ones_never() {
        let conversations = Conversations::with_max(2);
        let then = Instant::now();
        let old = open(&conversations, "t", "c-1", then);
        open(&conversations, "t", "c-2", then);
        assert_eq!(
            conversations
                .open(Some("t"), "c-3", then + Duration::from_secs(60))
                .err(),
            Some(Full),
            "full of conversations in use: a new one is refused"
        );
        let later = then + IDLE + Duration::from_secs(1);
        open(&conversations, "t", "c-3", later);
        assert_eq!(conversations.len(), 1, "the idle ones went");
        assert!(!Arc::ptr_eq(&old, &open(&conversations, "t", "c-1", later)));
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("agent-7:conversation-1").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("has space").is_err());
        assert!(check_id(&"x".repeat(MAX_ID_LEN + 1)).is_err());
    }
}
