//! Protocol objects (protocol.md §2-3): parsing, unknown members, signatures, binding and validity checks.

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use relay_core::client::draft::{self, Draft};
use relay_core::client::seal;
use relay_core::client::{random_id, AccountKey, DeviceKey};
use relay_core::wire::authorization::{Authorization, AuthorizationError};
use relay_core::wire::canonical;
use relay_core::wire::certificate::{CertificateError, DeviceCertificate};
use relay_core::wire::envelope::{EnvelopeError, MessageEnvelope};
use relay_core::wire::identity::{AccountId, DeviceId, RelayId};
use relay_core::wire::json::{parse_object, Object, Value};
use relay_core::wire::key_box::parse_boxes;
use relay_core::wire::route::{Route, RouteError};
use relay_core::wire::signature::{SignatureError, SignedObject};
use relay_core::ErrorCode;

const NET: &str = "dev";
const NOW: u64 = 1_700_000_000_000;
const TOL: u64 = 300_000;

struct World {
    rng: ChaCha20Rng,
    alice: AccountKey,
    phone: DeviceKey,
    bob: AccountKey,
}

fn world() -> World {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    World {
        alice: AccountKey::generate(&mut rng),
        phone: DeviceKey::generate(&mut rng),
        bob: AccountKey::generate(&mut rng),
        rng,
    }
}

fn cert_draft(w: &World) -> Draft {
    draft::certificate(NET, &w.alice, &w.phone, &["send", "sync"], NOW)
        .set("expires_at", NOW + 1000)
}

fn cert(o: Object) -> DeviceCertificate {
    DeviceCertificate::parse(o).expect("parses")
}

#[test]
fn identity_binding_account_id_is_the_key_and_device_id_derives_from_device_key() {
    let w = world();
    let id = w.alice.id();
    assert_eq!(id.as_str().len(), 43);
    assert_eq!(AccountId::parse(id.as_str()), Some(id.clone()));
    assert_eq!(w.phone.id().as_str().len(), 22);
    assert_eq!(
        w.phone.id(),
        DeviceId::derive(&relay_core::client::Signer::public_key(&w.phone))
    );
    assert!(
        AccountId::parse(&format!("{}=", id.as_str())).is_none(),
        "padding"
    );
}

#[test]
fn certificate_valid_passes_and_keeps_unknown_fields() {
    let w = world();
    let o = cert_draft(&w)
        .set("x-extra", Value::Array(vec![1u64.into()]))
        .sign(&w.alice);
    let c = cert(o.clone());
    assert_eq!(c.verify(NET), Ok(()));
    assert_eq!(c.check_current(NOW, TOL), Ok(()));
    assert!(c.permissions.send && c.permissions.sync && !c.permissions.manage);
    assert_eq!(c.canonical(), canonical::object_to_vec(&o));
    assert!(c.raw().contains("x-extra"));
}

#[test]
fn certificate_unknown_permissions_are_ignored_but_non_strings_rejected() {
    let w = world();
    let c = cert(
        cert_draft(&w)
            .set(
                "permissions",
                Value::Array(vec!["fly".into(), "manage".into()]),
            )
            .sign(&w.alice),
    );
    assert!(c.permissions.manage && !c.permissions.send);
    let e = DeviceCertificate::parse(
        cert_draft(&w)
            .set("permissions", Value::Array(vec![1u64.into()]))
            .sign(&w.alice),
    )
    .unwrap_err();
    assert_eq!(e.path, "permissions[0]");
}

