//! Every protocol object's parser, the identities, base64url and relay request authentication.
//!
//! The input is parsed as strict JSON; every object parser of `relay_core::wire`
//! runs on the top-level object and on each object member one level down (so
//! message params with an envelope, a certificate and boxes reach them all),
//! and every string reaches the identity and base64url parsers. Oracle: no
//! panic; whatever parses round-trips (canonical form -> strict parse -> the
//! same parser -> an equal value with the same canonical text); a byte string
//! has exactly one spelling; identities print as they were read; signature
//! verdicts are the same through the memory of verified signatures and
//! without it.

use relay_core::engine::Config;
use relay_core::wire::authorization::{Authorization, ContactGrant, ContactInvite};
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::identity::{valid_network, AccountId, DeviceId, RelayId};
use relay_core::wire::json::{self, Object, Value};
use relay_core::wire::key_box::{parse_boxes, KeyBox};
use relay_core::wire::route::Route;
use relay_core::wire::session_open::{DeviceRevocation, SessionOpen};
use relay_core::wire::signature::{verify_own, verify_strict, SignedObject};
use relay_core::wire::{base64url, canonical, preverify, relay_request};

/// The network of test worlds, which the seeds' objects name.
const NET: &str = "dev";

/// The objects target: see the module documentation for the oracle.
pub fn objects(data: &[u8]) {
    texts_of_raw(data);
    let _ = Config::from_json(data).map(|c| {
        let again = Config::from_json(&c.to_json()).expect("a written config reads back");
        assert_eq!(again.to_json(), c.to_json(), "config round trip");
    });
    let Ok(value) = json::parse(data) else {
        return;
    };
    if let Value::Array(_) = value {
        boxes(&value);
    }
    let Value::Object(o) = value else {
        return;
    };
    let here = RelayId::parse("http://a.test").expect("relay id");
    let _ = relay_request::parse_well_known(data, &here, NET);
    all_parsers(&o);
    for (_, member) in o.iter() {
        match member {
            Value::Object(inner) => all_parsers(inner),
            Value::Array(_) => boxes(member),
            _ => {}
        }
    }
    strings(&Value::Object(o.clone()), 0);
    headers(&o);
    let _ = preverify::deliver(&o);
    if let Some(key) = o
        .get("key")
        .and_then(Value::as_str)
        .and_then(base64url::decode_array::<32>)
    {
        let _ = preverify::send(&key, &o);
    }
}

/// Raw bytes as header strings: the header parser must not panic on any text.
fn texts_of_raw(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(5, '\n');
    let headers = relay_request::RelayHeaders {
        relay_id: parts.next().unwrap_or_default().to_string(),
        timestamp: parts.next().unwrap_or_default().to_string(),
        nonce: parts.next().unwrap_or_default().to_string(),
        signature: parts.next().unwrap_or_default().to_string(),
        route_revision: parts.next().map(str::to_string),
    };
    precheck(&headers, data);
}

fn precheck(headers: &relay_request::RelayHeaders, body: &[u8]) {
    let me = RelayId::parse("http://b.test").expect("relay id");
    for now in [0, 1_800_000_000_000, u64::MAX] {
        if let Ok(p) =
            relay_request::precheck(headers, NET, &me, "message.deliver", body, now, 300_000)
        {
            assert_eq!(p.source.as_str(), headers.relay_id);
            assert_eq!(p.nonce, headers.nonce);
            let _ = p.verify(&[0; 32]);
        }
    }
}

