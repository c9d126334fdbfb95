//! The upstream acts out each fault over real HTTP, and its record says what really happened
//! — above all that a late commit lands after the client gave up and hung up.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use super::record::{EndpointSpec, KeyHandling};
use super::*;

const TIMEOUT_MS: u64 = 150;

fn spec(name: &str, keys: KeyHandling) -> EndpointSpec {
    EndpointSpec {
        name: name.into(),
        keys,
        read_only: false,
        double_commits: true,
        timeout_ms: TIMEOUT_MS,
        reverse_timeout_ms: TIMEOUT_MS,
        slow_lookup_ms: 3 * TIMEOUT_MS,
    }
}

fn times() -> FaultTimes {
    FaultTimes {
        hold_past_timeout_ms: 100,
        late_commit_ms: (100, 200),
        lag_ms: (400, 500),
    }
}

async fn upstream(rates: FaultRates) -> ChaosUpstream {
    ChaosUpstream::start(
        vec![
            spec("bank", KeyHandling::Commit),
            spec("tickets", KeyHandling::Deduplicate),
        ],
        rates,
        times(),
        9,
    )
    .await
    .expect("the upstream starts")
}

fn only(fault: DispatchFault) -> FaultRates {
    FaultRates {
        dispatch: BTreeMap::from([(fault, 1.0)]),
        ..FaultRates::calm()
    }
}

/// A client that gives up after the endpoint's timeout, as Sluice's connector does.
fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_millis(TIMEOUT_MS))
        .build()
        .expect("a client")
}

async fn dispatch(
    up: &ChaosUpstream,
    endpoint: &str,
    key: &str,
) -> Result<(StatusCode, Value), reqwest::Error> {
    let response = client()
        .post(format!("{}/e/{endpoint}", up.base_url()))
        .header("idempotency-key", key)
        .header("x-sluice-business-key", format!("b-{key}"))
        .json(&json!({"ref": key, "amount_minor": 1}))
        .send()
        .await?;
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, body))
}

async fn get(up: &ChaosUpstream, path: &str) -> StatusCode {
    Client::new()
        .get(format!("{}{path}", up.base_url()))
        .send()
        .await
        .expect("lookups are answered")
        .status()
}

#[tokio::test]
async fn a_late_commit_lands_after_the_client_hung_up() {
    let up = upstream(only(DispatchFault::LateCommit)).await;
    let error = dispatch(&up, "bank", "k1")
        .await
        .expect_err("the client times out");
    assert!(error.is_timeout(), "{error}");
    assert!(
        up.record().commits.is_empty(),
        "nothing committed by the timeout"
    );
    assert_eq!(up.key_view("k1").running, 1, "the work goes on");
    tokio::time::sleep(Duration::from_millis(TIMEOUT_MS + 300)).await;
    let record = up.record();
    assert_eq!(record.commits.len(), 1, "{record:?}");
    let commit = &record.commits[0];
    let request = &record.dispatches[0];
    assert_eq!(commit.how, DispatchFault::LateCommit);
    assert!(
        commit.committed_at >= request.arrived_at + i64::try_from(TIMEOUT_MS + 100).expect("small"),
        "committed {} ms after arrival",
        commit.committed_at - request.arrived_at
    );
    assert_eq!(up.running(), 0);
}

#[tokio::test]
async fn a_dropped_answer_and_a_5xx_still_commit() {
    let up = upstream(only(DispatchFault::CommitThenDrop)).await;
    let error = dispatch(&up, "bank", "k1").await.expect_err("no answer");
    assert!(
        !error.is_timeout(),
        "the connection was closed, not held: {error}"
    );
    assert_eq!(up.record().commits.len(), 1);
    let up = upstream(only(DispatchFault::CommitThen5xx)).await;
    let (status, _) = dispatch(&up, "bank", "k1").await.expect("an answer");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(up.record().commits.len(), 1);
    let up = upstream(only(DispatchFault::TimeoutNoCommit)).await;
    dispatch(&up, "bank", "k1")
        .await
        .expect_err("held past the timeout");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(up.record().commits.is_empty());
}

