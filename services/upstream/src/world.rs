//! The world the demo upstream keeps: wires, emails, tickets and search counts, in memory.
//!
//! Pure and synchronous: the HTTP layer holds the lock, calls one method and answers with what
//! it returns. The bank is deliberately NON-idempotent (every booking is a new wire, whatever
//! its Idempotency-Key); mail and tickets deduplicate by Idempotency-Key. The invariant the
//! end-to-end tests check over [`Stats`] is that no business key has more than one wire that
//! was not reversed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::faults::FaultCounts;

/// The headers Sluice sends with every call (docs/architecture.md, "Wire contract"), as far as
/// the upstream records them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CallMeta {
    pub idempotency_key: Option<String>,
    pub run_id: Option<String>,
    pub command_key: Option<String>,
}

/// The body of `POST /bank/wires`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct WireOrder {
    pub account: String,
    pub amount_minor: i64,
    pub beneficiary: String,
    pub date: String,
    #[serde(default)]
    pub reference: Option<String>,
}

impl WireOrder {
    /// The business key the catalog derives for a wire,
    /// `{account}:{beneficiary}:{amount_minor}:{date}`, used when the request carries no
    /// `X-Sluice-Business-Key`.
    pub fn business_key(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.account, self.beneficiary, self.amount_minor, self.date
        )
    }

    /// Why the bank refuses this order, if it does.
    pub fn refusal(&self) -> Option<&'static str> {
        if self.account.is_empty() {
            Some("account must not be empty")
        } else if self.beneficiary.is_empty() {
            Some("beneficiary must not be empty")
        } else if self.amount_minor < 1 {
            Some("amount_minor must be at least 1")
        } else if self.date.is_empty() {
            Some("date must not be empty")
        } else {
            None
        }
    }
}

/// Whether a wire still stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WireStatus {
    Booked,
    Reversed,
}

/// One committed wire, as the bank answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Wire {
    pub id: String,
    pub status: WireStatus,
    pub business_key: String,
    pub account: String,
    pub amount_minor: i64,
    pub beneficiary: String,
    pub date: String,
    pub reference: Option<String>,
    pub idempotency_key: Option<String>,
    pub run_id: Option<String>,
    pub command_key: Option<String>,
    /// The reversal's id once reversed.
    pub reversal: Option<String>,
}

/// The answer to a status check by business key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyLookup {
    /// No standing wire has the key.
    Absent,
    /// Exactly one standing wire has it.
    Present(Box<Wire>),
    /// More than one standing wire has it, oldest first.
    Duplicate(Vec<String>),
}

/// Why a reversal was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReverseRefusal {
    UnknownWire,
    AlreadyReversed { reversal: String },
}

/// The body of `POST /email/messages`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct EmailDraft {
    pub to: String,
    pub subject: String,
    pub body: String,
}

/// One sent email.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Email {
    pub id: String,
    pub status: &'static str,
    pub to: String,
    pub subject: String,
}

/// The body of `POST /tickets`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct TicketDraft {
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub priority: Option<String>,
}

impl TicketDraft {
    const PRIORITIES: [&'static str; 3] = ["low", "normal", "high"];

    /// Why the ticket service refuses this draft, if it does.
    pub fn refusal(&self) -> Option<&'static str> {
        if self.title.is_empty() {
            Some("title must not be empty")
        } else if self
            .priority
            .as_deref()
            .is_some_and(|priority| !Self::PRIORITIES.contains(&priority))
        {
            Some("priority must be one of low, normal, high")
        } else {
            None
        }
    }
}

/// Whether a ticket is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TicketStatus {
    Open,
    Closed,
}

/// One ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Ticket {
    pub id: String,
    pub status: TicketStatus,
    pub title: String,
    pub body: Option<String>,
    pub priority: String,
}

/// The result of an operation deduplicated by Idempotency-Key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deduplicated<T> {
    pub value: T,
    /// False when an earlier request with the same key already created `value`.
    pub created: bool,
}

/// One search hit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Hit {
    pub id: String,
    pub title: String,
    pub score: f64,
}

/// A snapshot of what the upstream holds and did, for tests and the demo to assert on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Every wire record committed, duplicates and reversed ones included.
    pub wires: u64,
    /// Wires reversed.
    pub wires_reversed: u64,
    /// Per business key, how many of its wires stand (were not reversed). A key whose wires
    /// were all reversed is listed with 0.
    pub standing_wires_by_key: BTreeMap<String, u64>,
    /// Status checks answered (inconclusive ones included).
    pub status_checks: u64,
    /// Distinct emails sent.
    pub emails: u64,
    /// Email requests answered with an existing message because of their Idempotency-Key.
    pub email_replays: u64,
    /// Distinct tickets opened.
    pub tickets: u64,
    /// Tickets closed.
    pub tickets_closed: u64,
    /// Ticket requests answered with an existing ticket because of their Idempotency-Key.
    pub ticket_replays: u64,
    /// Searches answered.
    pub searches: u64,
    /// Faults injected, per kind.
    pub faults: FaultCounts,
}

