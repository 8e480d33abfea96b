//! One shard's core: the thread that owns its component instance and storage, the jobs it
//! runs one commit group at a time, and the handle the async side sends them through.

use crate::guest::Core;
use crate::store::{self, AnyStore, SqliteStore};
use crate::{now_ms, ops};
use anyhow::Context;
use relay_core::engine::MemoryStore;
use relay_core::transport::alarm::Alarm;
use relay_core::transport::host_metrics::HostMetrics;
use relay_core::wire::preverify::Memory as Preverify;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{oneshot, watch};

/// Releases a job's answer once its group's commit is known: `true` if it is durable.
type Release = Box<dyn FnOnce(bool) + Send>;
/// Work for the core thread.
enum Job {
    /// A call that joins a commit group; its answer leaves once the group is durable.
    Call(Box<dyn FnOnce(&mut Core) -> Release + Send>),
    /// Work that runs alone between two groups, with nothing uncommitted (a backup).
    Alone(Box<dyn FnOnce(&mut Core) + Send>),
}

/// The most operations one group commit holds.
///
/// Small groups keep the two halves of the relay working at once: while the
/// core thread runs one group, the answers of the group before it are on
/// their way and the HTTP workers parse and pre-verify the next requests.
/// With 256, a level of 128 closed-loop clients formed one group whose
/// answers all left together, and the workers and the core thread took turns
/// (docs/performance.md: 16 gave +20% at c=32 and +4% at c=128 over 256).
pub const MAX_GROUP: usize = 16;

