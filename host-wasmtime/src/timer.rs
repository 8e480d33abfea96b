//! Each shard's one timer: it sleeps until the core's alarm and ticks that core.

use crate::app::App;
use crate::now_ms;
use relay_core::transport::alarm::Alarm;
use std::sync::Arc;
use tokio::sync::watch;

/// Sleeps until the core's alarm ([`relay_core::transport::alarm`]), ticks it, and repeats.
pub(crate) async fn timer(app: Arc<App>, shard: u32, mut alarm: watch::Receiver<Alarm>) {
    let wake = &app.shards[shard as usize].wake;
    loop {
        let delay = alarm.borrow_and_update().delay(now_ms());
        let sleep = async {
            match delay {
                Some(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = sleep => {
                wake.send_modify(Alarm::fire);
                let metrics = app.metrics.clone();
                let ran = app.core(shard).run(move |c| {
                    let started = std::time::Instant::now();
                    let r = c.tick(now_ms());
                    metrics.tick_duration.observe(started.elapsed().as_secs_f64());
                    r
                }).await;
                // A group commit that failed armed the retry already (`run_group`).
                let (events, failed) = match ran {
                    None => (Vec::new(), None),
                    Some(None) => (Vec::new(), Some("the tick trapped".to_string())),
                    Some(Some(r)) => {
                        if r.error.is_none() {
                            wake.send_modify(Alarm::succeeded);
                        }
                        (r.events, r.error)
                    }
                };
                if let Some(why) = failed {
                    let mut wait = 0;
                    wake.send_modify(|a| wait = a.failed(now_ms()));
                    tracing::warn!("timer: {why}; ticking again in {wait} ms");
                }
                app.dispatch(shard, events);
            }
            changed = alarm.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}