#[tokio::test]
async fn a_double_commit_hides_behind_one_2xx_and_lookups_list_both() {
    let up = upstream(only(DispatchFault::DoubleCommit)).await;
    let (status, body) = dispatch(&up, "bank", "k1").await.expect("an answer");
    assert_eq!(status, StatusCode::CREATED);
    let record = up.record();
    assert_eq!(record.commits.len(), 2);
    assert!(record.commits.iter().any(|c| body["id"] == c.id.as_str()));
    assert_eq!(get(&up, "/e/bank/by-key/b-k1").await, StatusCode::CONFLICT);
    assert_eq!(get(&up, "/e/bank/by-idem/k1").await, StatusCode::CONFLICT);
    assert_eq!(
        get(&up, "/e/bank/by-idem/other").await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn an_honest_endpoint_commits_a_key_once_and_says_when_it_is_in_progress() {
    let up = upstream(FaultRates::calm()).await;
    let (first, a) = dispatch(&up, "tickets", "k1").await.expect("an answer");
    let (again, b) = dispatch(&up, "tickets", "k1").await.expect("an answer");
    assert_eq!((first, again), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(a["id"], b["id"]);
    assert_eq!(up.record().commits.len(), 1);
    // The key-ignoring bank commits every request.
    dispatch(&up, "bank", "k1").await.expect("an answer");
    dispatch(&up, "bank", "k1").await.expect("an answer");
    assert_eq!(up.record().commits.len(), 3);

    let up = upstream(only(DispatchFault::LateCommit)).await;
    dispatch(&up, "tickets", "k2").await.expect_err("times out");
    // The first request's commit is still to land: the next one is told so.
    let (status, _) = dispatch(&up, "tickets", "k2").await.expect("an answer");
    assert_eq!(status, StatusCode::CONFLICT);
    tokio::time::sleep(Duration::from_millis(TIMEOUT_MS + 300)).await;
    assert_eq!(up.record().commits.len(), 1);
}

#[tokio::test]
async fn lagging_lookups_and_inconclusive_checks() {
    let rates = FaultRates {
        lagging_lookup: 1.0,
        ..FaultRates::calm()
    };
    let up = upstream(rates).await;
    dispatch(&up, "bank", "k1").await.expect("an answer");
    assert_eq!(
        get(&up, "/e/bank/by-idem/k1").await,
        StatusCode::NOT_FOUND,
        "not visible yet"
    );
    tokio::time::sleep(Duration::from_millis(520)).await;
    assert_eq!(get(&up, "/e/bank/by-idem/k1").await, StatusCode::OK);
    assert_eq!(up.record().counters.lagged_misses, 1);

    let up = upstream(FaultRates {
        inconclusive_check: 1.0,
        ..FaultRates::calm()
    })
    .await;
    assert_eq!(
        get(&up, "/e/bank/by-idem/k1").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    up.calm();
    assert_eq!(get(&up, "/e/bank/by-idem/k1").await, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn reversals_undo_once_and_record_what_they_found() {
    let up = upstream(FaultRates::calm()).await;
    let (_, body) = dispatch(&up, "bank", "k1").await.expect("an answer");
    let id = body["id"].as_str().expect("an id").to_owned();
    let reverse = |key: &'static str, target: String| {
        let url = format!("{}/e/bank/{target}/reverse", up.base_url());
        async move {
            Client::new()
                .post(url)
                .header("idempotency-key", key)
                .header("x-sluice-dispatch-idempotency-key", "k1")
                .json(&json!({}))
                .send()
                .await
                .expect("an answer")
                .status()
        }
    };
    assert_eq!(reverse("k1/compensate", id.clone()).await, StatusCode::OK);
    assert_eq!(
        reverse("k1/compensate", id.clone()).await,
        StatusCode::OK,
        "a retry is answered as before"
    );
    assert_eq!(
        reverse("k1/compensate/x", id.clone()).await,
        StatusCode::CONFLICT
    );
    assert_eq!(
        reverse("k1/compensate", "bank-999".into()).await,
        StatusCode::NOT_FOUND
    );
    let record = up.record();
    assert!(!record.commits[0].live());
    let outcomes: Vec<_> = record.reversals.iter().map(|r| r.outcome).collect();
    use super::record::ReverseOutcome as R;
    assert_eq!(
        outcomes,
        [
            R::Reversed,
            R::Replayed,
            R::AlreadyReversed,
            R::UnknownCommit
        ]
    );
}

#[tokio::test]
async fn a_slow_lookup_key_outlasts_its_client_even_once_calm() {
    let up = upstream(FaultRates {
        slow_lookup: 1.0,
        ..FaultRates::calm()
    })
    .await;
    let (_, body) = dispatch(&up, "bank", "k1").await.expect("an answer");
    assert!(body["id"].is_string(), "dispatches are not slowed: {body}");
    let check = |path: &'static str| {
        let url = format!("{}{path}", up.base_url());
        async move { client().get(url).send().await }
    };
    let error = check("/e/bank/by-idem/k1")
        .await
        .expect_err("the check times out");
    assert!(error.is_timeout(), "{error}");
    up.calm();
    let error = check("/e/bank/by-key/b-k1")
        .await
        .expect_err("a slow key stays slow when the faults stop");
    assert!(error.is_timeout(), "{error}");
    let record = up.record();
    assert_eq!(record.counters.slow_lookups, 2);
    let keys: Vec<&str> = record.slow_lookups.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["k1", "b-k1"]);
    assert_eq!(record.counters.status_checks, 0, "no answer was read");
    // The effect's `ref` is in the record of its dispatch.
    assert_eq!(record.dispatches[0].meta.effect_ref.as_deref(), Some("k1"));
}
