//! Where an MCP tool call stands in its run's journal: the rule that gives a re-driven MCP
//! conversation the same command keys, over stdio and streamable HTTP alike. Pure: the server
//! tells it what arrived and how each call ended, and it answers with keys.
//!
//! **The rule.**
//!
//! 1. A journal position belongs to a run *within one conversation* (the `sluice mcp` process
//!    over stdio, one `Mcp-Session-Id` over HTTP). A new conversation naming a run that
//!    exists walks it from the start: it is a re-drive, and gets the same keys and the
//!    stored results. To add to a run instead, a conversation moves to a decision the run has
//!    not used (`dev.sluice/decision`).
//! 2. Within a conversation, calls of a tool are numbered from 0 per decision in the order
//!    they arrive, as [`sluice_core::journal::Journal`] numbers them for the SDKs.
//! 3. A call may name its index (`dev.sluice/call`): it takes exactly that position, and the
//!    conversation's count for that tool moves past it (never back). A client that names its
//!    positions can retry anything, in any conversation, and get the same key.
//! 4. A retry does not advance the journal. A call whose answer never reached the client —
//!    the client cancelled it (its own timeout: the MCP SDKs send `notifications/cancelled`),
//!    or Sluice could not say what became of it (unavailable, unreachable) — leaves its
//!    position *open*: the next call of the same run, decision and tool with the same
//!    arguments takes that position again instead of a new one. A call that was answered
//!    (done, failed, refused, waiting for a person, still running) has spent its position;
//!    the same call again is a new effect, as the model asked.
//! 5. Without a conversation (an HTTP request outside a session, as MCP 2026-07-28 makes them)
//!    there is no order to count: the call names its index, or the conversation it belongs to
//!    (`dev.sluice/conversation`, [`super::conversations`]), which the client keeps instead of
//!    a session.
//!
//! Two conversations that name one run (two agents sharing a run by mistake) walk the same
//! positions: other arguments at a position are refused by Sluice as argument drift (409, the
//! honest answer), the same arguments are one effect whose result both get.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;
use sluice_core::{CommandKey, RunId, ToolName};
use tokio_util::sync::CancellationToken;

/// The most open positions a conversation keeps; past it the oldest are forgotten (their
/// retries then take new positions, which the ledger's same-arguments check still guards).
const MAX_OPEN: usize = 1024;

/// One tool call as it arrived.
#[derive(Debug)]
pub struct Call<'a> {
    pub run: &'a RunId,
    pub tool: &'a ToolName,
    /// `dev.sluice/decision`, when named.
    pub decision: Option<u32>,
    /// `dev.sluice/call`, when named.
    pub index: Option<u32>,
    pub args: &'a Value,
    /// Whether the call arrived in a conversation (stdio, or an HTTP session).
    pub ordered: bool,
    /// Cancelled when the client gives the request up.
    pub abandoned: CancellationToken,
}

/// The position a call took; hand it back to [`Conversation::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub key: CommandKey,
    holder: u64,
}

/// A call that cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misplaced {
    #[error(
        "a call without an MCP session has no order to count positions by: name its index in _meta[\"dev.sluice/call\"], or the conversation it belongs to in _meta[\"dev.sluice/conversation\"] (and its run in _meta[\"dev.sluice/run_id\"])"
    )]
    Unordered,
}

/// One run's position within a conversation.
#[derive(Debug)]
struct RunJournal {
    decision: u32,
    calls: HashMap<ToolName, u32>,
}

impl RunJournal {
    fn new() -> Self {
        Self {
            decision: 1,
            calls: HashMap::new(),
        }
    }

    fn move_to(&mut self, decision: u32) {
        if decision != self.decision {
            self.decision = decision;
            self.calls.clear();
        }
    }
}

/// A position whose call has not been answered.
#[derive(Debug)]
struct Open {
    run: RunId,
    key: CommandKey,
    args: Value,
    /// The call holding the position now; only its end counts.
    holder: u64,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Its call is running; open again once the client abandons it.
    Held(CancellationToken),
    /// Its call ended without an answer of what became of it.
    Unanswered,
}

impl Open {
    fn is_free(&self) -> bool {
        match &self.state {
            State::Held(abandoned) => abandoned.is_cancelled(),
            State::Unanswered => true,
        }
    }
}

/// The journals of one conversation, and its positions not yet answered.
#[derive(Debug, Default)]
pub struct Conversation {
    journals: HashMap<RunId, RunJournal>,
    open: VecDeque<Open>,
    holders: u64,
}

