//! The process around the relay: its data directory and secrets on disk, and its descriptor limit.

use crate::settings;
use crate::store;
use anyhow::Context;

/// Writes `text` to `path` whole (a reader sees the old file or the new one), mode 0600.
pub(crate) fn write_whole(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f =
        store::private_file(&tmp, true).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A secret of `len` bytes kept in `path` (base64url): read when the file is there, made
/// (mode 0600, never over an existing file) only when it is absent. Any other failure stops
/// the start with a message naming the file: a relay never replaces its key or token
/// because it could not read them.
pub fn load_or_create_secret(path: &std::path::Path, len: usize) -> anyhow::Result<Vec<u8>> {
    const FIX: &str = "fix it or move it away (a new one is made only when the file is absent)";
    match std::fs::read(path) {
        Ok(raw) => {
            let text = std::str::from_utf8(&raw).unwrap_or("").trim();
            match relay_core::wire::base64url::decode(text) {
                Some(bytes) if bytes.len() == len && !text.is_empty() => Ok(bytes),
                _ => anyhow::bail!(
                    "{}: malformed: it must hold {len} bytes in base64url; {FIX}",
                    path.display()
                ),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            let mut b = vec![0u8; len];
            getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("OS random source: {e}"))?;
            let mut f = store::private_file(path, true)
                .with_context(|| format!("{}: cannot create it", path.display()))?;
            f.write_all(relay_core::wire::base64url::encode(&b).as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("{}: cannot write it", path.display()))?;
            Ok(b)
        }
        Err(e) => anyhow::bail!("{}: cannot read it ({e}); {FIX}", path.display()),
    }
}

/// Warns about a data directory or secret that others can read (made by an older relay, or
/// by hand): new ones are made 0700 and 0600, existing ones are left as they are.
pub(crate) fn warn_open(dir: &std::path::Path) {
    #[cfg(unix)]
    for (name, max) in [
        (".", 0o700),
        ("relay.key", 0o600),
        ("admin.token", 0o600),
        ("relay.sqlite", 0o600),
    ] {
        use std::os::unix::fs::PermissionsExt;
        let file = if name == "." {
            dir.to_path_buf()
        } else {
            dir.join(name)
        };
        if let Ok(m) = std::fs::metadata(&file) {
            let mode = m.permissions().mode() & 0o777;
            if mode & !max & 0o077 != 0 {
                tracing::warn!(
                    "{} is open to others (mode {mode:o}); chmod {max:o} it",
                    file.display()
                );
            }
        }
    }
}

/// Raises the soft limit on open files to the hard one (as Node does at start), and warns
/// when the connection caps do not fit under it: beyond the limit `accept` fails and the
/// relay takes nothing until connections close.
pub(crate) fn raise_descriptor_limit(limits: &settings::Limits) {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                return;
            }
            if l.rlim_cur < l.rlim_max {
                let want = libc::rlimit {
                    rlim_cur: l.rlim_max,
                    rlim_max: l.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    l.rlim_cur = l.rlim_max;
                }
            }
        }
        // Both listeners at their caps, plus outbound connections, the store and the rest.
        let needed = limits.max_connections.saturating_mul(2).saturating_add(256);
        // rlim_t is u64 here, not everywhere.
        #[allow(clippy::unnecessary_cast)]
        let have = l.rlim_cur as u64;
        if have < needed {
            tracing::warn!(
                "open files are limited to {}: with --max-connections {} on each listener the relay may run out of descriptors; lower it or raise the limit (ulimit -n)",
                l.rlim_cur,
                limits.max_connections
            );
        }
    }
}

/// Creates the data directory (and its parents) with mode 0700: it holds the relay's key.
pub(crate) fn create_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}
