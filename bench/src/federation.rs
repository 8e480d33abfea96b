//! Federation (issue 47): two relays of one host over loopback, and one mixed pair.
//!
//! In one sitting, for each pair: 16 senders at A send `sends` messages (32 clients at
//! once, signed before the clock starts) to 16 discoverable recipients at B, timed from
//! the first send until B counts them all received (its `relay_messages_accepted_total
//! {kind="received"}`); beside it, the same number of sends delivered locally at A, timed
//! until A answered them all. The federated row's note gives its ratio to the local row
//! (target: >= 0.5x). Then the latency: sends leave A at a fixed pace of half the
//! federated rate (open loop, not as fast as A answers), and each message's
//! `target_accepted_at - accepted_at` from A's status (both relays' own clocks) gives the
//! percentiles (target: p99 <= 25 ms).
//!
//! Each pair runs twice: batched (relays as they ship) and single (`--policy max_batch=1`
//! on both, every delivery its own `message.deliver`), so the batch decision rests on
//! figures of one sitting.

use crate::fixture::Federation;
use crate::hosts::Host;
use crate::loadgen;
use crate::report::{Report, Sample};
use relay_host_wasmtime::admin_client;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Clients at once in the throughput runs.
const CONCURRENCY: usize = 32;
/// Sends of the unmeasured warm-up of each pair (both ways of delivering), at most.
const WARM_UP: usize = 400;
/// How long the paced latency run sends for: a second per 2,000 sends of the throughput
/// runs, between one and four.
fn paced_for(sends: usize) -> Duration {
    Duration::from_secs_f64((sends as f64 / 2000.0).clamp(1.0, 4.0))
}

/// The pairs measured: (name, A's host, B's host).
pub const PAIRS: [(&str, &str, &str); 4] = [
    ("wasmtime", "wasmtime", "wasmtime"),
    ("node", "node", "node"),
    ("edge", "edge", "edge"),
    ("mixed node -> wasmtime", "node", "wasmtime"),
];

/// The setup name of a pair's rows.
pub fn setup(pair: &str, mode: &str) -> String {
    format!("federation {pair}, {mode}")
}

/// Starts a host of `kind` for the federation part.
async fn start(
    kind: &str,
    root: &Path,
    exe: &Path,
    dir: &Path,
    flags: &[&str],
) -> anyhow::Result<Host> {
    match kind {
        "wasmtime" => Host::wasmtime_with(exe, dir, flags).await,
        "node" => Host::node_with(root, dir, flags).await,
        _ => Host::edge_with(root, dir, flags).await,
    }
}

/// Every pair (a host skipped skips its pairs), batched and single.
pub async fn run(
    rep: &mut Report,
    root: &Path,
    exe: &Path,
    scratch: &Path,
    skip: &[String],
    sends: usize,
) -> anyhow::Result<()> {
    for (pair, ka, kb) in PAIRS {
        if skip.iter().any(|s| s == ka || s == kb) {
            continue;
        }
        for (mode, flags) in [
            ("batched", &[][..]),
            ("single", &["--policy", "max_batch=1"][..]),
        ] {
            let dir = |side: &str| scratch.join(format!("federation-{ka}-{kb}-{mode}-{side}"));
            let a = start(ka, root, exe, &dir("a"), flags).await?;
            let b = start(kb, root, exe, &dir("b"), flags).await?;
            let measured = pair_run(rep, &a, &b, pair, mode, sends).await;
            a.stop();
            b.stop();
            measured?;
        }
    }
    Ok(())
}