impl Conversation {
    /// The position of `call` (see the module's rule).
    pub fn place(&mut self, call: Call<'_>) -> Result<Placed, Misplaced> {
        if !call.ordered && call.index.is_none() {
            return Err(Misplaced::Unordered);
        }
        let journal = self
            .journals
            .entry(call.run.clone())
            .or_insert_with(RunJournal::new);
        if let Some(decision) = call.decision {
            journal.move_to(decision);
        }
        let decision = journal.decision;
        let count = journal.calls.entry(call.tool.clone()).or_insert(0);
        let key = match call.index {
            Some(index) => {
                *count = (*count).max(index.saturating_add(1));
                CommandKey::new(decision, call.tool.clone(), index)
            }
            None => {
                let retried = self.open.iter().position(|open| {
                    open.is_free()
                        && open.run == *call.run
                        && open.key.decision() == decision
                        && open.key.tool() == call.tool
                        && open.args == *call.args
                });
                match retried {
                    Some(at) => {
                        let open = &mut self.open[at];
                        self.holders += 1;
                        open.holder = self.holders;
                        open.state = State::Held(call.abandoned);
                        return Ok(Placed {
                            key: open.key.clone(),
                            holder: open.holder,
                        });
                    }
                    None => {
                        let key = CommandKey::new(decision, call.tool.clone(), *count);
                        *count = count.saturating_add(1);
                        key
                    }
                }
            }
        };
        self.holders += 1;
        // A named position may be open already (a retry naming it): it is held anew.
        self.open
            .retain(|open| !(open.run == *call.run && open.key == key));
        self.open.push_back(Open {
            run: call.run.clone(),
            key: key.clone(),
            args: call.args.clone(),
            holder: self.holders,
            state: State::Held(call.abandoned),
        });
        while self.open.len() > MAX_OPEN {
            self.open.pop_front();
        }
        Ok(Placed {
            key,
            holder: self.holders,
        })
    }

