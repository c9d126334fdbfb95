//! Roles end to end (docs/architecture.md, "HTTP API"): every route of the API called by every kind
//! of caller — no token, an unknown token, the agent that owns the run, another agent, an operator,
//! an admin — with the exact answer each must get. 401 without a (valid) token, 403 for the wrong
//! role or another agent's run, and for the allowed callers the route's own answer.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::tokens::{ADMIN, AGENT_A, AGENT_B, OPERATOR};
use sluice_tests::*;
use sluice_upstream::Faults;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    Stranger,
    Owner,
    OtherAgent,
    Operator,
    Admin,
}

const EVERYONE: [Who; 6] = [
    Who::Nobody,
    Who::Stranger,
    Who::Owner,
    Who::OtherAgent,
    Who::Operator,
    Who::Admin,
];

/// One route and the answer each caller must get.
struct Case {
    method: &'static str,
    path: String,
    body: Option<Value>,
    expect: fn(Who) -> u16,
}

/// 401 for a missing or unknown token; otherwise `rest`.
fn authenticated(who: Who, rest: impl Fn(Who) -> u16) -> u16 {
    match who {
        Who::Nobody | Who::Stranger => 401,
        other => rest(other),
    }
}

fn read_run(who: Who) -> u16 {
    authenticated(who, |w| if w == Who::OtherAgent { 403 } else { 200 })
}

fn read_all(who: Who) -> u16 {
    authenticated(who, |w| match w {
        Who::Owner | Who::OtherAgent => 403,
        _ => 200,
    })
}

