//! The health checks every host serves on both listeners (protocol.md §6): `GET /healthz`
//! (the process serves) and `GET /readyz` (it can take work), answered alike everywhere.
//!
//! They report the host's own state (its storage, its core instance, its shutdown), so the
//! host answers them without a call into the core; the core spells the answers and decides
//! which requests they are, so no host differs in either.

use super::http::Response;

/// Which health check a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// `/healthz`: the process serves.
    Live,
    /// `/readyz`: the relay can take work.
    Ready,
}

impl Check {
    /// The check a request of `method` on `path` is: `GET` (or `HEAD`, which HTTP answers
    /// as `GET` without the body) of `/healthz` or `/readyz`. Anything else is the core's
    /// to route (another method on those paths is no endpoint, 404).
    pub fn of(method: &str, path: &str) -> Option<Check> {
        if method != "GET" && method != "HEAD" {
            return None;
        }
        match path {
            "/healthz" => Some(Check::Live),
            "/readyz" => Some(Check::Ready),
            _ => None,
        }
    }

    /// The check by the name the JS bindings use (`live`, `ready`).
    pub fn from_name(name: &str) -> Option<Check> {
        match name {
            "live" => Some(Check::Live),
            "ready" => Some(Check::Ready),
            _ => None,
        }
    }

    /// The name the JS bindings use.
    pub fn name(self) -> &'static str {
        match self {
            Check::Live => "live",
            Check::Ready => "ready",
        }
    }
}

/// What a host knows of its own state; `/readyz` names the first thing wrong, in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Shutdown has begun: no new work should come here.
    pub stopping: bool,
    /// The core instance is not running (it failed closed, or a trap has not been recovered).
    pub core_down: bool,
    /// The storage refused the last commit, or is closed.
    pub storage_failing: bool,
}

impl State {
    /// Why the relay is not ready, if it is not.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.stopping {
            Some("shutting down")
        } else if self.core_down {
            Some("the core instance is not running")
        } else if self.storage_failing {
            Some("the storage refused the last commit")
        } else {
            None
        }
    }
}

/// The answer to `check`: `ok` for a live process; `ready`, or 503 `not ready: {why}` when
/// the host says why it is not (`not_ready`; only `/readyz` reads it).
pub fn answer(check: Check, not_ready: Option<&str>) -> Response {
    let (status, body) = match (check, not_ready) {
        (Check::Live, _) => (200, "ok\n".to_string()),
        (Check::Ready, None) => (200, "ready\n".to_string()),
        (Check::Ready, Some(why)) => (503, format!("not ready: {why}\n")),
    };
    Response {
        status,
        headers: vec![("content-type", "text/plain; charset=utf-8".to_string())],
        body: body.into_bytes(),
        effects: Vec::new(),
    }
}

/// The content type of the metrics text (Prometheus text format 0.0.4).
pub const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_checks_are_get_or_head_of_two_paths_and_answered_alike() {
        assert_eq!(Check::of("GET", "/healthz"), Some(Check::Live));
        assert_eq!(Check::of("HEAD", "/readyz"), Some(Check::Ready));
        assert_eq!(Check::of("POST", "/healthz"), None);
        assert_eq!(Check::of("GET", "/healthz/"), None);
        let live = answer(Check::Live, Some("ignored"));
        assert_eq!(
            (live.status, live.body.as_slice()),
            (200, b"ok\n".as_slice())
        );
        let ready = answer(Check::Ready, None);
        assert_eq!(
            (ready.status, ready.body.as_slice()),
            (200, b"ready\n".as_slice())
        );
        let down = answer(Check::Ready, Some("shutting down"));
        assert_eq!(
            (down.status, down.body.as_slice()),
            (503, b"not ready: shutting down\n".as_slice())
        );
        assert_eq!(
            down.headers,
            vec![("content-type", "text/plain; charset=utf-8".to_string())]
        );
        for c in [Check::Live, Check::Ready] {
            assert_eq!(Check::from_name(c.name()), Some(c));
        }
    }

    #[test]
    fn readiness_names_the_first_thing_wrong() {
        let all = State {
            stopping: true,
            core_down: true,
            storage_failing: true,
        };
        assert_eq!(all.not_ready(), Some("shutting down"));
        let core = State {
            stopping: false,
            ..all
        };
        assert_eq!(core.not_ready(), Some("the core instance is not running"));
        let storage = State {
            core_down: false,
            ..core
        };
        assert_eq!(
            storage.not_ready(),
            Some("the storage refused the last commit")
        );
        assert_eq!(State::default().not_ready(), None);
    }
}
