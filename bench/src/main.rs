//! `./x bench [--quick]`: one run, one table, one JSON file.
//!
//! In one process tree and one sitting: the native floor, the engine natively
//! (memory and SQLite), the wasmtime component and the Node build in-process,
//! the three hosts over loopback HTTP driven by the load generator, and the
//! sharded hosts at 1, 2 and 4 shards (`shards.rs`), pairs of relays federating over
//! loopback beside local delivery, batched and single (`federation.rs`), and each host's memory along
//! 100,000 sends (RSS at 0, 20,000 and 100,000). Every
//! figure is also given as a ratio to the native engine measured in the
//! same run. Results go to `<target>/bench/results.json`.

mod federation;
mod fixture;
mod floor;
mod hosts;
mod inproc;
mod loadgen;
mod node;
mod report;
mod scale;
mod shards;

use relay_host_wasmtime::store::AnyStore;
use report::Report;
use std::path::{Path, PathBuf};

/// How much work each part does.
struct Sizes {
    sends: usize,
    delivers: usize,
    syncs: usize,
    http_per_level: usize,
    concurrencies: Vec<usize>,
    /// Sends of each workload at each shard count.
    shard_sends: usize,
    /// Sends of each federation pair, federated and local each.
    federation_sends: usize,
    /// Sends each host takes in the memory part (RSS at 0, a fifth of it, and all of it).
    memory_sends: usize,
    scale: scale::Scale,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                sends: 300,
                delivers: 300,
                syncs: 100,
                http_per_level: 400,
                concurrencies: vec![4, 32],
                shard_sends: 1000,
                federation_sends: 400,
                memory_sends: 10_000,
                scale: scale::Scale {
                    small: 1_000,
                    large: 5_000,
                    pending: 5_000,
                },
            }
        } else {
            Sizes {
                sends: 3000,
                delivers: 3000,
                syncs: 500,
                http_per_level: 5000,
                concurrencies: vec![1, 8, 32, 128],
                shard_sends: 6000,
                federation_sends: 8000,
                memory_sends: 100_000,
                scale: scale::Scale {
                    small: 1_000,
                    large: 100_000,
                    pending: 100_000,
                },
            }
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn inprocess(rep: &mut Report, sz: &Sizes, scratch: &Path, skip: &[String]) -> anyhow::Result<()> {
    let component = target_dir().join("component/relay_core.wasm");
    let fx = fixture::build(fixture::INPROC_RELAY, sz.sends, sz.delivers, 1);
    eprintln!("floor");
    rep.add("native floor", "-", None, floor::run(&fx)?);
    let db = |name: &str| scratch.join(format!("{name}.sqlite"));
    // The native engine and the component take turns on each storage (see
    // `inproc::run_side_by_side`), so their ratio compares like with like.
    let mut nat_mem = inproc::Native::new(inproc::memory());
    let mut nat_sql = inproc::Native::new(inproc::sqlite(&db("native"))?);
    let (mem, sql) = if skip.iter().any(|s| s == "wasmtime") {
        eprintln!("native engine, memory and sqlite");
        (
            vec![inproc::run(&mut nat_mem, &fx, sz.syncs)?],
            vec![inproc::run(&mut nat_sql, &fx, sz.syncs)?],
        )
    } else {
        let mut wasm_mem = inproc::Wasm::load(&component, AnyStore::Memory(inproc::memory()))?;
        let mut wasm_sql =
            inproc::Wasm::load(&component, AnyStore::Sqlite(inproc::sqlite(&db("wasm"))?))?;
        let mut http_mem = inproc::WasmHttp(inproc::Wasm::load(
            &component,
            AnyStore::Memory(inproc::memory()),
        )?);
        eprintln!("native engine and wasmtime component (typed call and HTTP request), memory");
        let mut mem = inproc::run_side_by_side(
            &mut [&mut nat_mem, &mut wasm_mem, &mut http_mem],
            &fx,
            sz.syncs,
        )?;
        eprintln!("native engine and wasmtime component, sqlite");
        let mut sql = inproc::run_side_by_side(&mut [&mut nat_sql, &mut wasm_sql], &fx, sz.syncs)?;
        // The fuel column: the same operations on a metered instance, untimed (metering
        // costs time; the relay runs without it). Fuel is the guest's work, whatever the storage.
        eprintln!("wasmtime component, metered for fuel");
        let mut metered =
            inproc::Wasm::load_metered(&component, AnyStore::Memory(inproc::memory()))?;
        let fuel = inproc::run(&mut metered, &fx, sz.syncs)?;
        // Index 1 of each side-by-side run is the component (the native engine is 0).
        for rows in [&mut mem[1], &mut sql[1]] {
            for (row, m) in rows.iter_mut().zip(&fuel) {
                row.fuel_per_op = m.fuel_per_op;
            }
        }
        (mem, sql)
    };
    let setups = ["native engine", "wasmtime component"];
    for (i, setup) in setups.iter().enumerate().take(sql.len()) {
        for (storage, samples) in [("memory", &mem[i]), ("sqlite", &sql[i])] {
            for s in samples {
                rep.add(setup, storage, None, s.clone());
            }
        }
    }
    // Index 2 on memory: the component through its HTTP transport (`handle`).
    for s in mem.get(2).into_iter().flatten() {
        rep.add(
            "wasmtime component, HTTP request",
            "memory",
            None,
            s.clone(),
        );
    }
    if !skip.iter().any(|s| s == "node") {
        eprintln!("node in-process");
        for (storage, s) in node::run(&root(), &fx, sz.syncs, &scratch.join("node"))? {
            rep.add(report::NODE, &storage, None, s);
        }
        // The Node build runs in its own process, so it cannot take turns with the native
        // engine: the native engine runs again right after it, and the Node rows are
        // compared with the mean of the two native runs around them.
        if !skip.iter().any(|s| s == "runtimes") {
            runtimes(rep, &fx, sz.syncs, &scratch.join("runtimes"))?;
        }
        eprintln!("native engine again, after node");
        let mut again_mem = inproc::Native::new(inproc::memory());
        let mut again_sql = inproc::Native::new(inproc::sqlite(&db("native-again"))?);
        for (storage, samples) in [
            ("memory", inproc::run(&mut again_mem, &fx, sz.syncs)?),
            ("sqlite", inproc::run(&mut again_sql, &fx, sz.syncs)?),
        ] {
            for s in samples {
                rep.add(report::NATIVE_AGAIN, storage, None, s);
            }
        }
    }
    Ok(())
}

/// The package on every runtime it is tested on: in-process send, deliver and sync in memory
/// and on each runtime's SQLite (`bun:sqlite`, `node:sqlite`, Node 20's `better-sqlite3`), and
/// Node 20 once more with the core's own wasm crypto instead of the native addon (issue 33's
/// addon decision); then the packed tarball's size.
fn runtimes(
    rep: &mut Report,
    fx: &fixture::Fixture,
    syncs: usize,
    scratch: &Path,
) -> anyhow::Result<()> {
    let root = root();
    for rt in node::Runtime::all(&root)? {
        eprintln!("{} in-process", rt.name);
        for (storage, driver, s) in node::run_on(&rt, &root, fx, syncs, scratch)? {
            let setup = match driver {
                Some(d) => format!("{} {d}", rt.name),
                None => rt.name.clone(),
            };
            rep.add(&setup, &storage, None, s);
        }
    }
    // `npm pack --dry-run` runs the package's prepack (a build that compiles nothing after
    // ./x test) and reports what `npm pack` would write.
    let out = std::process::Command::new("npm")
        .args(["pack", "--dry-run", "--json"])
        .current_dir(root.join("host-node"))
        .stderr(std::process::Stdio::null())
        .output()?;
    anyhow::ensure!(out.status.success(), "npm pack --dry-run failed");
    let packed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let p = &packed[0];
    rep.extra.push((
        "relay-node tarball".into(),
        serde_json::json!({"file": p["filename"], "bytes": p["size"], "unpacked_bytes": p["unpackedSize"], "files": p["entryCount"]}),
    ));
    Ok(())
}

/// The `relay` binary built beside this one.
fn relay_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe()?
        .parent()
        .map(|d| d.join("relay"))
        .ok_or_else(|| anyhow::anyhow!("no exe dir"))
}