#[test]
fn certificate_each_defect_is_named() {
    let mut w = world();
    let other = DeviceKey::generate(&mut w.rng);
    // Wrong network.
    let c = cert(cert_draft(&w).set("network", "main").sign(&w.alice));
    assert_eq!(c.verify(NET), Err(CertificateError::WrongNetwork));
    // Signed by another account key.
    let c = cert(cert_draft(&w).sign(&w.bob));
    assert!(matches!(c.verify(NET), Err(CertificateError::Signature(_))));
    assert_eq!(
        relay_core::Error::from(c.verify(NET).unwrap_err()).code,
        ErrorCode::InvalidSignature
    );
    // Signed under another type's domain.
    let c = cert(cert_draft(&w).sign_as("route", &w.alice));
    assert!(matches!(c.verify(NET), Err(CertificateError::Signature(_))));
    // device_id not bound to device_key.
    let c = cert(
        cert_draft(&w)
            .set("device_id", other.id().as_str())
            .sign(&w.alice),
    );
    assert_eq!(c.verify(NET), Err(CertificateError::Binding));
    assert_eq!(
        relay_core::Error::from(CertificateError::Binding).code,
        ErrorCode::InvalidCertificate
    );
    // Expired, and issued in the future beyond tolerance.
    let c = cert(cert_draft(&w).sign(&w.alice));
    assert_eq!(
        c.check_current(NOW + 1000, TOL),
        Err(CertificateError::Expired)
    );
    assert_eq!(
        c.check_current(NOW - TOL - 1, TOL),
        Err(CertificateError::IssuedInFuture)
    );
    assert_eq!(c.check_current(NOW - TOL, TOL), Ok(()));
    // Destination window: issued_at - tolerance <= created_at < expires_at.
    assert_eq!(c.check_valid_at(NOW - TOL, TOL), Ok(()));
    assert_eq!(
        c.check_valid_at(NOW - TOL - 1, TOL),
        Err(CertificateError::NotValidAtCreation)
    );
    assert_eq!(c.check_valid_at(NOW + 999, TOL), Ok(()));
    assert_eq!(
        c.check_valid_at(NOW + 1000, TOL),
        Err(CertificateError::NotValidAtCreation)
    );
    // Missing signature and malformed members are object-constraint errors.
    let e = DeviceCertificate::parse(cert_draft(&w).unsigned()).unwrap_err();
    assert_eq!(e.path, "sig");
    let e =
        DeviceCertificate::parse(cert_draft(&w).set("issued_at", "1").sign(&w.alice)).unwrap_err();
    assert_eq!(e.path, "issued_at");
    let e =
        DeviceCertificate::parse(cert_draft(&w).set("box_key", "AAAA").sign(&w.alice)).unwrap_err();
    assert_eq!(e.path, "box_key");
    let e =
        DeviceCertificate::parse(cert_draft(&w).set("type", "route").sign(&w.alice)).unwrap_err();
    assert_eq!(e.path, "type");
}

#[test]
fn signing_rule_covers_type_prefix_and_unknown_fields() {
    let w = world();
    let o = cert_draft(&w).set("note", "hello").sign(&w.alice);
    let c = cert(o.clone());
    let input = c.signing_input();
    let prefix = b"relay-v1:device_certificate\n";
    assert_eq!(&input[..prefix.len()], prefix);
    let mut without_sig = o.clone();
    without_sig.remove("sig");
    assert_eq!(
        &input[prefix.len()..],
        canonical::object_to_vec(&without_sig).as_slice()
    );
    // Changing an unknown member breaks the signature.
    let mut tampered = o;
    tampered.insert("note", "hellO");
    assert!(matches!(
        cert(tampered).verify(NET),
        Err(CertificateError::Signature(SignatureError::Mismatch))
    ));
}

#[test]
fn member_order_and_whitespace_do_not_matter() {
    let w = world();
    let o = cert_draft(&w).sign(&w.alice);
    let c = cert(o);
    // Re-serialize with reversed member order and whitespace; it still verifies.
    let members: Vec<String> = c
        .raw()
        .iter()
        .map(|(k, v)| {
            format!(
                "{} : {}",
                canonical::to_string(&Value::String(k.into())),
                canonical::to_string(v)
            )
        })
        .rev()
        .collect();
    let text = format!("{{ {} }}", members.join(" ,\n "));
    let c2 = cert(parse_object(text.as_bytes()).unwrap());
    assert_eq!(c2.verify(NET), Ok(()));
    assert_eq!(c2.canonical(), c.canonical());
}

fn envelope_draft(w: &World, id: &str) -> Draft {
    let mut body = Object::new();
    body.insert("alg", "none");
    draft::envelope(
        NET,
        id,
        &w.alice.id(),
        &w.phone.id(),
        &w.bob.id(),
        NOW,
        body,
    )
}