/// A place among the requests in the core or waiting for it (`--max-pending`); the place is
/// given back when the request and every job it queued for the core are done.
#[derive(Clone)]
pub struct Slot(#[allow(dead_code)] pub(crate) Arc<SlotPlace>);

pub(crate) struct SlotPlace(pub(crate) Arc<AtomicUsize>);

impl Drop for SlotPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A handle to the thread that owns the core.
#[derive(Clone)]
pub struct CoreHandle {
    tx: std::sync::mpsc::Sender<Job>,
}

impl CoreHandle {
    /// Runs `f` on the core thread and waits for its answer, which leaves only after its
    /// commit is durable; `None` when the commit failed (nothing it did was accepted).
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> Option<R> {
        self.run_holding(None, f).await
    }

    /// As [`CoreHandle::run`], the job holding `slot` until its answer is released (a request
    /// that went away still counts while its job waits for the core).
    pub async fn run_holding<R: Send + 'static>(
        &self,
        slot: Option<Slot>,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> Option<R> {
        let (otx, orx) = oneshot::channel();
        let job = Job::Call(Box::new(move |core| {
            let r = f(core);
            Box::new(move |durable| {
                // The place is given back before the answer wakes its request, so a caller
                // that saw the answer finds it free.
                drop(slot);
                let _ = otx.send(durable.then_some(r));
            })
        }));
        if self.tx.send(job).is_err() {
            panic!("the core thread has stopped");
        }
        orx.await.expect("the core thread dropped a job")
    }

    /// Runs `f` on the core thread between two commit groups: every call before it has
    /// committed (or been undone), none after it has started.
    pub async fn alone<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> R {
        let (otx, orx) = oneshot::channel();
        let job = Job::Alone(Box::new(move |core| {
            let _ = otx.send(f(core));
        }));
        if self.tx.send(job).is_err() {
            panic!("the core thread has stopped");
        }
        orx.await.expect("the core thread dropped a job")
    }
}

/// One shard of the relay: the thread that owns its core, and its timer's alarm.
pub struct ShardCore {
    /// The core of this shard's accounts.
    pub core: CoreHandle,
    pub(crate) wake: watch::Sender<Alarm>,
}

/// What one shard's core thread starts from.
pub(crate) struct CoreStart {
    pub(crate) index: u32,
    pub(crate) engine: wasmtime::Engine,
    pub(crate) component: std::path::PathBuf,
    /// Its SQLite file; `None`: in memory.
    pub(crate) store_path: Option<std::path::PathBuf>,
    pub(crate) config_json: String,
    pub(crate) seed: [u8; 32],
    pub(crate) admin_token: String,
    pub(crate) preverify: Option<Arc<Preverify>>,
    pub(crate) faults: Option<Arc<store::Faults>>,
    pub(crate) metrics: Arc<HostMetrics>,
    pub(crate) health: Arc<ops::Health>,
    pub(crate) wake: watch::Sender<Alarm>,
}

/// Starts the thread that owns one shard's core, and returns its handle once the core
/// loaded over its storage (or why it could not).
///
/// If the core traps and no fresh instance can be made over the storage, the relay does not
/// go on: it logs why and exits the process with status 70.
pub(crate) fn spawn_core(s: CoreStart) -> anyhow::Result<CoreHandle> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let name = match s.index {
        0 => "relay-core".to_string(),
        k => format!("relay-core-{k}"),
    };
    std::thread::Builder::new().name(name).spawn(move || {
        let store = match &s.store_path {
            Some(p) => SqliteStore::open(p)
                .map(AnyStore::Sqlite)
                .map_err(|e| anyhow::anyhow!("{e}")),
            None => Ok(AnyStore::Memory(MemoryStore::new())),
        };
        let store = match &s.faults {
            Some(f) => store.map(|st| AnyStore::Faulty(Box::new(st), f.clone())),
            None => store,
        };
        let core = store.and_then(|st| {
            Core::load(
                &s.engine,
                &s.component,
                st,
                s.config_json,
                s.seed,
                Some(s.admin_token),
            )
            .map_err(|e| anyhow::anyhow!("loading {}: {e:#}", s.component.display()))
        });
        let mut core = match core {
            Ok(mut c) => {
                c.set_preverify(s.preverify);
                c.set_faults(s.faults);
                let _ = ready_tx.send(Ok(()));
                c
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        // `RELAY_GROUP_COMMIT=0` commits each call alone and `=N` caps a group at N calls
        // (to measure what grouping and its size pay).
        let max_group = relay_settings::tuning()
            .group_commit
            .map_or(MAX_GROUP, |n| n.max(1));
        // Jobs run until every handle is gone; the last group's commit finishes first.
        let (mut traps, mut restarts) = (0, 0);
        while let Ok(job) = rx.recv() {
            match job {
                Job::Call(first) => {
                    let alone = run_group(
                        &mut core, first, &rx, max_group, &s.metrics, &s.health, &s.wake,
                    );
                    if let Some(f) = alone {
                        f(&mut core);
                    }
                }
                Job::Alone(f) => f(&mut core),
            }
            if core.traps != traps || core.restarts != restarts {
                s.metrics.traps.inc_by(core.traps - traps);
                s.metrics.restarts.inc_by(core.restarts - restarts);
                (traps, restarts) = (core.traps, core.restarts);
            }
            if core.failed() {
                s.health.set_core_failed();
                // Fail closed: without an instance over the real storage nothing can be
                // answered truthfully, so the process stops (a supervisor restarts it).
                tracing::error!(
                    "the relay core could not be restarted after a trap; exiting (status 70)"
                );
                std::process::exit(70);
            }
        }
    })?;
    ready_rx.recv().context("the core thread died")??;
    Ok(CoreHandle { tx })
}

type Alone = Box<dyn FnOnce(&mut Core) + Send>;

/// Runs `first` and every call already queued behind it (up to `max` in all) as one commit
/// group; a job that must run alone ends the group and is handed back, to run after it.
///
/// Jobs that queued while the previous group was committing share this
/// group's fsync; a lone job costs what it did before. Answers are released
/// only after the group's transaction is durable.
fn run_group(
    core: &mut Core,
    first: Box<dyn FnOnce(&mut Core) -> Release + Send>,
    rx: &std::sync::mpsc::Receiver<Job>,
    max: usize,
    metrics: &HostMetrics,
    health: &ops::Health,
    wake: &watch::Sender<Alarm>,
) -> Option<Alone> {
    core.begin_group();
    let mut releases = vec![first(core)];
    let mut alone = None;
    while releases.len() < max {
        match rx.try_recv() {
            Ok(Job::Call(job)) => releases.push(job(core)),
            Ok(Job::Alone(f)) => {
                alone = Some(f);
                break;
            }
            Err(_) => break,
        }
    }
    let writes = core.group_has_writes();
    let started = writes.then(std::time::Instant::now);
    let durable = match core.flush_group() {
        Ok(()) => true,
        Err(e) => {
            tracing::error!("group commit of {} calls failed: {e}", releases.len());
            // Whatever the group did is undone, and what it would have scheduled is not
            // known: the timer retries, as after a failed tick.
            wake.send_if_modified(|a| {
                let before = a.deadline();
                a.failed(now_ms());
                a.deadline() != before
            });
            false
        }
    };
    if let Some(t) = started {
        metrics.commit(releases.len(), t.elapsed().as_secs_f64());
        health.set_storage_ok(durable);
    }
    for r in releases {
        r(durable);
    }
    alone
}