async fn http(rep: &mut Report, sz: &Sizes, scratch: &Path, skip: &[String]) -> anyhow::Result<()> {
    let n = sz.http_per_level * sz.concurrencies.len();
    let exe = relay_exe()?;
    let mut hosts: Vec<(&str, hosts::Host)> = Vec::new();
    if !skip.iter().any(|s| s == "wasmtime") {
        hosts.push((
            "wasmtime host, HTTP",
            hosts::Host::wasmtime(&exe, &scratch.join("http-wasmtime")).await?,
        ));
    }
    if !skip.iter().any(|s| s == "node") {
        hosts.push((
            "node host, HTTP",
            hosts::Host::node(&root(), &scratch.join("http-node")).await?,
        ));
    }
    if !skip.iter().any(|s| s == "edge") {
        hosts.push((
            "edge host (workerd), HTTP",
            hosts::Host::edge(&root(), &scratch.join("http-edge"), 1).await?,
        ));
    }
    for (name, host) in hosts {
        eprintln!("{name}");
        let fx = fixture::build(&host.url, n, 0, 2);
        let rss_before = host.rss_kib();
        let result = loadgen::run(&fx, &host.url, &sz.concurrencies).await;
        let rss_after = host.rss_kib();
        host.stop();
        for l in result? {
            rep.add(name, "sqlite", Some(l.concurrency), l.sample);
            if let Some(f) = l.first_failure {
                let row = rep.rows.last_mut().expect("row");
                row.note = format!("{} failed, first: {f}", l.failed);
            }
        }
        rep.extra.push((
            format!("{name} anonymous RSS KiB before/after {n} sends"),
            serde_json::json!([rss_before, rss_after]),
        ));
    }
    Ok(())
}

