//! The signature schemes against vectors computed elsewhere (the Standard Webhooks
//! specification's own example; Python's `hmac` for Stripe's and the plain scheme), and what
//! an event is read to say.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn source(scheme: Scheme) -> EvidenceSource {
    EvidenceSource {
        name: "pay".into(),
        scheme,
        secret: SecretRef::Env("UNUSED".into()),
        tolerance_s: 300,
        event_id_pointer: None,
    }
}

fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn at_s(seconds: i64) -> Timestamp {
    Timestamp::from_millis(seconds * 1_000)
}

#[test]
fn standard_webhooks_verifies_the_specifications_example_and_nothing_altered() {
    let source = source(Scheme::StandardWebhooks);
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = br#"{"test": 2432232314}"#;
    let good = headers(&[
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("webhook-timestamp", "1614265330"),
        (
            "webhook-signature",
            "v1,bm9wZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ]);
    let now = at_s(1_614_265_330 + 10);
    let signed = Signed {
        headers: &good,
        body,
    };
    assert_eq!(
        verify(&source, secret, &signed, now),
        Ok(Some("msg_p5jXN8AQM9LWM0D4loKWxJek".to_owned()))
    );
    let tampered = Signed {
        headers: &good,
        body: br#"{"test": 2432232315}"#,
    };
    assert_eq!(
        verify(&source, secret, &tampered, now),
        Err(SignatureError::Mismatch)
    );
    let other_key = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    assert_eq!(
        verify(&source, other_key, &signed, now),
        Err(SignatureError::Mismatch)
    );
    assert!(matches!(
        verify(&source, secret, &signed, at_s(1_614_265_330 + 301)),
        Err(SignatureError::OutsideTolerance { skew_s: 301, .. })
    ));
    let unsigned = headers(&[("webhook-id", "x"), ("webhook-timestamp", "1614265330")]);
    assert_eq!(
        verify(
            &source,
            secret,
            &Signed {
                headers: &unsigned,
                body
            },
            now
        ),
        Err(SignatureError::Missing("webhook-signature"))
    );
}

#[test]
fn stripe_signature_is_the_hex_hmac_of_timestamp_dot_body_within_the_tolerance() {
    let source = source(Scheme::Stripe);
    let secret = "whsec_test_secret";
    let body = br#"{"id":"evt_1"}"#;
    // hmac.new(b"whsec_test_secret", b'1700000000.{"id":"evt_1"}', sha256).hexdigest()
    let v1 = "248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a";
    let good = headers(&[("stripe-signature", &format!("t=1700000000,v1=00ff,v1={v1}"))]);
    let signed = Signed {
        headers: &good,
        body,
    };
    assert_eq!(
        verify(&source, secret, &signed, at_s(1_700_000_100)),
        Ok(None)
    );
    assert!(matches!(
        verify(&source, secret, &signed, at_s(1_699_999_000)),
        Err(SignatureError::OutsideTolerance { .. })
    ));
    assert_eq!(
        verify(&source, "whsec_other", &signed, at_s(1_700_000_100)),
        Err(SignatureError::Mismatch)
    );
    // The timestamp is signed: moving it breaks the signature.
    let moved = headers(&[("stripe-signature", &format!("t=1700000001,v1={v1}"))]);
    assert_eq!(
        verify(
            &source,
            secret,
            &Signed {
                headers: &moved,
                body
            },
            at_s(1_700_000_100)
        ),
        Err(SignatureError::Mismatch)
    );
    let no_t = headers(&[("stripe-signature", &format!("v1={v1}"))]);
    assert!(matches!(
        verify(
            &source,
            secret,
            &Signed {
                headers: &no_t,
                body
            },
            at_s(1_700_000_100)
        ),
        Err(SignatureError::Malformed { .. })
    ));
    let event = json!({"id": "evt_1"});
    assert_eq!(
        event_id(&source, None, &event, body).as_deref(),
        Some("evt_1")
    );
}

#[test]
fn hmac_reads_its_named_header_in_hex_or_with_a_sha256_prefix() {
    let source = source(Scheme::Hmac {
        header: "X-Signature".into(),
        encoding: Encoding::Hex,
    });
    let body = br#"{"id":"e1"}"#;
    let digest = "b50facbba3f0a244ddddbe1596f555540201d8086ef828ff458202cf1ea37b66";
    for value in [digest.to_owned(), format!("sha256={digest}")] {
        let h = headers(&[("x-signature", &value)]);
        let signed = Signed { headers: &h, body };
        assert_eq!(verify(&source, "topsecret", &signed, at_s(0)), Ok(None));
        assert_eq!(
            verify(&source, "other", &signed, at_s(0)),
            Err(SignatureError::Mismatch)
        );
    }
    // No timestamp: the same body is the same event, by its digest.
    let a = event_id(&source, None, &json!({"id": "e1"}), body);
    assert_eq!(a, event_id(&source, None, &json!({"id": "e1"}), body));
    assert!(a.is_some_and(|id| id.starts_with("sha256:")));
}

fn stripe_charge() -> ToolEvidence {
    ToolEvidence {
        source: "stripe".into(),
        key_pointer: Some("/data/object/metadata/sluice_key".into()),
        reference_pointer: Some("/data/object/id".into()),
        outcome_pointer: "/type".into(),
        present: vec!["charge.succeeded".into()],
        absent: vec![],
        failed: vec!["charge.failed".into()],
    }
}

#[test]
fn an_event_is_read_for_its_key_outcome_and_reference() {
    let declared = stripe_charge();
    let event = |kind: &str| {
        json!({"id": "evt_1", "type": kind, "data": {"object": {
            "id": "ch_1", "metadata": {"sluice_key": "r-1/d-0/payments/charge/0"}}}})
    };
    let read = declared.read(&event("charge.succeeded")).expect("a key");
    assert_eq!(read.key.as_deref(), Some("r-1/d-0/payments/charge/0"));
    assert_eq!(read.outcome, Some(EvidenceOutcome::Present));
    assert_eq!(read.external_ref.as_deref(), Some("ch_1"));
    assert_eq!(
        declared.read(&event("charge.failed")).map(|r| r.outcome),
        Some(Some(EvidenceOutcome::Failed))
    );
    // An outcome the tool does not list says nothing to apply.
    assert_eq!(
        declared.read(&event("charge.updated")).map(|r| r.outcome),
        Some(None)
    );
    // Neither a key nor a reference where the tool looks: not this tool's event.
    assert_eq!(declared.read(&json!({"type": "charge.succeeded"})), None);
}

#[test]
fn an_event_without_a_key_is_read_for_its_reference() {
    // Stripe's `payout.paid`: the payout's id, no metadata of ours.
    let declared = ToolEvidence {
        source: "stripe".into(),
        key_pointer: None,
        reference_pointer: Some("/data/object/id".into()),
        outcome_pointer: "/type".into(),
        present: vec!["payout.paid".into()],
        absent: vec![],
        failed: vec!["payout.failed".into()],
    };
    assert!(declared.by_reference());
    let read = declared
        .read(&json!({"id": "evt_1", "type": "payout.paid", "data": {"object": {"id": "po_1"}}}))
        .expect("a reference");
    assert_eq!(read.key, None);
    assert_eq!(read.external_ref.as_deref(), Some("po_1"));
    assert_eq!(read.outcome, Some(EvidenceOutcome::Present));
    // An empty reference is none.
    assert_eq!(
        declared.read(&json!({"type": "payout.paid", "data": {"object": {"id": ""}}})),
        None
    );
    // A tool that declares both reads the key when the event carries one, and the reference
    // beside it; without the key, the reference alone.
    let both = stripe_charge();
    let keyless = both
        .read(&json!({"type": "charge.succeeded", "data": {"object": {"id": "ch_2"}}}))
        .expect("a reference");
    assert_eq!(keyless.key, None);
    assert_eq!(keyless.external_ref.as_deref(), Some("ch_2"));
    // A tool matched by key only never uses the index.
    let by_key = ToolEvidence {
        reference_pointer: None,
        ..stripe_charge()
    };
    assert!(!by_key.by_reference());
    assert_eq!(
        by_key.read(&json!({"type": "charge.succeeded", "data": {"object": {"id": "ch_2"}}})),
        None
    );
}

#[test]
fn a_large_event_is_kept_as_its_size_and_digest() {
    let small = json!({"a": 1});
    assert_eq!(kept(&small, b"{\"a\":1}"), small);
    let body = vec![b' '; MAX_KEPT_BYTES + 1];
    let marker = kept(&small, &body);
    assert_eq!(marker["truncated"], json!(true));
    assert_eq!(marker["bytes"], json!(MAX_KEPT_BYTES + 1));
}

#[test]
fn a_repeat_finds_its_first_copy_in_progress_only_within_the_window() {
    let first = Timestamp::from_millis(1_000_000);
    assert!(still_in_progress(first, first));
    assert!(still_in_progress(
        first,
        first.plus_millis(IN_PROGRESS_MS - 1)
    ));
    assert!(!still_in_progress(first, first.plus_millis(IN_PROGRESS_MS)));
    assert!(
        still_in_progress(first, first.plus_millis(-5)),
        "a repeat stamped before the first by another clock"
    );
}