/// `{"Relay-Id", "Relay-Timestamp", "Relay-Nonce", "Relay-Signature", "Relay-Route-Revision"?,
/// "body"?, "key"?}` as a request.
fn headers(o: &Object) {
    let s = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
    let (Some(relay_id), Some(timestamp), Some(nonce), Some(signature)) = (
        s("Relay-Id"),
        s("Relay-Timestamp"),
        s("Relay-Nonce"),
        s("Relay-Signature"),
    ) else {
        return;
    };
    let h = relay_request::RelayHeaders {
        relay_id,
        timestamp,
        nonce,
        signature,
        route_revision: s("Relay-Route-Revision"),
    };
    let body = s("body").unwrap_or_default();
    precheck(&h, body.as_bytes());
    let me = RelayId::parse("http://b.test").expect("relay id");
    let ts = h.timestamp.parse::<u64>().unwrap_or(0);
    if let Ok(p) = relay_request::precheck(&h, NET, &me, "message.deliver", body.as_bytes(), ts, 0)
    {
        if let Some(key) = s("key").and_then(|k| base64url::decode_array::<32>(&k)) {
            let _ = p.verify(&key);
        }
    }
}

/// Every object parser over one object.
fn all_parsers(o: &Object) {
    if let Ok(c) = DeviceCertificate::parse(o.clone()) {
        let again = round_trip(&c, DeviceCertificate::parse);
        signed(&c, c.account.key());
        let _ = again.verify(NET);
        let _ = again.verify(&again.network);
        for now in [
            0,
            again.issued_at,
            again.expires_at.unwrap_or(u64::MAX),
            u64::MAX,
        ] {
            let _ = again.check_current(now, 300_000);
            let _ = again.check_valid_at(now, 300_000);
        }
    }
    if let Ok(e) = MessageEnvelope::parse(o.clone()) {
        let again = round_trip(&e, MessageEnvelope::parse);
        assert_eq!(
            again.canonical_text(),
            canonical::object_to_string(again.raw())
        );
        signed(&e, e.from.key());
        if let Some(Ok(cert)) = o
            .get("device_certificate")
            .and_then(Value::as_object)
            .map(|c| DeviceCertificate::parse(c.clone()))
        {
            let first = e.verify_with(&cert);
            assert_eq!(first, e.verify_with(&cert), "a remembered verdict differs");
        }
    }
    if let Ok(r) = Route::parse(o.clone()) {
        let again = round_trip(&r, Route::parse);
        signed(&r, r.account.key());
        let _ = again.verify(NET);
        let _ = again.verify(&again.network);
    }
    if let Ok(b) = KeyBox::parse(o.clone()) {
        let again = KeyBox::parse(reparse(b.raw())).expect("a key box re-parses");
        assert_eq!(again.device_id, b.device_id);
        assert_eq!(
            Value::Object(again.raw().clone()),
            Value::Object(b.raw().clone())
        );
    }
    if let Ok(s) = SessionOpen::parse(o.clone()) {
        round_trip(&s, SessionOpen::parse);
        signed(&s, s.account.key());
    }
    if let Ok(r) = DeviceRevocation::parse(o.clone()) {
        round_trip(&r, DeviceRevocation::parse);
        signed(&r, r.account.key());
    }
    if let Ok(g) = ContactGrant::parse(o.clone()) {
        round_trip(&g, ContactGrant::parse);
        signed(&g, g.grantor.key());
    }
    if let Ok(i) = ContactInvite::parse(o.clone()) {
        round_trip(&i, ContactInvite::parse);
        signed(&i, i.issuer.key());
    }
    if let Ok(a) = Authorization::parse(o.clone()) {
        let again = Authorization::parse(reparse(a.raw())).expect("an authorization re-parses");
        assert_eq!(again.id(), a.id());
        assert_eq!(again.issuer(), a.issuer());
        assert_eq!(
            Value::Object(again.raw().clone()),
            Value::Object(a.raw().clone())
        );
        let from = match &a {
            Authorization::Grant(g) => g.grantee.clone(),
            Authorization::Invite(i) => i.issuer.clone(),
        };
        for now in [0, 1_800_000_000_000, u64::MAX] {
            let _ = a.verify(NET, &from, a.issuer(), now, 300_000);
        }
    }
}