/// Admin only; `admin` is what the admin gets.
fn admin_only(who: Who, admin: u16) -> u16 {
    authenticated(who, |w| if w == Who::Admin { admin } else { 403 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_role_as_it_should() {
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let clients = |who: Who| match who {
        Who::Nobody => h.agent.clone(),
        Who::Stranger => h.agent.with_token("not-a-known-token-at-all"),
        Who::Owner => h.agent.with_token(AGENT_A),
        Who::OtherAgent => h.agent.with_token(AGENT_B),
        Who::Operator => h.agent.with_token(OPERATOR),
        Who::Admin => h.agent.with_token(ADMIN),
    };
    // agent-a's run, settled: the admin's actions on a CONFIRMED command are refused (409), so
    // the matrix changes nothing it depends on.
    let run = "r-matrix";
    let key = "d-1/email/send/0";
    let owner = clients(Who::Owner);
    owner
        .submit_created(&effect(run, 1, "email/send", 0, email_args("matrix")))
        .await;
    assert_eq!(
        owner.wait_settled(run, key).await.status().as_str(),
        "CONFIRMED"
    );
    let k = encode_key(key);
    let action = |name: &str, body: Value| Case {
        method: "POST",
        path: format!("/v1/runs/{run}/effects/{k}:{name}"),
        body: Some(body),
        expect: |who| admin_only(who, 409),
    };

    let cases = vec![
        Case {
            method: "GET",
            path: "/v1/whoami".into(),
            body: None,
            expect: |w| authenticated(w, |_| 200),
        },
        Case {
            method: "POST",
            path: "/v1/effects".into(),
            body: Some(effect(
                "r-matrix-submit",
                1,
                "email/send",
                0,
                email_args("s"),
            )),
            // agent-a creates it, agent-b may not add to agent-a's run, the admin gets the
            // existing command back.
            expect: |w| {
                authenticated(w, |w| match w {
                    Who::Owner => 201,
                    Who::OtherAgent | Who::Operator => 403,
                    _ => 200,
                })
            },
        },
        Case {
            method: "POST",
            path: "/v1/effects/batch".into(),
            body: Some(json!({"effects": []})),
            expect: |w| authenticated(w, |w| if w == Who::Operator { 403 } else { 200 }),
        },
        Case {
            method: "GET",
            path: "/v1/effects?status=CONFIRMED".into(),
            body: None,
            // An agent gets its own effects only (checked in tests/tests/console.rs).
            expect: |w| authenticated(w, |_| 200),
        },
        Case {
            method: "GET",
            path: "/v1/runs".into(),
            body: None,
            expect: read_all,
        },
        Case {
            method: "GET",
            path: format!("/v1/runs/{run}/effects"),
            body: None,
            expect: read_run,
        },
        Case {
            method: "GET",
            path: format!("/v1/runs/{run}/scheduled"),
            body: None,
            expect: read_run,
        },
        Case {
            method: "GET",
            path: format!("/v1/runs/{run}/effects/{k}"),
            body: None,
            expect: read_run,
        },
        Case {
            method: "DELETE",
            path: format!("/v1/runs/{run}/effects/{k}"),
            body: None,
            expect: |w| {
                authenticated(w, |w| match w {
                    Who::Owner | Who::Admin => 409,
                    _ => 403,
                })
            },
        },
        action("approve", json!({"reason": "r"})),
        action("reject", json!({"reason": "r"})),
        action("cancel", json!({"reason": "r"})),
        action("replay", json!({"reason": "r"})),
        action(
            "resolve",
            json!({"outcome": "FAILED", "evidence": "e", "reason": "r"}),
        ),
        Case {
            method: "POST",
            path: "/v1/runs/r-matrix-nobody/rollback".into(),
            body: Some(json!({"reason": "r"})),
            // An agent may roll back its own runs; a run with no commands is nobody's.
            expect: |w| authenticated(w, |w| if w == Who::Operator { 403 } else { 404 }),
        },
        Case {
            method: "GET",
            path: format!("/v1/runs/{run}/rollback"),
            body: None,
            expect: read_run,
        },
        Case {
            method: "GET",
            path: format!("/v1/runs/{run}/audit"),
            body: None,
            expect: read_run,
        },
        Case {
            method: "GET",
            path: format!("/v1/runs/{run}/audit/verify"),
            body: None,
            expect: read_run,
        },
        Case {
            method: "POST",
            path: "/v1/audit/purge".into(),
            body: Some(json!({"older_than": "2000-01-01T00:00:00Z", "reason": "matrix"})),
            expect: |w| admin_only(w, 200),
        },
        Case {
            method: "GET",
            path: "/v1/tools".into(),
            body: None,
            expect: |w| authenticated(w, |_| 200),
        },
        Case {
            method: "GET",
            path: "/v1/tools/payments/wire".into(),
            body: None,
            expect: |w| authenticated(w, |_| 200),
        },
        Case {
            method: "GET",
            path: "/healthz".into(),
            body: None,
            expect: |_| 200,
        },
        Case {
            method: "GET",
            path: "/readyz".into(),
            body: None,
            expect: |_| 200,
        },
        Case {
            method: "GET",
            path: "/metrics".into(),
            body: None,
            expect: |_| 200,
        },
    ];

    let mut wrong = Vec::new();
    let mut cells = 0;
    for case in &cases {
        for who in EVERYONE {
            let answer = clients(who)
                .call(case.method, &case.path, case.body.as_ref())
                .await;
            let expected = (case.expect)(who);
            cells += 1;
            if answer.status.as_u16() != expected {
                wrong.push(format!(
                    "{} {} as {who:?}: expected {expected}, got {}: {}",
                    case.method, case.path, answer.status, answer.text
                ));
            }
            if answer.status == StatusCode::UNAUTHORIZED {
                assert_eq!(answer.error_code(), "unauthenticated", "{}", answer.text);
            }
            if answer.status == StatusCode::FORBIDDEN {
                assert_eq!(answer.error_code(), "forbidden", "{}", answer.text);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {cells} answers were wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(cells, cases.len() * EVERYONE.len());

    // The matrix changed nothing it should not have.
    let command = owner.get(run, key).await;
    assert_eq!(command.status().as_str(), "CONFIRMED");
    assert_eq!(command.submitted_by.as_deref(), Some("agent-a"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_asks_for_a_bearer_token_and_never_echoes_one() {
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let guess = "almost-the-admin-token-0123";
    let answer = h
        .agent
        .with_token(guess)
        .call("GET", "/v1/runs", None)
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(!answer.text.contains(guess), "{}", answer.text);
    let raw = reqwest::Client::new()
        .get(format!("{}/v1/runs", h.agent.base()))
        .send()
        .await
        .expect("an answer");
    assert_eq!(
        raw.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    // A token in another scheme is not a bearer token.
    let basic = reqwest::Client::new()
        .get(format!("{}/v1/runs", h.agent.base()))
        .header("authorization", format!("Basic {ADMIN}"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
    h.stop().await;
}

/// A run holding another submitter's command refuses an agent, with nothing written, and
/// still takes its owner's. Here agent-b's command is written straight into the ledger, as an
/// unconfined writer (an operator, an open API) could; the check is the ledger's, inside the
/// reservation's write, so the producer cannot skip it for a run it has not seen the agent in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_holding_another_submitters_command_refuses_an_agent() {
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let run = "r-theirs";
    let theirs = sluice_ledger::contract::command(
        &sluice_core::ids::RunId::parse(run).expect("valid"),
        2,
        "email/send",
        0,
        email_args("theirs"),
    )
    .submitted_by("agent-b");
    let audit = theirs.reservation_audit("producer");
    h.ctx()
        .ledger
        .reserve(theirs, audit)
        .await
        .expect("reserve");

    let a = h.agent.with_token(AGENT_A);
    let answer = a
        .submit(&effect(run, 3, "email/send", 0, email_args("mine")))
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.text);
    assert!(answer.text.contains("agent-b"), "{}", answer.text);
    let listed = h
        .ctx()
        .ledger
        .list_run(&sluice_core::ids::RunId::parse(run).expect("valid"), None)
        .await
        .expect("list");
    assert_eq!(listed.len(), 1, "nothing of agent-a's was written");

    let b = h.agent.with_token(AGENT_B);
    b.submit_created(&effect(run, 4, "email/send", 0, email_args("more")))
        .await;
    h.stop().await;
}

/// Two agents opening the same new run at the same instant, forty times over through one
/// producer: each time exactly one gets in, and the other is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_opening_one_new_run_at_once_never_both_get_in() {
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let (a, b) = (h.agent.with_token(AGENT_A), h.agent.with_token(AGENT_B));
    for i in 0..40 {
        let run = format!("r-open-race-{i}");
        let (mine, theirs) = (
            effect(&run, 1, "email/send", 0, email_args("a")),
            effect(&run, 2, "email/send", 0, email_args("b")),
        );
        let (first, second) = tokio::join!(a.submit(&mine), b.submit(&theirs));
        let mut statuses = [first.status, second.status];
        statuses.sort();
        assert_eq!(
            statuses,
            [StatusCode::CREATED, StatusCode::FORBIDDEN],
            "{run}: {} / {}",
            first.text,
            second.text
        );
    }
    h.stop().await;
}

/// A submission answered with the command already holding its business key in another run
/// writes nothing in its own run, so that run is not taken as the agent's: another agent may
/// open it, and the first agent is then refused there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_business_key_held_elsewhere_does_not_make_a_run_the_agents() {
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let (a, b) = (h.agent.with_token(AGENT_A), h.agent.with_token(AGENT_B));
    a.submit_created(&effect(
        "r-key-first",
        1,
        "payments/wire",
        0,
        wire_args("acc-9", 500),
    ))
    .await;
    let held = a
        .submit(&effect(
            "r-key-elsewhere",
            1,
            "payments/wire",
            0,
            wire_args("acc-9", 500),
        ))
        .await;
    assert_eq!(held.status, StatusCode::OK, "{}", held.text);
    assert_eq!(held.command().run_id.as_str(), "r-key-first");

    b.submit_created(&effect(
        "r-key-elsewhere",
        2,
        "email/send",
        0,
        email_args("b's"),
    ))
    .await;
    let refused = a
        .submit(&effect(
            "r-key-elsewhere",
            3,
            "email/send",
            0,
            email_args("a's"),
        ))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);
    h.stop().await;
}

/// An agent undoes its own failed run (Fuze's "the run failed, undo its side effects"): another
/// agent and an operator are refused and change nothing; the owner's rollback compensates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_rolls_back_its_own_run_and_no_one_elses() {
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let owner = h.agent.with_token(AGENT_A);
    let run = "r-own-rollback";
    let key = "d-1/tickets/create/0";
    owner
        .submit_created(&effect(run, 1, "tickets/create", 0, ticket_args("undo me")))
        .await;
    assert_eq!(
        owner.wait_settled(run, key).await.status().as_str(),
        "CONFIRMED"
    );

    for (who, token) in [("another agent", AGENT_B), ("an operator", OPERATOR)] {
        let refused = h.agent.with_token(token).rollback(run, "not mine").await;
        assert_eq!(
            refused.status,
            StatusCode::FORBIDDEN,
            "{who}: {}",
            refused.text
        );
        assert_eq!(refused.error_code(), "forbidden", "{}", refused.text);
    }
    assert_eq!(owner.get(run, key).await.status().as_str(), "CONFIRMED");

    let accepted = owner.rollback(run, "the run failed").await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
    let undone = owner
        .wait_until(run, key, "compensated", |c| {
            c.status().as_str() == "COMPENSATED"
        })
        .await;
    assert_eq!(undone.status().as_str(), "COMPENSATED");
    let trail = h.audit(run).await;
    let rollback = trail
        .entries
        .iter()
        .find(|e| e.record.command_key.is_none())
        .expect("a run-level rollback record");
    assert_eq!(rollback.record.actor, "agent-a", "audited as the agent's");
    assert_eq!(
        h.upstream.stats().tickets_closed,
        1,
        "the ticket was closed"
    );
    h.stop().await;
}
