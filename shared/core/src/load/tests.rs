//! Tests of the load decisions: slack, extensions before a write, admission, backoff and the
//! retry budget, with properties over their bounds.

use proptest::prelude::*;

use super::*;
use crate::command::EffectSemantics;

fn leased(expires: i64) -> CommandState {
    let mut state = CommandState::reserved(Timestamp::from_millis(0), None, 10_000);
    state.status = CommandStatus::Leased;
    state.lease.expires_at = Some(Timestamp::from_millis(expires));
    state
}

fn rules() -> Rules {
    Rules::defaults(EffectSemantics::Idempotent)
}

#[test]
fn slack_is_twice_the_write_and_capped() {
    assert_eq!(write_slack_ms(0, 30_000), 0);
    assert_eq!(write_slack_ms(40, 30_000), 80);
    assert_eq!(write_slack_ms(20_000, 30_000), 30_000);
    assert_eq!(
        write_slack_ms(-5, 30_000),
        0,
        "a clock step back measures nothing"
    );
}

#[test]
fn a_lease_is_extended_only_when_the_write_could_outlive_it() {
    let skew = rules().clock_skew_ms;
    let now = Timestamp::from_millis(100_000);
    let roomy = leased(100_000 + 2 * 200 + skew + 1);
    assert_eq!(extend_before_write(&roomy, &rules(), now, 200), None);
    let tight = leased(100_000 + 2 * 200 + skew);
    let to = extend_before_write(&tight, &rules(), now, 200).expect("extended");
    assert!(to.millis_since(now) >= 4 * 200 + 2 * skew);
    let lapsed = leased(99_000);
    let to = extend_before_write(&lapsed, &rules(), now, 0).expect("extended");
    assert!(to.millis_since(now) >= 1_000, "at least a second of room");
    let mut pending = leased(0);
    pending.status = CommandStatus::Pending;
    assert_eq!(extend_before_write(&pending, &rules(), now, 200), None);
}

#[test]
fn admission_refuses_past_either_limit_and_says_when_to_return() {
    let limits = LoadLimits {
        max_write_ms: 500,
        max_backlog: 1_000,
    };
    assert_eq!(admit(500, 1_000, &limits), Admission::Admit);
    match admit(4_000, 0, &limits) {
        Admission::Refuse {
            code,
            retry_after_s,
            ..
        } => assert_eq!((code, retry_after_s), ("ledger_behind", 8)),
        other => panic!("{other:?}"),
    }
    match admit(0, 5_000, &limits) {
        Admission::Refuse {
            code,
            retry_after_s,
            ..
        } => assert_eq!((code, retry_after_s), ("bus_behind", 5)),
        other => panic!("{other:?}"),
    }
    let off = LoadLimits {
        max_write_ms: 0,
        max_backlog: 0,
    };
    assert_eq!(
        admit(1_000_000, 1_000_000, &off),
        Admission::Admit,
        "0 turns a limit off"
    );
}

#[test]
fn the_budget_lets_retries_be_a_share_of_successes() {
    let mut budget = RetryBudget::new(2, 100);
    assert!(budget.try_retry() && budget.try_retry());
    assert!(!budget.try_retry(), "spent");
    for _ in 0..10 {
        budget.succeeded();
    }
    assert!(budget.try_retry(), "ten successes earn one retry");
    assert!(!budget.try_retry());
    for _ in 0..1_000 {
        budget.succeeded();
    }
    assert_eq!(
        budget.left_milli(),
        2_000,
        "never more than the saved maximum"
    );
}

proptest! {
    #[test]
    fn backoff_stays_between_half_and_all_of_the_capped_exponential(
        attempt in 1u32..80,
        base in 1i64..5_000,
        cap in 1i64..120_000,
        jitter in 0.0f64..1.0,
    ) {
        let wait = backoff_ms(attempt, base, cap, jitter);
        let exp = base.saturating_mul(1_i64 << (attempt - 1).min(30)).min(cap);
        prop_assert!(wait >= exp / 2 && wait <= exp, "{wait} outside [{}, {exp}]", exp / 2);
    }

    #[test]
    fn admission_never_refuses_within_the_limits(
        write in 0i64..10_000,
        backlog in 0u64..10_000,
        max_write in 1i64..10_000,
        max_backlog in 1u64..10_000,
    ) {
        let limits = LoadLimits { max_write_ms: max_write, max_backlog };
        let admitted = admit(write, backlog, &limits) == Admission::Admit;
        prop_assert_eq!(admitted, write <= max_write && backlog <= max_backlog);
        if let Admission::Refuse { retry_after_s, .. } = admit(write, backlog, &limits) {
            prop_assert!((1..=30).contains(&retry_after_s));
        }
    }

    #[test]
    fn an_extended_lease_covers_the_write(
        left in -10_000i64..60_000,
        write in 0i64..20_000,
    ) {
        let now = Timestamp::from_millis(1_000_000);
        let state = leased(1_000_000 + left);
        let skew = rules().clock_skew_ms;
        match extend_before_write(&state, &rules(), now, write) {
            None => prop_assert!(left > 2 * write + skew),
            Some(to) => {
                prop_assert!(to.millis_since(now) > 2 * write + skew);
                prop_assert!(to > state.lease.expires_at.expect("leased"));
            }
        }
    }
}
