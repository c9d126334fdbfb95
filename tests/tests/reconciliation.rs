//! Ambiguous outcomes end to end (docs/architecture.md, "Ambiguous outcomes"): the demo bank
//! commits and then fails to say so, and the pipeline must find out from evidence — the status
//! check by business key — instead of retrying blindly. Each test forces one fault at rate 1 and
//! checks the command's end state, the bank's books (no business key with two standing wires) and
//! the audit chain.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sluice_core::command::CommandStatus::*;
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

/// The wire's dispatch timeout in these tests: short, so a held response times out quickly.
const WIRE_TIMEOUT_MS: i64 = 400;
/// How long the bank holds a `commit_then_timeout` response: well past the timeout.
const HOLD: Duration = Duration::from_secs(3);
/// The wire's settle interval: an `absent` must hold this long before a redispatch.
const SETTLE_MS: i64 = 600;

fn bank(kind: FaultKind) -> Faults {
    Faults::none()
        .with_rates(Family::Bank, FaultRates::only(kind, 1.0))
        .with_timeout_sleep(HOLD)
}

/// How long after its timeout a wire may still be booked: an `absent` counts only after that.
const LATE_COMMIT_MS: i64 = 300;

fn short_wires(c: CatalogEdit) -> CatalogEdit {
    c.dispatch("payments/wire", "timeout_ms", WIRE_TIMEOUT_MS)
        .policy("payments/wire", "lease_ttl_ms", 2_000)
        .policy("payments/wire", "settle_ms", SETTLE_MS)
        .policy("payments/wire", "late_commit_ms", LATE_COMMIT_MS)
}