/// The wasmtime host of this build and of others (`others`: those builds' `relay`, each
/// with its component beside it), taking turns every tenth of a level (see
/// [`loadgen::run_side_by_side`]), so their ratios are free of the machine's drift.
async fn versus_http(
    rep: &mut Report,
    sz: &Sizes,
    scratch: &Path,
    others: &[PathBuf],
) -> anyhow::Result<()> {
    let n = sz.http_per_level * sz.concurrencies.len();
    let mut exes = vec![relay_exe()?];
    exes.extend(others.iter().cloned());
    let mut running = Vec::new();
    for (i, exe) in exes.iter().enumerate() {
        running.push(hosts::Host::wasmtime(exe, &scratch.join(format!("versus-{i}"))).await?);
    }
    let fxs: Vec<_> = running
        .iter()
        .map(|h| fixture::build(&h.url, n, 0, 2))
        .collect();
    eprintln!("wasmtime host, this build and {others:?}, side by side");
    let pairs: Vec<_> = fxs
        .iter()
        .zip(&running)
        .map(|(f, h)| (f, h.url.as_str()))
        .collect();
    let levels = loadgen::run_side_by_side(&pairs, &sz.concurrencies, 10).await;
    for h in running {
        h.stop();
    }
    let mut names = vec!["wasmtime host, HTTP".to_string()];
    names.extend(others.iter().map(|o| format!("versus {}", o.display())));
    for (name, levels) in names.iter().zip(levels?) {
        for l in levels {
            rep.add(name, "sqlite", Some(l.concurrency), l.sample);
            if let Some(f) = l.first_failure {
                let row = rep.rows.last_mut().expect("row");
                row.note = format!("{} failed, first: {f}", l.failed);
            }
        }
    }
    Ok(())
}

/// Accepted messages per round of the soak (at most): signed while the host waits, then sent at c=32.
const SOAK_ROUND: usize = 20_000;