#[test]
fn envelope_device_signature_and_certificate_match() {
    let mut w = world();
    let id = random_id(&mut w.rng);
    let c = cert(cert_draft(&w).sign(&w.alice));
    let env = MessageEnvelope::parse(envelope_draft(&w, &id).sign(&w.phone)).unwrap();
    assert_eq!(env.verify_with(&c), Ok(()));
    assert_eq!(env.message_id, id);
    // Signed by the account instead of the device.
    let env = MessageEnvelope::parse(envelope_draft(&w, &id).sign(&w.alice)).unwrap();
    assert!(matches!(
        env.verify_with(&c),
        Err(EnvelopeError::Signature(_))
    ));
    // Certificate of another device.
    let other = DeviceKey::generate(&mut w.rng);
    let env = MessageEnvelope::parse(
        envelope_draft(&w, &id)
            .set("from_device_id", other.id().as_str())
            .sign(&other),
    )
    .unwrap();
    assert_eq!(env.verify_with(&c), Err(EnvelopeError::CertificateMismatch));
    // Object constraints: message_id 16..32 bytes, body an object.
    let short = relay_core::wire::base64url::encode(&[1u8; 15]);
    assert_eq!(
        MessageEnvelope::parse(envelope_draft(&w, &short).sign(&w.phone))
            .unwrap_err()
            .path,
        "message_id"
    );
    let long = relay_core::wire::base64url::encode(&[1u8; 33]);
    assert!(MessageEnvelope::parse(envelope_draft(&w, &long).sign(&w.phone)).is_err());
    let e = MessageEnvelope::parse(envelope_draft(&w, &id).set("body", "text").sign(&w.phone))
        .unwrap_err();
    assert_eq!(e.path, "body");
}

#[test]
fn key_boxes_seal_open_and_list_constraints() {
    let mut w = world();
    let tablet = DeviceKey::generate(&mut w.rng);
    let key = seal::message_key(&mut w.rng);
    let b1 = seal::seal_key_box(&mut w.rng, &w.phone.id(), &w.phone.box_key(), &key);
    let b2 = seal::seal_key_box(&mut w.rng, &tablet.id(), &tablet.box_key(), &key);
    assert_eq!(seal::open_key_box(&b1, &w.phone), Some(key));
    assert_eq!(
        seal::open_key_box(&b1, &tablet),
        None,
        "not for this device"
    );
    let list = seal::boxes(vec![b1.clone(), b2]);
    assert_eq!(parse_boxes("recipient_boxes", &list, 64).unwrap().len(), 2);
    let e = parse_boxes("recipient_boxes", &list, 1).unwrap_err();
    assert_eq!(e.path, "recipient_boxes");
    let dup = seal::boxes(vec![b1.clone(), b1.clone()]);
    assert_eq!(
        parse_boxes("recipient_boxes", &dup, 64).unwrap_err().path,
        "recipient_boxes[1].device_id"
    );
    assert!(parse_boxes("recipient_boxes", &Value::Array(vec![]), 64).is_err());
    // Relabelling a box for another device makes it fail to open.
    let mut relabelled = b1;
    relabelled.insert("device_id", tablet.id().as_str());
    assert_eq!(seal::open_key_box(&relabelled, &tablet), None);
    // Body round trip.
    let body = seal::seal_body(&mut w.rng, &key, b"hi bob");
    assert_eq!(
        seal::open_body(&body, &key).as_deref(),
        Some(&b"hi bob"[..])
    );
    assert_eq!(seal::open_body(&body, &[0u8; 32]), None);
}

#[test]
fn route_checks_network_scheme_and_signature() {
    let w = world();
    let r = Route::parse(
        draft::route(NET, &w.alice.id(), "http://127.0.0.1:8080", 1, NOW).sign(&w.alice),
    )
    .unwrap();
    assert_eq!(r.verify(NET), Ok(()));
    assert_eq!(r.verify("main"), Err(RouteError::WrongNetwork));
    let r = Route::parse(
        draft::route("main", &w.alice.id(), "http://relay.example", 1, NOW).sign(&w.alice),
    )
    .unwrap();
    assert_eq!(r.verify("main"), Err(RouteError::RelayNotAllowed));
    let r = Route::parse(
        draft::route(NET, &w.alice.id(), "https://relay.example", 2, NOW).sign(&w.bob),
    )
    .unwrap();
    assert!(matches!(r.verify(NET), Err(RouteError::Signature(_))));
}