impl Stats {
    /// The business keys with more than one standing wire, with their counts: a
    /// NON_IDEMPOTENT effect committed twice and not compensated. Empty when the invariant
    /// holds.
    pub fn double_commits(&self) -> BTreeMap<&str, u64> {
        self.standing_wires_by_key
            .iter()
            .filter(|(_, standing)| **standing > 1)
            .map(|(key, standing)| (key.as_str(), *standing))
            .collect()
    }

    /// How many wires stand under `business_key` (0 when it was never booked).
    pub fn standing_wires(&self, business_key: &str) -> u64 {
        self.standing_wires_by_key
            .get(business_key)
            .copied()
            .unwrap_or(0)
    }
}

/// The upstream's state.
#[derive(Debug, Default)]
pub(crate) struct World {
    /// Wire `w-<n>` sits at index n-1.
    wires: Vec<Wire>,
    wires_reversed: u64,
    status_checks: u64,
    /// Email `m-<n>` sits at index n-1.
    emails: Vec<Email>,
    email_keys: HashMap<String, usize>,
    email_replays: u64,
    /// Ticket `t-<n>` sits at index n-1.
    tickets: Vec<Ticket>,
    ticket_keys: HashMap<String, usize>,
    ticket_replays: u64,
    tickets_closed: u64,
    searches: u64,
}

impl World {
    /// Books a new wire under `business_key`. Never deduplicates: that is the bank's flaw the
    /// reconciler exists for.
    pub fn book_wire(&mut self, order: &WireOrder, business_key: &str, meta: &CallMeta) -> Wire {
        let wire = Wire {
            id: format!("w-{}", self.wires.len() + 1),
            status: WireStatus::Booked,
            business_key: business_key.to_owned(),
            account: order.account.clone(),
            amount_minor: order.amount_minor,
            beneficiary: order.beneficiary.clone(),
            date: order.date.clone(),
            reference: order.reference.clone(),
            idempotency_key: meta.idempotency_key.clone(),
            run_id: meta.run_id.clone(),
            command_key: meta.command_key.clone(),
            reversal: None,
        };
        self.wires.push(wire.clone());
        wire
    }

    /// The wire with `id`.
    pub fn wire(&self, id: &str) -> Option<&Wire> {
        index_of(id, "w-", self.wires.len()).map(|index| &self.wires[index])
    }

    /// The standing wires under `business_key`, answered as a status check.
    pub fn lookup_by_key(&mut self, business_key: &str) -> KeyLookup {
        self.status_checks += 1;
        let mut standing = self
            .wires
            .iter()
            .filter(|wire| wire.business_key == business_key && wire.status == WireStatus::Booked);
        match (standing.next(), standing.next()) {
            (None, _) => KeyLookup::Absent,
            (Some(wire), None) => KeyLookup::Present(Box::new(wire.clone())),
            (Some(first), Some(second)) => {
                let mut refs = vec![first.id.clone(), second.id.clone()];
                refs.extend(standing.map(|wire| wire.id.clone()));
                KeyLookup::Duplicate(refs)
            }
        }
    }

    /// Counts a status check that was answered inconclusive without looking.
    pub fn record_inconclusive_check(&mut self) {
        self.status_checks += 1;
    }

    /// Reverses wire `id`, returning the reversal's id.
    pub fn reverse_wire(&mut self, id: &str) -> Result<String, ReverseRefusal> {
        let index = index_of(id, "w-", self.wires.len()).ok_or(ReverseRefusal::UnknownWire)?;
        let wire = &mut self.wires[index];
        match wire.status {
            WireStatus::Reversed => Err(ReverseRefusal::AlreadyReversed {
                reversal: wire.reversal.clone().unwrap_or_default(),
            }),
            WireStatus::Booked => {
                self.wires_reversed += 1;
                let reversal = format!("rev-{}", self.wires_reversed);
                wire.status = WireStatus::Reversed;
                wire.reversal = Some(reversal.clone());
                Ok(reversal)
            }
        }
    }