/// The memory part: each host over HTTP takes `total` sends at c=32 in at least five rounds
/// (of at most 20,000) on one database; its anonymous RSS after each round shows whether
/// memory grows with them.
async fn soak(
    rep: &mut Report,
    scratch: &Path,
    skip: &[String],
    total: usize,
) -> anyhow::Result<()> {
    let exe = relay_exe()?;
    for (part, name) in [
        ("wasmtime", "wasmtime host, HTTP"),
        ("node", "node host, HTTP"),
        ("edge", "edge host, HTTP"),
    ] {
        if skip.iter().any(|s| s == part) {
            continue;
        }
        let host = match part {
            "wasmtime" => hosts::Host::wasmtime(&exe, &scratch.join("soak-wasmtime")).await?,
            "node" => hosts::Host::node(&root(), &scratch.join("soak-node")).await?,
            _ => hosts::Host::edge(&root(), &scratch.join("soak-edge"), 1).await?,
        };
        let rounds = soak_rounds(&host, name, total).await;
        host.stop();
        let (along, rates) = rounds?;
        // The memory part's line: RSS at 0, after the first round, and at the end.
        let mb = |i: usize| {
            along
                .get(i)
                .and_then(|(_, k)| *k)
                .map(|k| k as f64 / 1024.0)
        };
        if let (Some(start), Some(first), Some(end)) = (mb(0), mb(1), mb(along.len() - 1)) {
            let first_n = along[1].0;
            rep.extra.push((
                format!("memory: {name} anonymous RSS MB at 0 / {first_n} / {total} sends"),
                serde_json::json!(format!(
                    "{start:.0} / {first:.0} / {end:.0} (x{:.2} to {first_n}, x{:.2} from {first_n} to {total}; target: growth <= 1.3x, flat after)",
                    first / start,
                    end / first
                )),
            ));
        }
        rep.extra.push((
            format!("soak: {name} anonymous RSS KiB along {total} sends at c=32, [accepted, KiB]"),
            serde_json::json!(along),
        ));
        rep.extra.push((
            format!("soak: {name} send/s of each round of {SOAK_ROUND}"),
            serde_json::json!(rates),
        ));
    }
    Ok(())
}

/// The soak's rounds against one host: its anonymous RSS after each, and each round's rate.
async fn soak_rounds(
    host: &hosts::Host,
    name: &str,
    total: usize,
) -> anyhow::Result<(Vec<(usize, Option<u64>)>, Vec<f64>)> {
    let mut fx = fixture::build(&host.url, 0, 0, 3);
    let tokens = std::sync::Arc::new(loadgen::sessions(&fx, &host.url).await?);
    let http = std::sync::Arc::new(relay_host_wasmtime::admin_client());
    let mut along = vec![(0, host.rss_kib())];
    let mut rates = Vec::new();
    let mut sent = 0;
    // Five rounds at least, so the first checkpoint is at a fifth of the total.
    let round = SOAK_ROUND.min(total.div_ceil(5)).max(1);
    while sent < total {
        let n = round.min(total - sent);
        let msgs = fx.more_sends(n, None);
        let l = loadgen::level(&http, msgs, &tokens, &host.url, 32).await?;
        anyhow::ensure!(
            l.failed == 0,
            "{name} soak: {} failed, first: {:?}",
            l.failed,
            l.first_failure
        );
        sent += n;
        let rss = host.rss_kib();
        along.push((sent, rss));
        rates.push(l.sample.per_s.round());
        eprintln!(
            "  {name}: {sent} accepted, {:.0}/s, anonymous RSS {rss:?} KiB",
            l.sample.per_s
        );
    }
    Ok((along, rates))
}