    /// How the call at `placed` ended: `answered` when Sluice said what became of it and the
    /// client still waited for the answer (the position is spent), else the position stays
    /// open for its retry. A call that no longer holds its position (a retry took it over)
    /// changes nothing.
    pub fn finish(&mut self, placed: &Placed, answered: bool) {
        let Some(at) = self
            .open
            .iter()
            .position(|open| open.holder == placed.holder)
        else {
            return;
        };
        if answered && !self.open[at].is_free() {
            self.open.remove(at);
        } else {
            self.open[at].state = State::Unanswered;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(raw: &str) -> RunId {
        RunId::parse(raw).expect("a run")
    }

    fn tool(raw: &str) -> ToolName {
        ToolName::parse(raw).expect("a tool")
    }

    struct Caller {
        run: RunId,
        tool: ToolName,
        args: Value,
        decision: Option<u32>,
        index: Option<u32>,
        ordered: bool,
    }

    impl Caller {
        fn new(args: Value) -> Self {
            Self {
                run: run("r-1"),
                tool: tool("tickets/create"),
                args,
                decision: None,
                index: None,
                ordered: true,
            }
        }

        fn call(&self, abandoned: &CancellationToken) -> Call<'_> {
            Call {
                run: &self.run,
                tool: &self.tool,
                decision: self.decision,
                index: self.index,
                args: &self.args,
                ordered: self.ordered,
                abandoned: abandoned.clone(),
            }
        }
    }

    /// Places and answers `caller`'s call: its key.
    fn answered(conversation: &mut Conversation, caller: &Caller) -> String {
        let placed = conversation
            .place(caller.call(&CancellationToken::new()))
            .expect("placed");
        conversation.finish(&placed, true);
        placed.key.as_str().to_owned()
    }

    #[test]
    fn each_conversation_walks_a_run_from_its_start() {
        let ticket = Caller::new(json!({"title": "t"}));
        let mut keys = Vec::new();
        for _ in 0..3 {
            let mut conversation = Conversation::default();
            keys.push(answered(&mut conversation, &ticket));
        }
        assert_eq!(keys, vec!["d-1/tickets/create/0"; 3]);
    }

    #[test]
    fn answered_calls_spend_their_positions_even_with_the_same_arguments() {
        let ticket = Caller::new(json!({"title": "t"}));
        let mut conversation = Conversation::default();
        assert_eq!(answered(&mut conversation, &ticket), "d-1/tickets/create/0");
        assert_eq!(answered(&mut conversation, &ticket), "d-1/tickets/create/1");
        let mut other_run = Caller::new(json!({"title": "t"}));
        other_run.run = run("r-2");
        assert_eq!(
            answered(&mut conversation, &other_run),
            "d-1/tickets/create/0",
            "runs keep their own journals"
        );
    }

    #[test]
    fn a_call_the_client_abandoned_is_retried_at_its_position() {
        let ticket = Caller::new(json!({"title": "t"}));
        let mut conversation = Conversation::default();
        let client_gave_up = CancellationToken::new();
        let first = conversation
            .place(ticket.call(&client_gave_up))
            .expect("placed");
        // The client's timeout fires and it cancels; its retry arrives before the first call's
        // handler has even noticed.
        client_gave_up.cancel();
        let retry = conversation
            .place(ticket.call(&CancellationToken::new()))
            .expect("placed");
        assert_eq!(retry.key, first.key);
        // The abandoned handler ends later, unanswered: the retry holds the position still.
        conversation.finish(&first, false);
        conversation.finish(&retry, true);
        assert_eq!(answered(&mut conversation, &ticket), "d-1/tickets/create/1");
    }

    #[test]
    fn an_answer_the_client_gave_up_on_does_not_spend_the_position() {
        let ticket = Caller::new(json!({"title": "t"}));
        let mut conversation = Conversation::default();
        let client_gave_up = CancellationToken::new();
        let first = conversation
            .place(ticket.call(&client_gave_up))
            .expect("placed");
        client_gave_up.cancel();
        // Sluice answered just as the client stopped reading.
        conversation.finish(&first, true);
        assert_eq!(answered(&mut conversation, &ticket), "d-1/tickets/create/0");
    }

    #[test]
    fn a_call_still_running_is_not_taken_by_a_second_identical_one() {
        let ticket = Caller::new(json!({"title": "t"}));
        let mut conversation = Conversation::default();
        let running = CancellationToken::new();
        let first = conversation.place(ticket.call(&running)).expect("placed");
        let second = conversation
            .place(ticket.call(&CancellationToken::new()))
            .expect("placed");
        assert_eq!(first.key.as_str(), "d-1/tickets/create/0");
        assert_eq!(
            second.key.as_str(),
            "d-1/tickets/create/1",
            "two calls at once are two calls: a re-drive makes them again, in order"
        );
    }

    #[test]
    fn a_call_sluice_could_not_answer_is_retried_at_its_position_with_the_same_arguments_only() {
        let ticket = Caller::new(json!({"title": "t"}));
        let mut conversation = Conversation::default();
        let unanswered = conversation
            .place(ticket.call(&CancellationToken::new()))
            .expect("placed");
        conversation.finish(&unanswered, false);
        let other = Caller::new(json!({"title": "another"}));
        assert_eq!(answered(&mut conversation, &other), "d-1/tickets/create/1");
        let mut elsewhere = Caller::new(json!({"title": "t"}));
        elsewhere.decision = Some(2);
        assert_eq!(
            answered(&mut conversation, &elsewhere),
            "d-2/tickets/create/0"
        );
        let mut back = Caller::new(json!({"title": "t"}));
        back.decision = Some(1);
        assert_eq!(
            answered(&mut conversation, &back),
            "d-1/tickets/create/0",
            "its retry, with the same arguments in the same decision"
        );
    }

    #[test]
    fn a_named_index_is_taken_as_named_and_the_count_moves_past_it() {
        let mut named = Caller::new(json!({"title": "t"}));
        named.index = Some(4);
        let mut conversation = Conversation::default();
        assert_eq!(answered(&mut conversation, &named), "d-1/tickets/create/4");
        assert_eq!(answered(&mut conversation, &named), "d-1/tickets/create/4");
        let implicit = Caller::new(json!({"title": "t"}));
        assert_eq!(
            answered(&mut conversation, &implicit),
            "d-1/tickets/create/5"
        );
        named.index = Some(2);
        assert_eq!(answered(&mut conversation, &named), "d-1/tickets/create/2");
        assert_eq!(
            answered(&mut conversation, &implicit),
            "d-1/tickets/create/6",
            "never back"
        );
    }

    #[test]
    fn arguments_compare_as_values_not_as_text() {
        let mut conversation = Conversation::default();
        let first = Caller::new(json!({"title": "t", "priority": "high"}));
        let placed = conversation
            .place(first.call(&CancellationToken::new()))
            .expect("placed");
        conversation.finish(&placed, false);
        let reordered: Value =
            serde_json::from_str(r#"{"priority": "high", "title": "t"}"#).expect("json");
        assert_eq!(
            answered(&mut conversation, &Caller::new(reordered)),
            "d-1/tickets/create/0"
        );
    }

    #[test]
    fn a_sessionless_call_must_name_its_index() {
        let mut sessionless = Caller::new(json!({"title": "t"}));
        sessionless.ordered = false;
        let mut conversation = Conversation::default();
        assert_eq!(
            conversation.place(sessionless.call(&CancellationToken::new())),
            Err(Misplaced::Unordered)
        );
        sessionless.index = Some(0);
        assert_eq!(
            answered(&mut conversation, &sessionless),
            "d-1/tickets/create/0"
        );
    }
}
