//! Which shard of a sharded relay a request belongs to, decided before any engine sees it.
//!
//! The router (the edge Worker, the wasmtime host's acceptor) asks [`shard_of`] and hands
//! the request to that shard's engine whole. The answer depends only on the request and
//! the shard count: a session's token names its shard; other calls name an account in
//! their params, and the account's shard is [`Shard::of_account`]. A request that names
//! none (the well-known document, a malformed body, an unknown method) goes to shard 0,
//! whose engine answers it as any shard would.

use super::http::{Listener, Request};
use crate::engine::shard::Shard;
use crate::wire::json::{self, Object, Value};

/// The shard, of `count`, whose engine handles `req`.
pub fn shard_of(req: &Request, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    match req.listener {
        // The operator names a shard in the query (`?shard=N`); shard 0 by default.
        Listener::Admin => req
            .query_param("shard")
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|&s| s < count)
            .unwrap_or(0),
        Listener::Public => public(req, count),
    }
}

fn public(req: &Request, count: u32) -> u32 {
    let path = req.path.as_str();
    if req.method == "GET" {
        return match path {
            "/v1/ws" => req
                .bearer()
                .or_else(|| req.query_param("session"))
                .map_or(0, |t| Shard::of_token(t, count)),
            _ => 0,
        };
    }
    let (relay, method) = match (path.strip_prefix("/v1/"), path.strip_prefix("/relay/v1/")) {
        (Some(m), _) => (false, m),
        (_, Some(m)) => (true, m),
        _ => return 0,
    };
    if !relay {
        if let Some(t) = req.bearer() {
            return Shard::of_token(t, count);
        }
    }
    let Ok(p) = json::parse_object(&req.body) else {
        return 0;
    };
    account_of(method, &p).map_or(0, |a| Shard::of_account(a, count))
}

/// The account a call without a session is about, by method.
fn account_of<'a>(method: &str, p: &'a Object) -> Option<&'a str> {
    let member = |o: &'a Object, outer: &str, inner: &str| -> Option<&'a str> {
        o.get(outer)?.as_object()?.get(inner)?.as_str()
    };
    match method {
        "session.open" | "route.get" | "device.list" => p.get("account").and_then(Value::as_str),
        "account.register" | "route.publish" => member(p, "route", "account"),
        "message.deliver" => member(p, "envelope", "to"),
        // A batch goes to its first item's shard (engine::batch rule 4).
        "message.deliver.batch" => {
            let Some(Value::Array(items)) = p.get("items") else {
                return None;
            };
            let first = items.first()?.as_object()?;
            member(first.get("params")?.as_object()?, "envelope", "to")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        listener: Listener,
        method: &str,
        path: &str,
        query: &str,
        bearer: Option<&str>,
        body: &str,
    ) -> Request {
        Request {
            listener,
            method: method.into(),
            path: path.into(),
            query: query.into(),
            headers: bearer
                .map(|t| vec![("authorization".to_string(), format!("Bearer {t}"))])
                .unwrap_or_default(),
            body: body.as_bytes().to_vec(),
            origin: None,
        }
    }

    const A: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

    #[test]
    fn calls_go_to_the_shard_of_the_account_they_name() {
        let n = 4;
        let want = Shard::of_account(A, n);
        let p = |m: &str, body: String| req(Listener::Public, "POST", m, "", None, &body);
        let account = format!(r#"{{"account":"{A}"}}"#);
        let route = format!(r#"{{"route":{{"account":"{A}"}}}}"#);
        let envelope = format!(r#"{{"envelope":{{"to":"{A}"}}}}"#);
        assert_eq!(shard_of(&p("/v1/session.open", account.clone()), n), want);
        assert_eq!(shard_of(&p("/v1/route.get", account.clone()), n), want);
        assert_eq!(shard_of(&p("/relay/v1/device.list", account), n), want);
        assert_eq!(shard_of(&p("/v1/account.register", route.clone()), n), want);
        assert_eq!(shard_of(&p("/v1/route.publish", route), n), want);
        assert_eq!(shard_of(&p("/relay/v1/message.deliver", envelope), n), want);
    }

    #[test]
    fn sessions_go_to_the_shard_their_token_names() {
        let s = req(
            Listener::Public,
            "POST",
            "/v1/message.send",
            "",
            Some("3.tok"),
            "{}",
        );
        assert_eq!(shard_of(&s, 4), 3);
        let ws = req(Listener::Public, "GET", "/v1/ws", "session=2.tok", None, "");
        assert_eq!(shard_of(&ws, 4), 2);
        // A relay request is placed by its params, never by a bearer it may carry.
        let body = format!(r#"{{"envelope":{{"to":"{A}"}}}}"#);
        let r = req(
            Listener::Public,
            "POST",
            "/relay/v1/message.deliver",
            "",
            Some("3.x"),
            &body,
        );
        assert_eq!(shard_of(&r, 4), Shard::of_account(A, 4));
    }

    #[test]
    fn what_names_no_account_goes_to_shard_zero() {
        for (m, path, body) in [
            ("GET", "/.well-known/relay", ""),
            ("POST", "/v1/route.get", "not json"),
            ("POST", "/v1/route.get", r#"{"account":7}"#),
            ("POST", "/v1/unknown", r#"{"account":"x"}"#),
            ("POST", "/elsewhere", "{}"),
        ] {
            assert_eq!(
                shard_of(&req(Listener::Public, m, path, "", None, body), 4),
                0,
                "{path} {body}"
            );
        }
        let admin = |q: &str| {
            req(
                Listener::Admin,
                "POST",
                "/admin/v1/deliveries",
                q,
                None,
                "{}",
            )
        };
        assert_eq!(shard_of(&admin("shard=3"), 4), 3);
        assert_eq!(shard_of(&admin("shard=4"), 4), 0);
        assert_eq!(shard_of(&admin(""), 4), 0);
        assert_eq!(shard_of(&admin("shard=3"), 1), 0);
    }
}
