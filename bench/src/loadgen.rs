//! The load generator: pre-signed message.send requests over loopback HTTP at several concurrencies.

use crate::fixture::{self, Fixture};
use crate::report::Sample;
use relay_host_wasmtime::{admin_client, AdminClient};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registers the fixture's accounts at `url` and opens their sessions; the bearer headers.
pub async fn sessions(fx: &Fixture, url: &str) -> anyhow::Result<Vec<String>> {
    open(&fx.accounts, url).await
}

/// Registers `accounts` at `url` and opens their sessions; the bearer headers, in order.
pub async fn open(accounts: &[fixture::Local], url: &str) -> anyhow::Result<Vec<String>> {
    let http = admin_client();
    let mut tokens = Vec::new();
    for a in accounts {
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

/// [`run`] on several hosts at once, each with its own fixture: every level is cut into
/// `slices`, and the hosts take turns slice by slice, so each meets the same machine (on a
/// shared machine, throughput drifts by a quarter from minute to minute). One list of levels
/// per host, in the order given.
pub async fn run_side_by_side(
    hosts: &[(&Fixture, &str)],
    concurrencies: &[usize],
    slices: usize,
) -> anyhow::Result<Vec<Vec<Level>>> {
    let http = Arc::new(admin_client());
    let mut tokens = Vec::new();
    for (fx, url) in hosts {
        tokens.push(Arc::new(sessions(fx, url).await?));
    }
    let mut out: Vec<Vec<Level>> = hosts.iter().map(|_| Vec::new()).collect();
    for (level, &c) in concurrencies.iter().enumerate() {
        let mut acc: Vec<Turns> = hosts.iter().map(|_| Turns::default()).collect();
        for slice in 0..slices {
            for (h, (fx, url)) in hosts.iter().enumerate() {
                let per = fx.sends.len() / concurrencies.len().max(1);
                let mine = &fx.sends[level * per..(level + 1) * per];
                let cut = mine.len() / slices.max(1);
                let msgs = mine[slice * cut..(slice + 1) * cut].to_vec();
                let t = turn(&http, msgs, &tokens[h], url, c).await?;
                acc[h].lat.extend(t.lat);
                acc[h].failures.extend(t.failures);
                acc[h].wall += t.wall;
            }
        }
        for (h, t) in acc.into_iter().enumerate() {
            out[h].push(t.level(c));
        }
    }
    Ok(out)
}

/// The latencies of the accepted sends, the failures, and the wall time of some turns.
#[derive(Default)]
struct Turns {
    lat: Vec<Duration>,
    failures: Vec<String>,
    wall: Duration,
}

impl Turns {
    fn level(self, concurrency: usize) -> Level {
        Level {
            concurrency,
            sample: Sample::new("message.send", self.lat, self.wall),
            failed: self.failures.len(),
            first_failure: self.failures.into_iter().next(),
        }
    }
}

/// Sends `msgs` (sender index, params) to `url` from `c` clients at once, under the senders' `tokens`.
pub async fn level(
    http: &Arc<AdminClient>,
    msgs: Vec<(usize, Vec<u8>)>,
    tokens: &Arc<Vec<String>>,
    url: &str,
    c: usize,
) -> anyhow::Result<Level> {
    Ok(turn(http, msgs, tokens, url, c).await?.level(c))
}

async fn turn(
    http: &Arc<AdminClient>,
    msgs: Vec<(usize, Vec<u8>)>,
    tokens: &Arc<Vec<String>>,
    url: &str,
    c: usize,
) -> anyhow::Result<Turns> {
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
    Ok(Turns {
        lat,
        failures,
        wall: started.elapsed(),
    })
}
