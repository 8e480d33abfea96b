//! The transport limits every host enforces on its sockets (README "Facing the internet",
//! docs/protocol.md §6): one table of their names, defaults and units, from which each host
//! derives its flags (`--` and the name with `-`), TOML keys (the name) and options.

/// One transport limit, as every host names and defaults it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The TOML key; the flag is `--` and the name with `-`.
    pub name: &'static str,
    /// Its value when nothing sets it.
    pub default: u64,
    /// `ms` for a time, `count` otherwise.
    pub unit: &'static str,
}

/// Every transport limit, in the order hosts list them.
pub const LIMITS: [Limit; 8] = [
    Limit {
        name: "header_timeout",
        default: 10_000,
        unit: "ms",
    },
    Limit {
        name: "body_timeout",
        default: 30_000,
        unit: "ms",
    },
    Limit {
        name: "idle_timeout",
        default: 60_000,
        unit: "ms",
    },
    Limit {
        name: "ws_ping_interval",
        default: 30_000,
        unit: "ms",
    },
    Limit {
        name: "max_connections",
        default: 1000,
        unit: "count",
    },
    Limit {
        name: "max_connections_per_ip",
        default: 64,
        unit: "count",
    },
    Limit {
        name: "ws_send_queue",
        default: 256,
        unit: "count",
    },
    Limit {
        name: "max_pending",
        default: 1024,
        unit: "count",
    },
];

/// The transport limits of README "Facing the internet" (docs/protocol.md §6), each a flag
/// (`--header-timeout MS`, ...) and a TOML key of the same name with `_`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Request line and headers within this (ms) of the connection opening or the first byte
    /// of the next request, else the connection is closed.
    pub header_timeout: u64,
    /// The whole body within this (ms) once a handler reads it, else 408 and close.
    pub body_timeout: u64,
    /// A keep-alive connection idle this long (ms) is closed.
    pub idle_timeout: u64,
    /// Every WebSocket is pinged this often (ms); one that sent nothing since the last ping is closed.
    pub ws_ping_interval: u64,
    /// Open TCP connections at most (each listener); more are closed at accept.
    pub max_connections: u64,
    /// Open TCP connections per peer IP address at most (public listener); same treatment.
    pub max_connections_per_ip: u64,
    /// Outbound messages queued per WebSocket at most; a client that lets more pile up is dropped.
    pub ws_send_queue: u64,
    /// Requests (and WebSocket frames) in the core or waiting for it at most; beyond it 503
    /// `unavailable` with `Retry-After: 1`.
    pub max_pending: u64,
}

impl Default for Limits {
    /// The table's defaults (its rows are in the fields' order; the test checks each name).
    fn default() -> Limits {
        let d = |i: usize| LIMITS[i].default;
        Limits {
            header_timeout: d(0),
            body_timeout: d(1),
            idle_timeout: d(2),
            ws_ping_interval: d(3),
            max_connections: d(4),
            max_connections_per_ip: d(5),
            ws_send_queue: d(6),
            max_pending: d(7),
        }
    }
}

impl Limits {
    /// The limit named `name` (a TOML key).
    pub fn get(&self, name: &str) -> Option<u64> {
        let mut l = *self;
        l.slot(name).map(|v| *v)
    }

    /// Sets the limit named `name` (a TOML key) to `v`, a positive integer.
    pub fn set(&mut self, name: &str, v: u64) -> Result<(), String> {
        if v < 1 {
            return Err(format!("{name} must be a positive integer, not {v}"));
        }
        let slot = self
            .slot(name)
            .ok_or_else(|| format!("no limit named {name}"))?;
        *slot = v;
        Ok(())
    }

    fn slot(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "header_timeout" => &mut self.header_timeout,
            "body_timeout" => &mut self.body_timeout,
            "idle_timeout" => &mut self.idle_timeout,
            "ws_ping_interval" => &mut self.ws_ping_interval,
            "max_connections" => &mut self.max_connections,
            "max_connections_per_ip" => &mut self.max_connections_per_ip,
            "ws_send_queue" => &mut self.ws_send_queue,
            "max_pending" => &mut self.max_pending,
            _ => return None,
        })
    }

    /// The limits as JSON `[{"name", "default", "unit"}]`, in table order (for JS hosts).
    pub fn table_json() -> String {
        use crate::wire::json::{Object, Value};
        let rows = LIMITS
            .iter()
            .map(|l| {
                let mut o = Object::new();
                o.insert("name", l.name);
                o.insert("default", l.default);
                o.insert("unit", l.unit);
                Value::Object(o)
            })
            .collect();
        crate::wire::canonical::to_string(&Value::Array(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_in_the_table_is_a_limit_and_defaults_come_from_it() {
        let d = Limits::default();
        assert_eq!(
            (d.header_timeout, d.max_connections_per_ip, d.max_pending),
            (10_000, 64, 1024)
        );
        for t in &LIMITS {
            assert_eq!(
                d.get(t.name),
                Some(t.default),
                "{} is its row's default",
                t.name
            );
        }
        let mut l = d;
        for (i, t) in LIMITS.iter().enumerate() {
            l.set(t.name, 100 + i as u64).unwrap();
        }
        assert_eq!((l.header_timeout, l.max_pending), (100, 107));
        assert!(l.set("header_timeout", 0).is_err());
        assert!(l.set("nope", 1).is_err());
        assert!(Limits::table_json()
            .starts_with(r#"[{"default":10000,"name":"header_timeout","unit":"ms"}"#));
    }
}