    /// Sends an email, or answers the one sent earlier under the same Idempotency-Key.
    pub fn send_email(&mut self, draft: &EmailDraft, meta: &CallMeta) -> Deduplicated<Email> {
        if let Some(index) = meta
            .idempotency_key
            .as_ref()
            .and_then(|key| self.email_keys.get(key))
        {
            self.email_replays += 1;
            return Deduplicated {
                value: self.emails[*index].clone(),
                created: false,
            };
        }
        let email = Email {
            id: format!("m-{}", self.emails.len() + 1),
            status: "sent",
            to: draft.to.clone(),
            subject: draft.subject.clone(),
        };
        if let Some(key) = &meta.idempotency_key {
            self.email_keys.insert(key.clone(), self.emails.len());
        }
        self.emails.push(email.clone());
        Deduplicated {
            value: email,
            created: true,
        }
    }

    /// Opens a ticket, or answers the one opened earlier under the same Idempotency-Key.
    pub fn open_ticket(&mut self, draft: &TicketDraft, meta: &CallMeta) -> Deduplicated<Ticket> {
        if let Some(index) = meta
            .idempotency_key
            .as_ref()
            .and_then(|key| self.ticket_keys.get(key))
        {
            self.ticket_replays += 1;
            return Deduplicated {
                value: self.tickets[*index].clone(),
                created: false,
            };
        }
        let ticket = Ticket {
            id: format!("t-{}", self.tickets.len() + 1),
            status: TicketStatus::Open,
            title: draft.title.clone(),
            body: draft.body.clone(),
            priority: draft
                .priority
                .clone()
                .unwrap_or_else(|| "normal".to_owned()),
        };
        if let Some(key) = &meta.idempotency_key {
            self.ticket_keys.insert(key.clone(), self.tickets.len());
        }
        self.tickets.push(ticket.clone());
        Deduplicated {
            value: ticket,
            created: true,
        }
    }

    /// Closes ticket `id`; closing a closed ticket answers it again (a compensation may be
    /// retried). `None` for an unknown ticket.
    pub fn close_ticket(&mut self, id: &str) -> Option<Ticket> {
        let index = index_of(id, "t-", self.tickets.len())?;
        let ticket = &mut self.tickets[index];
        if ticket.status == TicketStatus::Open {
            ticket.status = TicketStatus::Closed;
            self.tickets_closed += 1;
        }
        Some(ticket.clone())
    }

    /// A few made-up hits for `query`, the same ones every time.
    pub fn search(&mut self, query: &str, limit: usize) -> Vec<Hit> {
        self.searches += 1;
        let digest = fnv1a(query.as_bytes());
        (1..=limit)
            .map(|rank| Hit {
                id: format!("kb-{digest:016x}-{rank}"),
                title: format!("{query}: knowledge base article {rank}"),
                score: 1.0 / rank as f64,
            })
            .collect()
    }

    /// A snapshot of the counters; `faults` comes from the server, which draws them.
    pub fn stats(&self, faults: FaultCounts) -> Stats {
        let mut standing_wires_by_key = BTreeMap::new();
        for wire in &self.wires {
            let standing = standing_wires_by_key
                .entry(wire.business_key.clone())
                .or_insert(0);
            if wire.status == WireStatus::Booked {
                *standing += 1;
            }
        }
        Stats {
            wires: count(self.wires.len()),
            wires_reversed: self.wires_reversed,
            standing_wires_by_key,
            status_checks: self.status_checks,
            emails: count(self.emails.len()),
            email_replays: self.email_replays,
            tickets: count(self.tickets.len()),
            tickets_closed: self.tickets_closed,
            ticket_replays: self.ticket_replays,
            searches: self.searches,
            faults,
        }
    }
}

/// The index of `<prefix><n>` in a list of `len` items numbered from 1.
fn index_of(id: &str, prefix: &str, len: usize) -> Option<usize> {
    let number: usize = id.strip_prefix(prefix)?.parse().ok()?;
    (1..=len).contains(&number).then(|| number - 1)
}