/// A key box list, with the largest box count the default policy allows.
fn boxes(v: &Value) {
    if let Ok(list) = parse_boxes("boxes", v, 16) {
        assert!(!list.is_empty() && list.len() <= 16);
        let again = Value::Array(
            list.iter()
                .map(|b| Value::Object(reparse(b.raw())))
                .collect(),
        );
        let list2 = parse_boxes("boxes", &again, 16).expect("boxes re-parse");
        assert_eq!(list2.len(), list.len());
        for (x, y) in list.iter().zip(&list2) {
            assert_eq!(x.device_id, y.device_id);
            assert_eq!(
                Value::Object(x.raw().clone()),
                Value::Object(y.raw().clone())
            );
        }
    }
}

/// The canonical form, parsed strictly again.
fn reparse(o: &Object) -> Object {
    let text = canonical::object_to_vec(o);
    json::parse_object(&text).unwrap_or_else(|e| panic!("canonical object is not strict JSON: {e}"))
}

/// parse -> canonical -> parse gives an equal object with the same canonical text.
///
/// Typed objects compare their `raw` member through `Object`'s derived equality, which
/// is member-order sensitive (unlike `Value`'s): so the comparison is of the values, of
/// the canonical texts, and of a second trip from canonical form.
fn round_trip<T: SignedObject + PartialEq + std::fmt::Debug>(
    t: &T,
    parse: impl Fn(Object) -> Result<T, relay_core::wire::field::FieldError>,
) -> T {
    let again = parse(reparse(t.raw()))
        .unwrap_or_else(|e| panic!("{} does not re-parse from canonical: {e}", T::TYPE));
    assert_eq!(
        Value::Object(again.raw().clone()),
        Value::Object(t.raw().clone()),
        "{} changed through its canonical form",
        T::TYPE
    );
    assert_eq!(again.canonical(), t.canonical());
    let third = parse(reparse(again.raw())).expect("a canonical object re-parses");
    assert_eq!(
        third,
        again,
        "{} is not stable from its canonical form",
        T::TYPE
    );
    again
}

/// Signature checks: the memory of verified signatures answers what verification does.
fn signed<T: SignedObject>(t: &T, key: &[u8; 32]) {
    let input = t.signing_input();
    let fresh = verify_own(key, &input, t.sig());
    assert_eq!(verify_strict(key, &input, t.sig()), fresh);
    assert_eq!(verify_strict(key, &input, t.sig()), fresh, "remembered");
    assert_eq!(t.verify_signature(key), fresh);
}

/// Identity and encoding parsers over every string in the value.
fn strings(v: &Value, depth: usize) {
    match v {
        Value::String(s) => identities(s),
        Value::Array(items) if depth < 4 => items.iter().for_each(|i| strings(i, depth + 1)),
        Value::Object(o) if depth < 4 => o.iter().for_each(|(k, m)| {
            identities(k);
            strings(m, depth + 1)
        }),
        _ => {}
    }
}

fn identities(s: &str) {
    if let Some(b) = base64url::decode(s) {
        assert_eq!(
            base64url::encode(&b),
            s,
            "a second spelling of the same bytes"
        );
    }
    if let Some(a) = AccountId::parse(s) {
        assert_eq!(a.as_str(), s);
        assert_eq!(AccountId::from_key(*a.key()), a);
    }
    if let Some(d) = DeviceId::parse(s) {
        assert_eq!(d.as_str(), s);
    }
    if let Ok(r) = RelayId::parse(s) {
        assert_eq!(r.as_str(), s);
        assert!(
            r.as_str().starts_with("http://") || r.as_str().starts_with("https://"),
            "{s}"
        );
        assert!(!s.ends_with('/') && !s.chars().any(|c| c.is_ascii_uppercase()));
        let _ = r.allowed_on(NET);
    }
    if valid_network(s) {
        assert!(!s.is_empty() && s.len() <= 32);
    }
}
