//! The seed's four methods as typed calls (`relay_core::transport::typed`, what the WIT's
//! `send`, `deliver`, `status` and `sync` return): each answer of the engine reads into its
//! record with every field the protocol names (DeliveryStatus; the timeline entry and page),
//! and a refusal into the protocol's code and error object.

use relay_core::transport::typed::{
    delivery_status, timeline_page, DeliveryState, EntryKind, Failure,
};
use relay_core::wire::canonical;
use relay_core::wire::json::{self, Value};
use relay_core::ErrorCode;
use relay_tests::*;

#[test]
fn a_self_deliverys_status_and_timeline_read_as_records_with_the_signed_objects_as_sent() {
    let mut w = World::new(31);
    let a = w.relay("a");
    let alice = w.account(a, 2, false);
    let m = w.message(&alice, 0, &alice, "note to self", &Msg::default());
    let sent = w.send(&alice, 0, &m).result.unwrap();
    let s = delivery_status(&sent).expect("a DeliveryStatus");
    assert_eq!(s.message_id, message_id(&m));
    assert_eq!(
        (s.from.as_str(), s.to.as_str()),
        (alice.id().as_str(), alice.id().as_str())
    );
    assert_eq!(s.status, DeliveryState::TargetAccepted);
    assert_eq!(
        Some(s.accepted_at),
        field(&sent, "accepted_at").and_then(Value::as_protocol_int)
    );
    assert!(
        s.deadline.is_some(),
        "the source's answer carries its deadline"
    );
    assert!(s.error.is_none());
    let again = w.status(&alice, &message_id(&m)).result.unwrap();
    assert_eq!(
        delivery_status(&again),
        Some(s),
        "status is the same record"
    );

    let page = w.sync(&alice, 1, 0, Some(10)).unwrap();
    let p = timeline_page(&Value::Object(page.clone())).expect("a timeline page");
    assert_eq!((p.entries.len(), p.has_more), (1, false));
    assert_eq!(
        Some(p.next),
        page.get("next").and_then(Value::as_protocol_int)
    );
    let e = &p.entries[0];
    assert_eq!((e.seq, e.kind), (1, EntryKind::SelfDelivery));
    // The signed objects cross as the canonical text a client verifies.
    let envelope = m.get("envelope").unwrap();
    assert_eq!(
        e.envelope.as_bytes(),
        canonical::to_vec(envelope).as_slice()
    );
    let key_box = json::parse(e.key_box.as_bytes()).unwrap();
    assert_eq!(
        field(&key_box, "device_id").and_then(Value::as_str),
        Some(alice.devices[1].id().as_str()),
        "only the calling device's own key box"
    );
    assert!(json::parse(e.device_certificate.as_bytes()).is_ok());
}

#[test]
fn a_cross_account_delivery_reads_as_delivering_then_target_accepted_with_its_time() {
    let mut w = World::new(32);
    let (a, b) = (w.relay("a"), w.relay("b"));
    let alice = w.account(a, 1, true);
    let bob = w.account(b, 1, true);
    w.publish_route(a, &bob);
    let m = w.message(&alice, 0, &bob, "hello", &Msg::default());
    let first = delivery_status(&w.send(&alice, 0, &m).result.unwrap()).unwrap();
    assert_eq!(first.status, DeliveryState::Delivering);
    assert_eq!(first.target_accepted_at, None);
    w.pump();
    let done = delivery_status(&w.status(&alice, &message_id(&m)).result.unwrap()).unwrap();
    assert_eq!(done.status, DeliveryState::TargetAccepted);
    assert!(
        done.target_accepted_at.is_some(),
        "the destination's accepted_at"
    );
    assert_eq!(done.deadline, first.deadline);
}

#[test]
fn a_refusal_reads_as_its_code_status_and_error_object() {
    let mut w = World::new(33);
    let a = w.relay("a");
    let alice = w.account(a, 1, false);
    let m = w.message(&alice, 0, &alice, "one", &Msg::default());
    assert!(w.send(&alice, 0, &m).result.is_ok());
    let other = Msg {
        message_id: Some(message_id(&m)),
        ..Msg::default()
    };
    let m2 = w.message(&alice, 0, &alice, "two", &other);
    let e = w.send(&alice, 0, &m2).result.unwrap_err();
    let f = Failure::from(&e);
    assert_eq!((f.code, f.status), (ErrorCode::StateConflict, 409));
    assert_eq!(f.error.code, "state_conflict");
    assert_eq!(f.error.message, e.message);
    assert_eq!(f.error.data, None);
}

#[test]
fn a_failed_status_keeps_the_destinations_error_as_it_came() {
    // A destination's rejection is copied as it came (seed): a code this relay does not know
    // stays a string, and its data stays canonical JSON.
    let v = json::parse(
        br#"{"message_id":"m","from":"a","to":"b","status":"failed","accepted_at":1,"deadline":2,
            "error":{"code":"some_future_code","message":"no","data":{"z":1,"a":[true]}}}"#,
    )
    .unwrap();
    let s = delivery_status(&v).unwrap();
    assert_eq!(s.status, DeliveryState::Failed);
    let e = s.error.unwrap();
    assert_eq!(e.code, "some_future_code");
    assert_eq!(e.data.as_deref(), Some(r#"{"a":[true],"z":1}"#));
    // Not in the documented shape: no record (the typed call answers internal instead).
    let bad = json::parse(br#"{"message_id":"m","status":"lost"}"#).unwrap();
    assert_eq!(delivery_status(&bad), None);
}