/// The scale-out targets (issue 34) beside what this run measured, as lines of the table:
/// the edge host against the wasmtime host, p99 at c=128, shards against one shard.
fn targets(rep: &mut Report) {
    let row = |setup: &str, c: usize| {
        rep.rows
            .iter()
            .find(|r| r.setup == setup && r.concurrency == Some(c))
            .map(|r| (r.sample.per_s, r.sample.p99_ms))
    };
    let (wasmtime, node, edge) = (
        "wasmtime host, HTTP",
        "node host, HTTP",
        "edge host (workerd), HTTP",
    );
    let mut lines = Vec::new();
    if let (Some((w, _)), Some((e, _))) = (row(wasmtime, 32), row(edge, 32)) {
        lines.push((
            "target: edge / wasmtime host, HTTP c=32 msg/s".to_string(),
            format!("{:.2}x (target >= 0.5x)", e / w),
        ));
    }
    for (setup, want) in [(wasmtime, 100.0), (node, f64::NAN), (edge, 200.0)] {
        if let Some((_, p99)) = row(setup, 128) {
            let target = if want.is_nan() {
                "no target".to_string()
            } else {
                format!("target <= {want:.0} ms")
            };
            lines.push((
                format!("target: {setup} c=128 p99"),
                format!("{p99:.0} ms ({target})"),
            ));
        }
    }
    for host in ["wasmtime", "edge"] {
        for workload in ["self", "mesh"] {
            let of = |shards: u32| {
                let s = if shards == 1 { "shard" } else { "shards" };
                row(&format!("{host} host, HTTP, {shards} {s}, {workload}"), 32).map(|r| r.0)
            };
            if let (Some(one), Some(two), Some(four)) = (of(1), of(2), of(4)) {
                lines.push((
                    format!("target: {host} shards 1 / 2 / 4, {workload}, msg/s"),
                    format!(
                        "{one:.0} / {two:.0} ({:.2}x) / {four:.0} ({:.2}x) (target: each >= 0.9x of 1 shard)",
                        two / one,
                        four / one
                    ),
                ));
            }
        }
    }
    for (pair, _, _) in federation::PAIRS {
        for mode in ["batched", "single"] {
            let name = federation::setup(pair, mode);
            let of = |op: &str| {
                rep.rows
                    .iter()
                    .find(|r| r.setup == name && r.sample.op.starts_with(op))
                    .map(|r| r.sample.clone())
            };
            if let (Some(local), Some(fed), Some(lat)) = (
                of("message.send, local"),
                of("message.send to B"),
                of("acceptance at A"),
            ) {
                lines.push((
                    format!("target: {name}: federated / local msg/s, p99 at half rate"),
                    format!(
                        "{:.0} / {:.0} = {:.2}x (target >= 0.5x); p99 {:.0} ms (target <= 25 ms)",
                        fed.per_s,
                        local.per_s,
                        fed.per_s / local.per_s,
                        lat.p99_ms
                    ),
                ));
            }
        }
    }
    if let Some(r) = rep
        .rows
        .iter()
        .find(|r| r.sample.op.starts_with("admin.destinations page"))
    {
        lines.push((
            format!("target: {} p99 (wasmtime component)", r.sample.op),
            format!("{:.2} ms (target < 50 ms)", r.sample.p99_ms),
        ));
    }
    for (k, v) in lines {
        rep.extra.push((k, serde_json::json!(v)));
    }
}

/// What a run was asked for on the command line.
struct Args {
    quick: bool,
    skip: Vec<String>,
    concurrency: Option<Vec<usize>>,
    scale_large: Option<usize>,
    soak: Option<usize>,
    versus: Option<Vec<PathBuf>>,
    out: Option<PathBuf>,
}

const USAGE: &str =
    "usage: ./x bench [--quick] [--skip inprocess,http,node,runtimes,wasmtime,edge,shards,federation,scale,memory] \
[--concurrency 8,32,128] [--scale-large N] [--soak N] [--versus OTHER_RELAY,...] [--out DIR]";