async fn bank_wire(h: &Harness, id: &str) -> Value {
    reqwest::get(format!("{}/bank/wires/{id}", h.upstream.base_url()))
        .await
        .expect("the bank answers")
        .json()
        .await
        .expect("a wire as JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_confirmed_by_the_status_check() {
    let h = Harness::start(Faults::none(), short_wires).await;
    let flavours = [
        FaultKind::CommitThenTimeout,
        FaultKind::CommitThen5xx,
        FaultKind::DropResponse,
    ];
    for (i, kind) in flavours.into_iter().enumerate() {
        h.upstream.set_faults(bank(kind)).expect("valid faults");
        let run = format!("r-present-{i}");
        let account = format!("acc-present-{i}");
        let key = "d-1/payments/wire/0";
        h.agent
            .submit_created(&effect(
                &run,
                1,
                "payments/wire",
                0,
                wire_args(&account, 5_000),
            ))
            .await;
        let wire = h.agent.wait_settled(&run, key).await;
        let stats = h.upstream.stats();
        assert_eq!(stats.faults.get(kind), 1, "{kind} was acted out: {stats:?}");
        assert_eq!(wire.status(), Confirmed, "{kind}: {wire:?}");
        assert_eq!(
            wire.state.attempts, 1,
            "{kind}: confirmed without a second dispatch"
        );
        assert_eq!(
            stats.standing_wires(&wire_business_key(&account, 5_000)),
            1,
            "{kind}: exactly one wire for the key: {stats:?}"
        );
        assert_eq!(stats.wires, i as u64 + 1, "{kind}: no wire was sent twice");
        // The reference comes from the status check, since the dispatch answer was lost, and
        // it names the wire the bank booked for this command.
        let reference = wire.state.external_ref.clone().expect("a reference");
        let booked = bank_wire(&h, &reference).await;
        assert_eq!(booked["idempotency_key"], format!("{run}/{key}"));
        assert_eq!(booked["status"], "booked");
        // The agent gets a result as if the answer had arrived: the record the lookup found
        // (an agent that reads its wire's id must not break exactly when Sluice had to look).
        let result = wire
            .state
            .result
            .as_deref()
            .expect("a result from the lookup");
        assert_eq!(result["id"], reference.as_str(), "{kind}: {result}");
        assert_eq!(result["idempotency_key"], format!("{run}/{key}"));

        let trail = h.audit(&run).await;
        assert_eq!(
            trail.path(key),
            vec![
                (None, Some(Pending)),
                (Some(Pending), Some(Leased)),
                (Some(Leased), Some(Unknown)),
                (Some(Unknown), Some(Confirmed)),
            ],
            "{kind}: {:#?}",
            trail.describe(key)
        );
        let present = trail.find(key, Unknown, Confirmed);
        assert_eq!(present.record.actor, "reconciler");
        assert_eq!(present.record.reason, "status check: present");
        assert!(
            present.record.evidence["request"]["url"]
                .as_str()
                .is_some_and(|url| url.contains("/bank/wires/by-key/")),
            "the evidence names the status check: {}",
            present.record.evidence
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absence_seen_twice_a_settle_interval_apart_is_redispatched_once() {
    let h = Harness::start(bank(FaultKind::Error5xx), short_wires).await;
    let (run, key) = ("r-absent", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-absent", 5_000),
        ))
        .await;
    // The 503 arrives (nothing booked, but a 5xx is ambiguous); from then on the bank behaves.
    eventually("the bank to answer 503 once", DEADLINE, || async {
        (h.upstream.stats().faults.error_5xx >= 1).then_some(())
    })
    .await;
    h.upstream.set_faults(Faults::none()).expect("valid faults");

    let wire = h.agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(wire.state.attempts, 2, "redispatched exactly once");
    let stats = h.upstream.stats();
    assert_eq!(stats.faults.error_5xx, 1, "{stats:?}");
    assert_eq!(stats.wires, 1, "one wire in the end: {stats:?}");
    assert_eq!(
        stats.standing_wires(&wire_business_key("acc-absent", 5_000)),
        1
    );
    assert_eq!(wire.state.external_ref.as_deref(), Some("w-1"));

    let trail = h.audit(run).await;
    assert_eq!(
        trail.path(key),
        vec![
            (None, Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Unknown)),
            // Absent, but the 503'd attempt may still be booked until its horizon.
            (Some(Unknown), Some(Unknown)),
            // Absent after the horizon: the first look that counts.
            (Some(Unknown), Some(Unknown)),
            (Some(Unknown), Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Confirmed)),
        ],
        "{:#?}",
        trail.describe(key)
    );
    let too_early = trail.find(key, Unknown, Unknown);
    assert!(
        too_early.record.reason.contains("may still land"),
        "{}",
        too_early.record.reason
    );
    let ambiguous = trail.find(key, Leased, Unknown);
    let first_absent = trail
        .of(key)
        .into_iter()
        .filter(|r| r.record.from == Some(Unknown) && r.record.to == Some(Unknown))
        .nth(1)
        .expect("a second look");
    let redispatch = trail.find(key, Unknown, Pending);
    let horizon = first_absent.record.at.millis_since(ambiguous.record.at);
    assert!(
        horizon >= LATE_COMMIT_MS,
        "the absence counted {horizon} ms after the ambiguous answer, before the {LATE_COMMIT_MS} ms late-commit horizon"
    );
    assert!(
        first_absent.record.reason.contains("absent"),
        "{}",
        first_absent.record.reason
    );
    assert!(
        redispatch.record.reason.contains("absent"),
        "{}",
        redispatch.record.reason
    );
    let waited = redispatch.record.at.millis_since(first_absent.record.at);
    assert!(
        waited >= SETTLE_MS,
        "the absence was trusted after {waited} ms, before the {SETTLE_MS} ms settle interval"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absence_fails_the_command_when_the_tool_asks_a_person_to_decide() {
    let h = Harness::start(bank(FaultKind::Error5xx), |c| {
        short_wires(c).policy("payments/wire", "on_absent", "fail")
    })
    .await;
    let (run, key) = ("r-absent-fail", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-fail", 5_000),
        ))
        .await;
    let wire = h.agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), Failed, "{wire:?}");
    assert_eq!(wire.state.attempts, 1);
    assert!(
        wire.state
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("on_absent")),
        "{wire:?}"
    );
    assert_eq!(h.upstream.stats().wires, 0, "nothing was ever booked");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_commit_is_confirmed_and_the_extra_wire_reversed() {
    let h = Harness::start(Faults::none(), short_wires).await;
    let (run, key) = ("r-dup", "d-1/payments/wire/0");
    let business_key = wire_business_key("acc-dup", 5_000);
    // Another booking under the same business key, made at the bank directly: with the
    // pipeline's own (ambiguous) booking below, two wires stand for one intent.
    let preloaded = reqwest::Client::new()
        .post(format!("{}/bank/wires", h.upstream.base_url()))
        .header("X-Sluice-Business-Key", &business_key)
        .json(&wire_args("acc-dup", 5_000))
        .send()
        .await
        .expect("the bank answers");
    assert_eq!(preloaded.status(), StatusCode::CREATED);
    h.upstream
        .set_faults(bank(FaultKind::CommitThen5xx))
        .expect("valid faults");

    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-dup", 5_000),
        ))
        .await;
    let wire = h.agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(wire.state.attempts, 1);

    // The clean-up of the extra commit runs after the command is CONFIRMED.
    eventually("the extra wire to be reversed", DEADLINE, || async {
        (h.upstream.stats().wires_reversed >= 1).then_some(())
    })
    .await;
    let stats = h.upstream.stats();
    assert_eq!(stats.wires, 2, "{stats:?}");
    assert_eq!(stats.wires_reversed, 1, "only the extra wire: {stats:?}");
    assert_eq!(stats.standing_wires(&business_key), 1, "{stats:?}");
    assert_no_double_commit(&stats);
    // The command's reference names the wire that still stands.
    let reference = wire.state.external_ref.clone().expect("a reference");
    assert_eq!(bank_wire(&h, &reference).await["status"], "booked");

    let trail = eventually(
        "the duplicate settlement in the audit chain",
        DEADLINE,
        || async {
            let trail = h.audit(run).await;
            trail
                .of(key)
                .iter()
                .any(|e| e.record.from == Some(Confirmed) && e.record.to == Some(Confirmed))
                .then_some(trail)
        },
    )
    .await;
    let duplicate = trail.find(key, Unknown, Confirmed);
    assert_eq!(duplicate.record.actor, "reconciler");
    assert_eq!(duplicate.record.reason, "status check: duplicate commit");
    assert_eq!(
        duplicate.record.evidence["refs"],
        serde_json::json!(["w-1", "w-2"]),
        "{}",
        duplicate.record.evidence
    );
    let settled = trail.find(key, Confirmed, Confirmed);
    assert_eq!(settled.record.actor, "compensator");
    assert!(
        settled
            .record
            .reason
            .starts_with("extra commit compensated"),
        "{:#?}",
        trail.describe(key)
    );
    let extra = if reference == "w-1" { "w-2" } else { "w-1" };
    assert!(
        settled.record.reason.contains(extra),
        "the record names the reversed wire {extra}: {}",
        settled.record.reason
    );
    assert_eq!(bank_wire(&h, extra).await["status"], "reversed");
    let after = h.agent.get(run, key).await;
    assert_eq!(after.status(), Confirmed);
    assert!(
        !after.state.escalated,
        "cleaned up, nothing for a person: {after:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_check_that_never_answers_ends_stuck_for_a_person() {
    const MAX_CHECKS: u32 = 3;
    let h = Harness::start(
        bank(FaultKind::CommitThen5xx).with_status_inconclusive(1.0),
        |c| short_wires(c).policy("payments/wire", "max_checks", i64::from(MAX_CHECKS)),
    )
    .await;
    let (run, key) = ("r-stuck", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-stuck", 5_000),
        ))
        .await;
    let wire = h.agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), Stuck, "{wire:?}");
    assert!(wire.state.escalated, "escalated to a person");
    assert_eq!(wire.state.checks, MAX_CHECKS);
    assert_eq!(wire.state.attempts, 1, "never retried blindly");
    let stats = h.upstream.stats();
    assert_eq!(
        stats.wires, 1,
        "the one ambiguous booking, no other: {stats:?}"
    );
    assert!(
        stats.faults.status_inconclusive >= u64::from(MAX_CHECKS),
        "{stats:?}"
    );

    // (How many status checks ran exactly is the subject of
    // `one_unknown_command_is_checked_by_one_reconciler_at_a_time` below.)
    let trail = h.audit(run).await;
    let path = trail.path(key);
    assert_eq!(
        path[..3],
        [
            (None, Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Unknown)),
        ],
        "{:#?}",
        trail.describe(key)
    );
    assert_eq!(path.last(), Some(&(Some(Unknown), Some(Stuck))));
    assert!(
        path[3..path.len() - 1] == vec![(Some(Unknown), Some(Unknown)); path.len() - 4]
            && path.len() - 4 >= MAX_CHECKS as usize - 1,
        "looks again, then STUCK: {:#?}",
        trail.describe(key)
    );
    let entered = trail.find(key, Leased, Unknown);
    let stuck = trail.find(key, Unknown, Stuck);
    assert_eq!(stuck.record.actor, "reconciler");
    assert!(
        stuck.record.reason.contains("inconclusive"),
        "{}",
        stuck.record.reason
    );
    // Checks back off, 500 ms then 1000 ms (docs/architecture.md, "Rules in the core": bounds).
    let took = stuck.record.at.millis_since(entered.record.at);
    assert!(
        took >= 1_500,
        "STUCK after {took} ms: the checks did not back off"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_effect_with_a_lost_answer_is_retried_with_the_same_key() {
    let faults = Faults::none().with_rates(
        Family::Email,
        FaultRates::only(FaultKind::CommitThen5xx, 1.0),
    );
    let h = Harness::start(faults, |c| c).await;
    let (run, key) = ("r-email-retry", "d-1/email/send/0");
    h.agent
        .submit_created(&effect(run, 1, "email/send", 0, email_args("receipt")))
        .await;
    eventually(
        "the mail service to fail after sending",
        DEADLINE,
        || async { (h.upstream.stats().faults.commit_then_5xx >= 1).then_some(()) },
    )
    .await;
    h.upstream.set_faults(Faults::none()).expect("valid faults");

    let email = h.agent.wait_settled(run, key).await;
    assert_eq!(email.status(), Confirmed, "{email:?}");
    assert_eq!(email.state.attempts, 2);
    assert_eq!(email.state.external_ref.as_deref(), Some("m-1"));
    let stats = h.upstream.stats();
    assert_eq!(stats.emails, 1, "sent once: {stats:?}");
    assert_eq!(
        stats.email_replays, 1,
        "the retry carried the same Idempotency-Key and was deduplicated: {stats:?}"
    );
    assert_eq!(stats.status_checks, 0, "mail has no status check");
    let trail = h.audit(run).await;
    assert_eq!(
        trail.path(key),
        vec![
            (None, Some(Leased)),
            (Some(Leased), Some(Unknown)),
            (Some(Unknown), Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Confirmed)),
        ],
        "{:#?}",
        trail.describe(key)
    );
    assert_eq!(
        trail.find(key, Unknown, Pending).record.reason,
        "retry with the same idempotency key"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_before_it_was_sent_is_retried_without_reconciliation() {
    init_tracing();
    // An address nothing listens on yet: the first dispatch cannot connect.
    let addr = std::net::TcpListener::bind(ANY_PORT)
        .and_then(|l| l.local_addr())
        .expect("a free loopback port");
    let catalog = example_catalog(&format!("http://{addr}"));
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());
    let pipeline = start_pipeline(&config, catalog).await;
    let agent = Agent::new(&pipeline.url());
    let (run, key) = ("r-not-sent", "d-1/payments/wire/0");
    agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ns", 5_000),
        ))
        .await;
    let refused = agent
        .wait_until(run, key, "PENDING after a refused connection", |c| {
            c.state.attempts == 1 && c.status() == Pending
        })
        .await;
    assert!(
        refused
            .state
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("not sent")),
        "{refused:?}"
    );
    // The bank comes up on that address; the sweep sends the wire again after the backoff.
    let upstream = sluice_upstream::Upstream::start(addr, Faults::none(), 7)
        .await
        .expect("the bank starts on the address the catalog names");
    let wire = agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(wire.state.attempts, 2);
    let stats = upstream.stats();
    assert_eq!((stats.wires, stats.status_checks), (1, 0), "{stats:?}");
    let trail = verified_audit(pipeline.ctx.ledger.as_ref(), run).await;
    assert_eq!(
        trail.path(key),
        vec![
            (None, Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Confirmed)),
        ],
        "not ambiguous, so never UNKNOWN: {:#?}",
        trail.describe(key)
    );
    pipeline.stop().await.expect("the pipeline stops cleanly");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unknown_command_is_checked_by_one_reconciler_at_a_time() {
    const MAX_CHECKS: u32 = 2;
    // A status check that takes 400 ms (it never answers and times out, so it is
    // inconclusive): longer than several sweep intervals.
    let hole = BlackHole::start().await;
    let h = Harness::start(bank(FaultKind::CommitThen5xx), |c| {
        short_wires(c)
            .policy("payments/wire", "max_checks", i64::from(MAX_CHECKS))
            .status_check(
                "payments/wire",
                "url",
                format!("{}/bank/wires/by-key/{{business_key}}", hole.base_url()),
            )
            .status_check("payments/wire", "timeout_ms", 400)
    })
    .await;
    let (run, key) = ("r-one-at-a-time", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-race", 5_000),
        ))
        .await;
    let wire = h.agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), Stuck, "{wire:?}");
    let trail = h.audit(run).await;
    let looks = trail
        .of(key)
        .iter()
        .filter(|e| e.record.from == Some(Unknown) && e.record.to == Some(Unknown))
        .count();
    // Each status check is one connection to the hole (a timed-out connection is not reused).
    assert_eq!(
        (hole.accepted(), wire.state.checks, looks),
        (MAX_CHECKS as usize, MAX_CHECKS, MAX_CHECKS as usize - 1),
        "BUG: two reconcilers resolved the same UNKNOWN command at once — the consumer of the \
         `unknown` message and the sweep, which found it due (due_at = now on entering \
         UNKNOWN) while the first status check was in flight. Both writes were applied, as the \
         guard is only (status, lease epoch): (status checks made, checks stored, 'look again' \
         records) should be ({MAX_CHECKS}, {MAX_CHECKS}, {}) with max_checks = {MAX_CHECKS}. \
         Audit: {:#?}",
        MAX_CHECKS - 1,
        trail.describe(key)
    );
    h.stop().await;
}
