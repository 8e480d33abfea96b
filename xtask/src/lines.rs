//! `xtask lines [COMMIT]`: each host's non-blank lines by what they are for (sockets, TLS,
//! storage, timers, process, configuration), at the work tree or at a commit. The measure of
//! issue 35: a host is only its sockets, storage, timers and process life, so "other" (a
//! line no category claims) must be zero.
//!
//! A file's category is its row in [`FILES`]; a line `// lines: CATEGORY` in a file switches
//! the category of the lines after it (a file that holds two concerns says where each starts).
//! Tests (`#[cfg(test)]` modules) are not counted. A host file no row names counts as other.

use std::collections::BTreeMap;
use std::process::Command;

/// What a host's line is for.
pub const CATEGORIES: [&str; 7] = [
    "sockets",
    "TLS",
    "storage",
    "timers",
    "process",
    "configuration",
    "other",
];

/// The hosts, and the files each is made of (`dir/` takes every source file in it).
const HOSTS: [(&str, &[&str]); 4] = [
    ("wasmtime", &["host-wasmtime/src/"]),
    ("node", &["host-node/src/", "host-node/src/kit/"]),
    ("edge", &["host-node/src/edge/"]),
    ("plugin", &["tests/plugin-host/host.js"]),
];

/// Each host file's category (unless a `// lines:` marker in it says otherwise).
const FILES: &[(&str, &str)] = &[
    // wasmtime
    ("host-wasmtime/src/net.rs", "sockets"),
    ("host-wasmtime/src/server.rs", "sockets"),
    ("host-wasmtime/src/hub.rs", "sockets"),
    ("host-wasmtime/src/outbound.rs", "sockets"),
    ("host-wasmtime/src/admin_client.rs", "sockets"),
    ("host-wasmtime/src/tls.rs", "TLS"),
    ("host-wasmtime/src/store.rs", "storage"),
    ("host-wasmtime/src/timer.rs", "timers"),
    ("host-wasmtime/src/main.rs", "process"),
    ("host-wasmtime/src/lib.rs", "process"),
    ("host-wasmtime/src/app.rs", "process"),
    ("host-wasmtime/src/shard.rs", "process"),
    ("host-wasmtime/src/guest.rs", "process"),
    ("host-wasmtime/src/process.rs", "process"),
    ("host-wasmtime/src/ops.rs", "process"),
    ("host-wasmtime/src/settings.rs", "configuration"),
    // Node
    ("host-node/src/server.js", "sockets"),
    ("host-node/src/sockets.js", "sockets"),
    ("host-node/src/http.js", "sockets"),
    ("host-node/src/outbound.js", "sockets"),
    ("host-node/src/preverify.js", "sockets"),
    ("host-node/src/storage.js", "storage"),
    ("host-node/src/sqlite.js", "storage"),
    ("host-node/src/core.js", "process"),
    ("host-node/src/relay.js", "process"),
    ("host-node/src/relay-thread.js", "process"),
    ("host-node/src/relay-thread-worker.js", "process"),
    ("host-node/src/native.js", "process"),
    ("host-node/src/secrets.js", "process"),
    ("host-node/src/log.js", "process"),
    ("host-node/src/index.js", "process"),
    ("host-node/src/index.d.ts", "process"),
    ("host-node/src/kit/requests.js", "process"),
    ("host-node/src/kit/step.js", "process"),
    ("host-node/src/kit/group.js", "storage"),
    ("host-node/src/kit/outcome.js", "sockets"),
    ("host-node/src/cli.js", "configuration"),
    ("host-node/src/limits.js", "configuration"),
    ("host-node/src/tuning.js", "configuration"),
    // The client library the package also ships: not the host, so not counted.
    ("host-node/src/client.js", "-"),
    ("host-node/src/client.d.ts", "-"),
    // edge
    ("host-node/src/edge/worker.js", "sockets"),
    ("host-node/src/edge/worker.d.ts", "process"),
    ("host-node/src/edge/core.js", "process"),
    ("host-node/src/edge/store.js", "storage"),
    // plugin host
    ("tests/plugin-host/host.js", "process"),
];

