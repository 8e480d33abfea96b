//! The environment knobs: settings for measuring and debugging a relay, never needed to run
//! one, so they are not flags. One table for every host: the wasmtime host reads it here, the
//! Node host from the JSON xtask writes of it (`pkg/tuning.json`), and the README lists it.

use std::path::PathBuf;

/// What a knob's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `0` or `1`.
    Switch,
    /// A non-negative integer.
    Count,
    /// A file path.
    Path,
}

impl Kind {
    /// The kind's name in `pkg/tuning.json`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Switch => "switch",
            Kind::Count => "count",
            Kind::Path => "path",
        }
    }
}

/// One environment knob.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// The variable's name.
    pub name: &'static str,
    /// What its value is.
    pub kind: Kind,
    /// Its value when unset, as text (`""`: none).
    pub default: &'static str,
    /// The hosts that read it (`wasmtime`, `node`).
    pub hosts: &'static [&'static str],
    /// What it does, for the README and `pkg/tuning.json`.
    pub doc: &'static str,
}

/// Every environment knob a host reads (besides `RELAY_LOG`, the log filter).
pub const KNOBS: &[Knob] = &[
    Knob {
        name: "RELAY_PREVERIFY",
        kind: Kind::Switch,
        default: "1",
        hosts: &["wasmtime", "node"],
        doc: "0 leaves every envelope verification to the core's thread (the HTTP workers verify none ahead), to measure what verifying ahead pays",
    },
    Knob {
        name: "RELAY_GROUP_COMMIT",
        kind: Kind::Count,
        default: "",
        hosts: &["wasmtime", "node"],
        doc: "caps a commit group at N calls (0: each call commits alone); unset, the host's default (16 on wasmtime, none on Node), to measure what grouping pays",
    },
    Knob {
        name: "RELAY_OWN_VERIFY",
        kind: Kind::Switch,
        default: "0",
        hosts: &["wasmtime", "node"],
        doc: "1 declines the host's native Ed25519 verification, so the core verifies in wasm, to measure what the host's pays",
    },
    Knob {
        name: "RELAY_OWN_SHA256",
        kind: Kind::Switch,
        default: "0",
        hosts: &["wasmtime", "node"],
        doc: "1 declines the host's native SHA-256, so the core hashes in wasm",
    },
    Knob {
        name: "RELAY_PERFMAP",
        kind: Kind::Switch,
        default: "0",
        hosts: &["wasmtime"],
        doc: "1 names the compiled wasm functions for perf (/tmp/perf-PID.map)",
    },
    Knob {
        name: "RELAY_COMPONENT",
        kind: Kind::Path,
        default: "",
        hosts: &["wasmtime"],
        doc: "the core component to load when --component is not given (else the one beside the binary, else target/component/ of the checkout)",
    },
    Knob {
        name: "RELAY_NATIVE_REQUIRED",
        kind: Kind::Switch,
        default: "0",
        hosts: &["node"],
        doc: "1 makes a missing or unloadable native crypto package an error instead of falling back to the core's wasm crypto (for tests)",
    },
    Knob {
        name: "RELAY_NODE_THREAD",
        kind: Kind::Switch,
        default: "1",
        hosts: &["node"],
        doc: "0 runs relay-node serve's relay on the transports' thread instead of a worker thread of its own",
    },
];

/// The knobs' values, as every host reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `RELAY_PREVERIFY`: envelopes are verified ahead of the core's thread.
    pub preverify: bool,
    /// `RELAY_GROUP_COMMIT`: the most calls in one commit group, if set.
    pub group_commit: Option<usize>,
    /// `RELAY_OWN_VERIFY`: the host's Ed25519 is declined.
    pub own_verify: bool,
    /// `RELAY_OWN_SHA256`: the host's SHA-256 is declined.
    pub own_sha256: bool,
    /// `RELAY_PERFMAP`: wasm functions are named for perf.
    pub perfmap: bool,
    /// `RELAY_COMPONENT`: the component to load, if set.
    pub component: Option<PathBuf>,
    /// `RELAY_NATIVE_REQUIRED`: no fallback from the native crypto.
    pub native_required: bool,
    /// `RELAY_NODE_THREAD`: relay-node serve runs the relay on a thread of its own.
    pub node_thread: bool,
}

impl Tuning {
    /// The knobs from the process's environment.
    pub fn from_env() -> Result<Tuning, String> {
        Tuning::from_lookup(|name| std::env::var(name).ok())
    }

