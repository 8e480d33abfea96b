use relay_tests::*;

#[test]
fn smoke_cross_relay() {
    let mut w = World::new(1);
    let a = w.relay("a");
    let b = w.relay("b");
    let alice = w.account(a, 1, false);
    let bob = w.account(b, 2, true);
    // Source must know bob's route: publish it at a.
    let route =
        relay_core::client::draft::route(NET, &bob.key.id(), "http://b.test", 1, w.clock(b))
            .sign(&bob.key);
    let mut p = relay_core::wire::json::Object::new();
    p.insert("route", route);
    w.call(
        a,
        &relay_core::engine::Caller::Anonymous,
        "route.publish",
        &p,
    )
    .result
    .unwrap();
    let m = w.message(
        &alice,
        0,
        &bob,
        "hi",
        &Msg {
            sender_boxes: true,
            ..Msg::default()
        },
    );
    let r = w.send(&alice, 0, &m);
    let v = r.result.clone().unwrap();
    println!("{}", relay_core::wire::canonical::to_string(&v));
    assert_eq!(status_of(&v), "delivering");
    w.pump();
    let st = w.status(&alice, &message_id(&m)).result.unwrap();
    println!("{}", relay_core::wire::canonical::to_string(&st));
    assert_eq!(status_of(&st), "target_accepted");
    let entries = w.sync_all(&bob, 1);
    assert_eq!(entries.len(), 1);
    assert_eq!(entry_text(&entries[0]), "hi");
    let sent = w.sync_all(&alice, 0);
    assert_eq!(sent.len(), 1);
}