fn git(args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(super::root())
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The files of a host at `commit` (none: the work tree).
fn files(parts: &[&str], commit: Option<&str>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in parts {
        let listed = match commit {
            Some(c) => git(&["ls-tree", "--name-only", c, part])?,
            None => git(&["ls-files", "--", part])?,
        };
        for f in listed.lines() {
            let inside = f.strip_prefix(part).unwrap_or(f);
            let source = [".rs", ".js", ".ts"].iter().any(|e| f.ends_with(e));
            // `dir/` takes the files directly in it; subdirectories are listed on their own.
            if source && (!part.ends_with('/') || !inside.contains('/')) {
                out.push(f.to_string());
            }
        }
    }
    Ok(out)
}

fn text(file: &str, commit: Option<&str>) -> Result<String, String> {
    match commit {
        Some(c) => git(&["show", &format!("{c}:{file}")]),
        None => {
            std::fs::read_to_string(super::root().join(file)).map_err(|e| format!("{file}: {e}"))
        }
    }
}

/// A file's non-blank lines by category, tests left out.
pub fn count(file: &str, text: &str) -> BTreeMap<&'static str, usize> {
    let mut category = FILES
        .iter()
        .find(|(f, _)| *f == file)
        .map_or("other", |(_, c)| *c);
    let mut counts = BTreeMap::new();
    let mut lines = text.lines().map(str::trim).peekable();
    while let Some(l) = lines.next() {
        if l == "#[cfg(test)]" && lines.peek().is_some_and(|n| n.starts_with("mod tests")) {
            break;
        }
        if let Some(c) = l.strip_prefix("// lines: ") {
            if let Some(known) = CATEGORIES.iter().find(|k| **k == c.trim()) {
                category = known;
                continue;
            }
        }
        if !l.is_empty() && category != "-" {
            let key = CATEGORIES
                .iter()
                .find(|k| **k == category)
                .copied()
                .unwrap_or("other");
            *counts.entry(key).or_insert(0) += 1;
        }
    }
    counts
}

/// Every host's lines by category at `commit` (none: the work tree), printed as a table.
pub fn run(commit: Option<&str>) -> Result<(), String> {
    println!(
        "host      {}   total",
        CATEGORIES
            .iter()
            .map(|c| format!("{c:>14}"))
            .collect::<String>()
    );
    for (host, parts) in HOSTS {
        let mut sum: BTreeMap<&str, usize> = BTreeMap::new();
        for f in files(parts, commit)? {
            for (c, n) in count(&f, &text(&f, commit)?) {
                *sum.entry(c).or_insert(0) += n;
            }
        }
        let total: usize = sum.values().sum();
        let row: String = CATEGORIES
            .iter()
            .map(|c| format!("{:>14}", sum.get(c).copied().unwrap_or(0)))
            .collect();
        println!("{host:<10}  {row}   {total:>5}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35's measure, kept: every line of every host is sockets, TLS, storage, timers,
    /// process or configuration. A new host file must say which (a row of `FILES`).
    #[test]
    fn no_host_line_is_other() {
        for (host, parts) in HOSTS {
            for f in files(parts, None).unwrap() {
                let counts = count(&f, &text(&f, None).unwrap());
                assert_eq!(
                    counts.get("other"),
                    None,
                    "{host}: {f} has lines of no category"
                );
            }
        }
    }

    #[test]
    fn markers_switch_the_category_and_tests_are_not_counted() {
        let text = "a\n\n// lines: timers\nb\nc\n#[cfg(test)]\nmod tests {\nd\n}\n";
        let counts = count("host-node/src/relay.js", text);
        assert_eq!(counts.get("process"), Some(&1));
        assert_eq!(counts.get("timers"), Some(&2));
        assert_eq!(count("host-node/src/new.js", "x\n").get("other"), Some(&1));
    }
}