    /// The knobs from `get` (a variable's value, if set); a malformed value is an error that
    /// names the variable and what it takes.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Tuning, String> {
        let value = |name: &str| {
            let knob = KNOBS
                .iter()
                .find(|k| k.name == name)
                .expect("a knob of KNOBS");
            let v = get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty());
            (knob, v.unwrap_or_else(|| knob.default.to_string()))
        };
        let switch = |name: &str| match value(name) {
            (_, v) if v == "1" => Ok(true),
            (_, v) if v == "0" => Ok(false),
            (k, v) => Err(format!("{}={v}: takes 0 or 1", k.name)),
        };
        let count = |name: &str| match value(name) {
            (_, v) if v.is_empty() => Ok(None),
            (k, v) => v
                .parse::<usize>()
                .map(Some)
                .map_err(|_| format!("{}={v}: takes a count (0, 1, 2, ...)", k.name)),
        };
        let path = |name: &str| {
            let (_, v) = value(name);
            (!v.is_empty()).then(|| PathBuf::from(v))
        };
        Ok(Tuning {
            preverify: switch("RELAY_PREVERIFY")?,
            group_commit: count("RELAY_GROUP_COMMIT")?,
            own_verify: switch("RELAY_OWN_VERIFY")?,
            own_sha256: switch("RELAY_OWN_SHA256")?,
            perfmap: switch("RELAY_PERFMAP")?,
            component: path("RELAY_COMPONENT"),
            native_required: switch("RELAY_NATIVE_REQUIRED")?,
            node_thread: switch("RELAY_NODE_THREAD")?,
        })
    }
}

/// The knobs of this process's environment, read once. A host checks
/// [`Tuning::from_env`] at start and refuses to start on a malformed value; after that,
/// this cannot fail (a malformed value would read as the defaults).
pub fn tuning() -> &'static Tuning {
    static TUNING: std::sync::OnceLock<Tuning> = std::sync::OnceLock::new();
    TUNING.get_or_init(|| {
        Tuning::from_env().unwrap_or_else(|_| Tuning::from_lookup(|_| None).expect("defaults"))
    })
}

/// The table as JSON (`pkg/tuning.json`): the Node host reads its knobs by it.
pub fn knobs_json() -> String {
    let knobs: Vec<serde_json::Value> = KNOBS
        .iter()
        .map(|k| {
            serde_json::json!({
                "name": k.name,
                "kind": k.kind.name(),
                "default": k.default,
                "hosts": k.hosts,
                "doc": k.doc,
            })
        })
        .collect();
    serde_json::to_string_pretty(&knobs).expect("plain JSON") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Tuning, String> {
        Tuning::from_lookup(|n| {
            pairs
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_knobs_read_as_their_defaults_and_set_ones_as_given() {
        let d = with(&[]).unwrap();
        assert!(d.preverify && d.node_thread);
        assert!(!d.own_verify && !d.own_sha256 && !d.perfmap && !d.native_required);
        assert_eq!((d.group_commit, d.component), (None, None));
        let t = with(&[
            ("RELAY_PREVERIFY", "0"),
            ("RELAY_GROUP_COMMIT", "0"),
            ("RELAY_OWN_VERIFY", "1"),
            ("RELAY_COMPONENT", "/x/core.wasm"),
            ("RELAY_NODE_THREAD", " 0 "),
        ])
        .unwrap();
        assert!(!t.preverify && t.own_verify && !t.node_thread);
        assert_eq!(t.group_commit, Some(0));
        assert_eq!(t.component, Some(PathBuf::from("/x/core.wasm")));
    }

    #[test]
    fn a_malformed_value_is_an_error_naming_the_variable() {
        let e = with(&[("RELAY_OWN_VERIFY", "yes")]).unwrap_err();
        assert_eq!(e, "RELAY_OWN_VERIFY=yes: takes 0 or 1");
        let e = with(&[("RELAY_GROUP_COMMIT", "-1")]).unwrap_err();
        assert!(e.starts_with("RELAY_GROUP_COMMIT=-1"), "{e}");
    }

    #[test]
    fn the_json_table_names_every_knob_with_its_kind() {
        let v: serde_json::Value = serde_json::from_str(&knobs_json()).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, KNOBS.iter().map(|k| k.name).collect::<Vec<_>>());
        assert_eq!(v[1]["kind"], "count");
    }

    #[test]
    fn the_readme_lists_every_knob() {
        let readme = include_str!("../../README.md");
        for k in KNOBS {
            assert!(
                readme.contains(&format!("`{}`", k.name)),
                "README: {}",
                k.name
            );
        }
    }
}