/// Parses the flags; anything unknown or malformed is an error, never a silent full run.
fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        skip: Vec::new(),
        concurrency: None,
        scale_large: None,
        soak: None,
        versus: None,
        out: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--quick" => a.quick = true,
            "--skip" => {
                a.skip = value()?.split(',').map(str::to_string).collect();
                if let Some(bad) = a.skip.iter().find(|s| {
                    ![
                        "inprocess",
                        "http",
                        "node",
                        "runtimes",
                        "wasmtime",
                        "edge",
                        "shards",
                        "federation",
                        "scale",
                        "memory",
                    ]
                    .contains(&s.as_str())
                }) {
                    return Err(format!("--skip: unknown part {bad:?}"));
                }
            }
            "--concurrency" => {
                let list = value()?
                    .split(',')
                    .map(|c| c.parse::<usize>().ok().filter(|&c| c > 0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or("--concurrency takes positive integers, comma-separated")?;
                a.concurrency = Some(list);
            }
            "--scale-large" => {
                a.scale_large = Some(
                    value()?
                        .parse()
                        .map_err(|_| "--scale-large takes a count of records")?,
                );
            }
            "--soak" => {
                a.soak = Some(
                    value()?
                        .parse()
                        .map_err(|_| "--soak takes a count of messages")?,
                );
            }
            "--versus" => a.versus = Some(value()?.split(',').map(PathBuf::from).collect()),
            "--out" => a.out = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let Args {
        quick,
        skip,
        concurrency,
        scale_large,
        soak: soak_total,
        versus,
        out,
    } = match parse_args(&raw) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("relay-bench: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let mut sz = Sizes::new(quick);
    // `--concurrency 32,128`: only these HTTP levels (for profiling one).
    if let Some(list) = concurrency {
        sz.concurrencies = list;
    }
    let out = out.unwrap_or_else(|| target_dir().join("bench"));
    // One scratch directory per run, so two runs never remove each other's databases;
    // those of runs no longer alive (stopped before cleaning up) are removed.
    let scratches = out.join("scratch");
    for e in std::fs::read_dir(&scratches)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name();
        if !Path::new("/proc").join(&name).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let scratch = scratches.join(std::process::id().to_string());
    std::fs::create_dir_all(&scratch)?;
    let load_before = load_average();
    let started = std::time::Instant::now();
    let mut rep = Report::default();
    // `--versus OTHER`: only this build's wasmtime host and another build's, side by side
    // over HTTP (a before-and-after in one sitting).
    let mut skip = skip;
    if let Some(other) = versus {
        versus_http(&mut rep, &sz, &scratch, &other).await?;
        skip = ["inprocess", "http", "shards", "federation", "scale"]
            .map(str::to_string)
            .to_vec();
    }
    if !skip.iter().any(|s| s == "inprocess") {
        inprocess(&mut rep, &sz, &scratch, &skip)?;
    }
    if !skip.iter().any(|s| s == "http") {
        http(&mut rep, &sz, &scratch, &skip).await?;
    }
    if !skip.iter().any(|s| s == "shards") {
        shards::run(
            &mut rep,
            &root(),
            &relay_exe()?,
            &scratch,
            &skip,
            sz.shard_sends,
        )
        .await?;
    }
    // Federation: pairs of relays over loopback, federated beside local (issue 47).
    if !skip.iter().any(|s| s == "federation") {
        federation::run(
            &mut rep,
            &root(),
            &relay_exe()?,
            &scratch,
            &skip,
            sz.federation_sends,
        )
        .await?;
    }
    // Memory: each host's RSS along its sends (100,000 in the full run; `--soak N` for another
    // count, e.g. 1000000).
    if !skip.iter().any(|s| s == "memory") {
        soak(
            &mut rep,
            &scratch,
            &skip,
            soak_total.unwrap_or(sz.memory_sends),
        )
        .await?;
    }
    if !skip.iter().any(|s| s == "scale") {
        let mut sc = sz.scale;
        // `--scale-large N` (e.g. 1000000): the large timeline (the tick check keeps its 100,000 pending).
        if let Some(n) = scale_large {
            sc.large = n;
        }
        let component = target_dir().join("component/relay_core.wasm");
        scale::run(&mut rep, &sc, &component, &scratch)?;
    }
    rep.link_baselines();
    targets(&mut rep);
    let mut head = serde_json::Map::new();
    head.insert("mode".into(), (if quick { "quick" } else { "full" }).into());
    head.insert("load_average_before".into(), load_before.clone().into());
    head.insert("load_average_after".into(), load_average().into());
    head.insert(
        "seconds".into(),
        serde_json::json!(started.elapsed().as_secs_f64()),
    );
    // The command that reproduces these rows, as it was given.
    head.insert(
        "command".into(),
        std::iter::once("./x bench".to_string())
            .chain(raw.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
            .into(),
    );
    std::fs::write(out.join("results.json"), rep.json(head))?;
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "relay bench ({}), load average before: {load_before}, after: {}",
        if quick { "quick" } else { "full" },
        load_average()
    );
    print!("{}", rep.table());
    println!(
        "x nat: ratio to the native engine on the same storage in this run (node rows: the mean of the native runs before and after them; HTTP rows: native message.send on SQLite)"
    );
    println!("results: {}", out.join("results.json").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn flags_are_parsed_and_anything_else_is_refused() {
        let a = parse_args(&args(
            "--quick --skip node,scale --concurrency 8,32 --out /x",
        ))
        .expect("valid");
        assert!(a.quick);
        assert_eq!(a.skip, ["node", "scale"]);
        assert_eq!(a.concurrency, Some(vec![8, 32]));
        assert_eq!(a.out.as_deref(), Some(std::path::Path::new("/x")));
        assert_eq!(
            parse_args(&args("--soak 1000000")).unwrap().soak,
            Some(1_000_000)
        );
        for bad in [
            "--help-me",
            "--skip nodes",
            "--concurrency 8,x",
            "--concurrency 0",
            "--scale-large",
            "--scale-large many",
            "--soak",
            "--soak lots",
            "full",
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad} was accepted");
        }
    }
}
