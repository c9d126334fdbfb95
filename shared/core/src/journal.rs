//! An agent's journal position: which decision it is in, and how many calls of each tool it
//! has made in that decision. Every client of Sluice (the Python and TypeScript SDKs, `sluice
//! mcp`) derives command keys the same way, so an agent re-driven from the start produces the
//! same keys and gets the stored results back instead of new effects. The shared vectors in
//! `sdk/test-vectors/journal.json` hold every implementation to it.
//!
//! A new journal is in decision 1. [`Journal::decide`] opens the next decision; within one,
//! the calls of a tool are numbered from 0 in the order they are made.

use std::collections::HashMap;

use crate::ids::{CommandKey, ToolName};

/// The journal position of one run, as an agent walks it.
#[derive(Debug, Clone)]
pub struct Journal {
    decision: u32,
    calls: HashMap<ToolName, u32>,
}

impl Default for Journal {
    fn default() -> Self {
        Self::new()
    }
}

impl Journal {
    /// A journal at the start of a run: decision 1, no calls yet.
    pub fn new() -> Self {
        Self {
            decision: 1,
            calls: HashMap::new(),
        }
    }

    /// The decision the next call belongs to.
    pub fn decision(&self) -> u32 {
        self.decision
    }

    /// Opens the next decision; call indexes start again from 0. Saturates at `u32::MAX`.
    pub fn decide(&mut self) -> u32 {
        self.decision = self.decision.saturating_add(1);
        self.calls.clear();
        self.decision
    }

    /// Moves to `decision` as a client names it (an MCP client's `_meta`); call indexes
    /// restart when the decision changes, so going back re-walks that decision's positions.
    pub fn move_to(&mut self, decision: u32) {
        if decision != self.decision {
            self.decision = decision;
            self.calls.clear();
        }
    }

    /// The key of the next call of `tool` in this decision, and counts the call.
    pub fn next_call(&mut self, tool: &ToolName) -> CommandKey {
        let index = self.calls.entry(tool.clone()).or_insert(0);
        let key = CommandKey::new(self.decision, tool.clone(), *index);
        *index = index.saturating_add(1);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(raw: &str) -> ToolName {
        ToolName::parse(raw).expect("a valid tool name")
    }

    #[test]
    fn calls_are_numbered_per_tool_within_a_decision() {
        let mut journal = Journal::new();
        let (wire, email) = (tool("payments/wire"), tool("email/send"));
        assert_eq!(journal.next_call(&wire).as_str(), "d-1/payments/wire/0");
        assert_eq!(journal.next_call(&email).as_str(), "d-1/email/send/0");
        assert_eq!(journal.next_call(&wire).as_str(), "d-1/payments/wire/1");
        assert_eq!(journal.decide(), 2);
        assert_eq!(journal.next_call(&wire).as_str(), "d-2/payments/wire/0");
    }
}