#[test]
fn relay_ids_are_exact_origins() {
    for ok in [
        "https://relay.example",
        "http://127.0.0.1:8080",
        "https://a-b.example:8443",
        "http://[::1]:9000",
    ] {
        assert!(RelayId::parse(ok).is_ok(), "{ok}");
    }
    for bad in [
        "https://Relay.example",
        "https://relay.example/",
        "https://relay.example:443",
        "http://relay.example:80",
        "ftp://relay.example",
        "https://relay.example?x",
        "https://relay.example:0",
        "https://relay.example:08080",
        "https://user@relay.example",
        "relay.example",
        "https://",
    ] {
        assert!(RelayId::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn authorization_grant_and_invite_checks() {
    let mut w = world();
    let carol = AccountKey::generate(&mut w.rng);
    let gid = random_id(&mut w.rng);
    // Bob (recipient) grants Alice (sender).
    let g =
        Authorization::parse(draft::grant(NET, &gid, &w.bob.id(), &w.alice.id(), NOW).sign(&w.bob))
            .unwrap();
    assert_eq!(g.verify(NET, &w.alice.id(), &w.bob.id(), NOW, TOL), Ok(()));
    assert_eq!(
        g.verify(NET, &carol.id(), &w.bob.id(), NOW, TOL),
        Err(AuthorizationError::Binding)
    );
    assert_eq!(
        g.verify(NET, &w.alice.id(), &carol.id(), NOW, TOL),
        Err(AuthorizationError::Binding)
    );
    assert_eq!(
        g.verify("main", &w.alice.id(), &w.bob.id(), NOW, TOL),
        Err(AuthorizationError::WrongNetwork)
    );
    let forged = Authorization::parse(
        draft::grant(NET, &gid, &w.bob.id(), &w.alice.id(), NOW).sign(&w.alice),
    )
    .unwrap();
    assert!(matches!(
        forged.verify(NET, &w.alice.id(), &w.bob.id(), NOW, TOL),
        Err(AuthorizationError::Signature(_))
    ));
    let expiring = Authorization::parse(
        draft::grant(NET, &gid, &w.bob.id(), &w.alice.id(), NOW)
            .set("expires_at", NOW + 5)
            .sign(&w.bob),
    )
    .unwrap();
    assert_eq!(
        expiring.verify(NET, &w.alice.id(), &w.bob.id(), NOW + 5, TOL),
        Err(AuthorizationError::Expired)
    );
    // An invite lets anyone deliver to the issuer; a route inside must be the issuer's.
    let iid = random_id(&mut w.rng);
    let bob_route = draft::route(NET, &w.bob.id(), "http://127.0.0.1:1", 1, NOW).sign(&w.bob);
    let inv = Authorization::parse(
        draft::invite(NET, &iid, &w.bob.id(), NOW, NOW + 10)
            .set("route", bob_route)
            .sign(&w.bob),
    )
    .unwrap();
    assert_eq!(inv.verify(NET, &carol.id(), &w.bob.id(), NOW, TOL), Ok(()));
    let alice_route = draft::route(NET, &w.alice.id(), "http://127.0.0.1:1", 1, NOW).sign(&w.alice);
    let inv = Authorization::parse(
        draft::invite(NET, &iid, &w.bob.id(), NOW, NOW + 10)
            .set("route", alice_route)
            .sign(&w.bob),
    )
    .unwrap();
    assert_eq!(
        inv.verify(NET, &carol.id(), &w.bob.id(), NOW, TOL),
        Err(AuthorizationError::Route)
    );
    // max_uses 0 and a missing expires_at are object-constraint errors.
    assert!(Authorization::parse(
        draft::invite(NET, &iid, &w.bob.id(), NOW, NOW + 10)
            .set("max_uses", 0u64)
            .sign(&w.bob)
    )
    .is_err());
    assert!(Authorization::parse(
        draft::invite(NET, &iid, &w.bob.id(), NOW, NOW + 10)
            .remove("expires_at")
            .sign(&w.bob)
    )
    .is_err());
    assert_eq!(
        relay_core::Error::from(AuthorizationError::Expired).code,
        ErrorCode::AuthorizationInvalid
    );
}

#[test]
fn base64url_is_strict() {
    use relay_core::wire::base64url::decode;
    assert_eq!(decode("AA"), Some(vec![0]));
    assert_eq!(decode("AA=="), None, "padding");
    assert_eq!(decode("AB"), None, "trailing bits set");
    assert_eq!(decode("A+"), None, "standard alphabet");
    assert_eq!(decode("A"), None, "impossible length");
}
