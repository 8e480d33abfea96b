//! The load generator: pre-signed message.send requests over loopback HTTP at several concurrencies.

use crate::fixture::{self, Fixture};
use crate::report::Sample;
use relay_host_wasmtime::{admin_client, AdminClient};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registers the fixture's accounts at `url` and opens their sessions; the bearer headers.
pub async fn sessions(fx: &Fixture, url: &str) -> anyhow::Result<Vec<String>> {
    let http = admin_client();
    let mut tokens = Vec::new();
    for a in &fx.accounts {
        let (s, b) = http
            .post(
                &format!("{url}/v1/account.register"),
                &[],
                a.register.clone(),
            )
            .await?;
        anyhow::ensure!(s == 200, "register: {}", String::from_utf8_lossy(&b));
        let (s, b) = http
            .post(
                &format!("{url}/v1/session.open"),
                &[],
                a.session_open.clone(),
            )
            .await?;
        anyhow::ensure!(s == 200, "session.open: {}", String::from_utf8_lossy(&b));
        let t = fixture::token(&b).ok_or_else(|| anyhow::anyhow!("no session"))?;
        tokens.push(format!("Bearer {t}"));
    }
    Ok(tokens)
}

/// One concurrency level: its sample, and the requests that failed (with the first failure).
pub struct Level {
    pub concurrency: usize,
    pub sample: Sample,
    pub failed: usize,
    pub first_failure: Option<String>,
}

/// Sends `fx.sends` to `url`, split evenly over `concurrencies` (one slice per level, never resent).
pub async fn run(fx: &Fixture, url: &str, concurrencies: &[usize]) -> anyhow::Result<Vec<Level>> {
    let tokens = Arc::new(sessions(fx, url).await?);
    let per = fx.sends.len() / concurrencies.len().max(1);
    // One client for every level: later levels find their connections open.
    let http = Arc::new(admin_client());
    let mut out = Vec::new();
    for (level, &c) in concurrencies.iter().enumerate() {
        let msgs = fx.sends[level * per..(level + 1) * per].to_vec();
        out.push(self::level(&http, msgs, &tokens, url, c).await?);
    }
    Ok(out)
}

/// Sends `msgs` (sender index, params) to `url` from `c` clients at once, under the senders' `tokens`.
pub async fn level(
    http: &Arc<AdminClient>,
    msgs: Vec<(usize, Vec<u8>)>,
    tokens: &Arc<Vec<String>>,
    url: &str,
    c: usize,
) -> anyhow::Result<Level> {
    let msgs = Arc::new(msgs);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..c {
        let (http, msgs, next, tokens) = (http.clone(), msgs.clone(), next.clone(), tokens.clone());
        let target = format!("{url}/v1/message.send");
        workers.push(tokio::spawn(async move {
            let mut lat: Vec<Duration> = Vec::new();
            let mut failures: Vec<String> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= msgs.len() {
                    return (lat, failures);
                }
                let (s, body) = &msgs[i];
                let t = Instant::now();
                // A failed request is counted, never retried: only accepted sends make the rate.
                match http
                    .post(&target, &[("authorization", &tokens[*s])], body.clone())
                    .await
                {
                    // Accepted: ended at once (a local delivery) or under way (a delivery to
                    // a sibling shard or another relay).
                    Ok((200, b))
                        if matches!(
                            fixture::status(&b).as_deref(),
                            Some("target_accepted" | "delivering")
                        ) =>
                    {
                        lat.push(t.elapsed())
                    }
                    Ok((status, b)) => failures.push(format!(
                        "message.send: {status} {}",
                        String::from_utf8_lossy(&b)
                    )),
                    Err(e) => failures.push(format!("{e}")),
                }
            }
        }));
    }
    let mut lat = Vec::new();
    let mut failures = Vec::new();
    for w in workers {
        let (l, f) = w.await?;
        lat.extend(l);
        failures.extend(f);
    }
    Ok(Level {
        concurrency: c,
        sample: Sample::new("message.send", lat, started.elapsed()),
        failed: failures.len(),
        first_failure: failures.into_iter().next(),
    })
}