fn count(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// FNV-1a, to give each query stable made-up hit ids without a hashing dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(amount_minor: i64) -> WireOrder {
        WireOrder {
            account: "acct-1".to_owned(),
            amount_minor,
            beneficiary: "Ada".to_owned(),
            date: "2026-11-02".to_owned(),
            reference: None,
        }
    }

    fn keyed(key: &str) -> CallMeta {
        CallMeta {
            idempotency_key: Some(key.to_owned()),
            ..CallMeta::default()
        }
    }

    #[test]
    fn business_key_follows_the_catalog_template() {
        assert_eq!(order(5000).business_key(), "acct-1:Ada:5000:2026-11-02");
    }

    #[test]
    fn the_bank_books_every_request_even_under_one_idempotency_key() {
        let mut world = World::default();
        let first = world.book_wire(&order(5000), "k", &keyed("same"));
        let second = world.book_wire(&order(5000), "k", &keyed("same"));
        assert_eq!((first.id.as_str(), second.id.as_str()), ("w-1", "w-2"));
        assert_eq!(
            world.lookup_by_key("k"),
            KeyLookup::Duplicate(vec!["w-1".to_owned(), "w-2".to_owned()])
        );
        assert_eq!(
            world
                .stats(FaultCounts::default())
                .double_commits()
                .get("k"),
            Some(&2)
        );
    }

    #[test]
    fn reversal_takes_a_wire_out_of_the_key_lookup() {
        let mut world = World::default();
        assert_eq!(world.lookup_by_key("k"), KeyLookup::Absent);
        world.book_wire(&order(5000), "k", &CallMeta::default());
        world.book_wire(&order(5000), "k", &CallMeta::default());
        assert_eq!(world.reverse_wire("w-2"), Ok("rev-1".to_owned()));
        assert!(matches!(world.lookup_by_key("k"), KeyLookup::Present(wire) if wire.id == "w-1"));
        assert_eq!(
            world.reverse_wire("w-2"),
            Err(ReverseRefusal::AlreadyReversed {
                reversal: "rev-1".to_owned()
            })
        );
        assert_eq!(world.reverse_wire("w-3"), Err(ReverseRefusal::UnknownWire));
        assert_eq!(world.reverse_wire("w-0"), Err(ReverseRefusal::UnknownWire));
        assert_eq!(world.reverse_wire("x-1"), Err(ReverseRefusal::UnknownWire));
        assert_eq!(world.reverse_wire("w-1"), Ok("rev-2".to_owned()));
        assert_eq!(world.lookup_by_key("k"), KeyLookup::Absent);
        let stats = world.stats(FaultCounts::default());
        assert_eq!((stats.wires, stats.wires_reversed), (2, 2));
        assert_eq!(stats.standing_wires("k"), 0);
        assert!(stats.double_commits().is_empty());
        assert_eq!(stats.status_checks, 3);
    }

    #[test]
    fn email_and_tickets_deduplicate_by_idempotency_key_only() {
        let mut world = World::default();
        let draft = EmailDraft {
            to: "a@example.com".to_owned(),
            subject: "hi".to_owned(),
            body: "there".to_owned(),
        };
        let first = world.send_email(&draft, &keyed("k1"));
        let again = world.send_email(&draft, &keyed("k1"));
        let other = world.send_email(&draft, &keyed("k2"));
        let unkeyed = world.send_email(&draft, &CallMeta::default());
        assert!(first.created && !again.created && other.created && unkeyed.created);
        assert_eq!(first.value.id, again.value.id);
        assert_eq!(
            (other.value.id.as_str(), unkeyed.value.id.as_str()),
            ("m-2", "m-3")
        );

        let ticket = TicketDraft {
            title: "disk full".to_owned(),
            body: None,
            priority: None,
        };
        let opened = world.open_ticket(&ticket, &keyed("k1"));
        let replayed = world.open_ticket(&ticket, &keyed("k1"));
        assert_eq!(opened.value.id, "t-1");
        assert_eq!(replayed.value.id, "t-1");
        assert!(!replayed.created);
        assert_eq!(opened.value.priority, "normal");
        let closed = world.close_ticket("t-1").expect("t-1 exists");
        assert_eq!(closed.status, TicketStatus::Closed);
        assert!(
            world.close_ticket("t-1").is_some(),
            "closing twice is allowed"
        );
        assert_eq!(world.close_ticket("t-2"), None);

        let stats = world.stats(FaultCounts::default());
        assert_eq!((stats.emails, stats.email_replays), (3, 1));
        assert_eq!(
            (stats.tickets, stats.ticket_replays, stats.tickets_closed),
            (1, 1, 1)
        );
    }

    #[test]
    fn search_is_stable_and_respects_the_limit() {
        let mut world = World::default();
        let hits = world.search("refund policy", 4);
        assert_eq!(hits.len(), 4);
        assert_eq!(hits, world.search("refund policy", 4));
        assert_ne!(hits[0].id, world.search("wire cutoff", 1)[0].id);
        assert_eq!(world.stats(FaultCounts::default()).searches, 3);
    }

    #[test]
    fn ticket_priorities_are_checked() {
        let draft = |priority: &str| TicketDraft {
            title: "t".to_owned(),
            body: None,
            priority: Some(priority.to_owned()),
        };
        assert_eq!(draft("high").refusal(), None);
        assert!(draft("urgent").refusal().is_some());
    }
}