/// One pair, one mode: the local row, the federated row (with its ratio), the latency row.
async fn pair_run(
    rep: &mut Report,
    a: &Host,
    b: &Host,
    pair: &str,
    mode: &str,
    sends: usize,
) -> anyhow::Result<()> {
    let name = setup(pair, mode);
    eprintln!("{name}");
    let http = Arc::new(admin_client());
    let mut fx = Federation::new(&a.url, &b.url, 47);
    let tokens = Arc::new(loadgen::open(&fx.at_a, &a.url).await?);
    loadgen::open(&fx.at_b, &b.url).await?;
    for route in &fx.routes {
        let (s, body) = http
            .post(&format!("{}/v1/route.publish", a.url), &[], route.clone())
            .await?;
        anyhow::ensure!(
            s == 200,
            "route.publish: {}",
            String::from_utf8_lossy(&body)
        );
    }
    // Unmeasured first: both relays' code warm, their connections to each other open.
    let warm_up = WARM_UP.min(sends / 2).max(1);
    for far in [false, true] {
        let warm = fx.sends(warm_up, far);
        let l = loadgen::level(&http, warm, &tokens, &a.url, CONCURRENCY).await?;
        anyhow::ensure!(l.failed == 0, "{name} warm-up: {:?}", l.first_failure);
    }
    wait_received(b, warm_up as u64, Duration::from_secs(120)).await?;

    let local = fx.sends(sends, false);
    let l = loadgen::level(&http, local, &tokens, &a.url, CONCURRENCY).await?;
    anyhow::ensure!(l.failed == 0, "{name} local: {:?}", l.first_failure);
    let local_rate = l.sample.per_s;
    rep.add(&name, "sqlite", Some(CONCURRENCY), l.sample);
    if let Some(row) = rep.rows.last_mut() {
        row.note = "local at A (the federated row's baseline)".to_string();
        row.sample.op = "message.send, local".into();
    }

    let far = fx.sends(sends, true);
    let before = received(b).await?;
    let started = Instant::now();
    let l = loadgen::level(&http, far, &tokens, &a.url, CONCURRENCY).await?;
    anyhow::ensure!(l.failed == 0, "{name} federated: {:?}", l.first_failure);
    let accepted_rate = l.sample.per_s;
    wait_received(b, before + sends as u64, Duration::from_secs(300)).await?;
    let wall = started.elapsed();
    let fed_rate = sends as f64 / wall.as_secs_f64();
    let mut sample = l.sample;
    sample.op = "message.send to B, until B received all".into();
    sample.per_s = fed_rate;
    rep.add(&name, "sqlite", Some(CONCURRENCY), sample);
    if let Some(row) = rep.rows.last_mut() {
        row.note = format!(
            "{:.2}x local at A (target >= 0.5x); A accepted at {accepted_rate:.0}/s",
            fed_rate / local_rate
        );
    }

    // Latency at half the federated rate: sends leave at a fixed pace.
    let rate = (fed_rate / 2.0).max(1.0);
    let n = ((rate * paced_for(sends).as_secs_f64()) as usize).clamp(100, 4000);
    let paced = fx.sends(n, true);
    let ids: Vec<(usize, String)> = paced.iter().map(|(s, p)| (*s, message_id_of(p))).collect();
    let before = received(b).await?;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for (i, (s, body)) in paced.into_iter().enumerate() {
        let at = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (http, tokens, url) = (http.clone(), tokens.clone(), a.url.clone());
        tasks.push(tokio::spawn(async move {
            http.post(
                &format!("{url}/v1/message.send"),
                &[("authorization", &tokens[s])],
                body,
            )
            .await
        }));
    }
    for t in tasks {
        let (s, body) = t.await??;
        anyhow::ensure!(
            s == 200,
            "{name} paced send: {s} {}",
            String::from_utf8_lossy(&body)
        );
    }
    let offered = n as f64 / started.elapsed().as_secs_f64();
    wait_received(b, before + n as u64, Duration::from_secs(120)).await?;
    let mut lat = Vec::with_capacity(n);
    for (s, id) in &ids {
        let mut q = relay_core::wire::json::Object::new();
        q.insert("message_id", id.as_str());
        let (st, body) = http
            .post(
                &format!("{}/v1/message.delivery.status", a.url),
                &[("authorization", &tokens[*s])],
                relay_core::wire::canonical::object_to_vec(&q),
            )
            .await?;
        anyhow::ensure!(st == 200, "status: {}", String::from_utf8_lossy(&body));
        let v = relay_core::wire::json::parse_object(&body)
            .map_err(|e| anyhow::anyhow!("status: {e:?}"))?;
        let int = |k: &str| v.get(k).and_then(|x| x.as_protocol_int());
        let (Some(at), Some(target)) = (int("accepted_at"), int("target_accepted_at")) else {
            anyhow::bail!("{name}: {id} not target_accepted: {v:?}");
        };
        lat.push(Duration::from_millis(target.saturating_sub(at)));
    }
    let sample = Sample::new(
        "acceptance at A to acceptance at B",
        lat,
        Duration::from_secs_f64(n as f64 / offered),
    );
    let p99 = sample.p99_ms;
    rep.add(&name, "sqlite", None, sample);
    if let Some(row) = rep.rows.last_mut() {
        row.note = format!(
            "offered {offered:.0}/s (half the federated rate); p99 {p99:.0} ms (target <= 25 ms)"
        );
    }
    Ok(())
}

/// The `message_id` of message.send params.
fn message_id_of(params: &[u8]) -> String {
    relay_core::wire::json::parse_object(params)
        .ok()
        .and_then(|o| {
            o.get("envelope")?
                .as_object()?
                .get("message_id")?
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// How many messages relay `h` received by `message.deliver` (its metrics, on the admin
/// listener).
async fn received(h: &Host) -> anyhow::Result<u64> {
    let admin = std::fs::read_to_string(h.dir().join("admin.url"))?;
    let (s, body) = admin_client()
        .get(&format!("{}/metrics", admin.trim()))
        .await?;
    anyhow::ensure!(s == 200, "metrics: {s}");
    let text = String::from_utf8_lossy(&body);
    Ok(text
        .lines()
        .find(|l| l.starts_with("relay_messages_accepted_total{kind=\"received\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0, |n| n as u64))
}

/// Waits until `h` received `n` messages in all.
async fn wait_received(h: &Host, n: u64, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let got = received(h).await?;
        if got >= n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < until, "received {got} of {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
