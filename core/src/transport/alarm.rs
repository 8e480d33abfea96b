//! The host's one timer, decided once: when the core is next ticked.
//!
//! Every host keeps one timer per core. What it is armed for is protocol behaviour (a
//! wake-up lost delays deliveries; a timer that spins burns the relay), so the rules live
//! here and a host only sleeps for [`Alarm::delay`] and reports what happened:
//! - the earliest wake-up wins. Events of calls committed in one order may be executed in
//!   another, and a wake-up too early costs one idle tick (which tells the next afresh)
//!   while one too late delays work;
//! - when the timer fires it is disarmed ([`Alarm::fire`]); the tick's own
//!   [`Event::WakeAt`](super::Event::WakeAt), and any other call's meanwhile, arm it again;
//! - a tick that trapped or could not commit, or a group commit that failed, is retried
//!   after [`RETRY_FIRST_MS`], then twice as long each time in a row up to
//!   [`RETRY_MAX_MS`], and no earlier: the timer stays armed whatever fails, and never
//!   spins. The first tick that succeeds ends the backoff;
//! - a wake-up already due still waits a millisecond.

/// The first retry of the timer after a tick or group commit that failed (ms).
pub const RETRY_FIRST_MS: u64 = 100;
/// The longest wait between two retries while failures last (ms).
pub const RETRY_MAX_MS: u64 = 10_000;

/// When a host's timer must next tick its core (times in ms since the Unix epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Alarm {
    /// The earliest wake-up asked for since the timer last fired.
    at: Option<u64>,
    /// The current retry wait (0 while nothing failed).
    backoff: u64,
    /// While failures last, no tick before this.
    not_before: u64,
}

impl Alarm {
    /// An alarm that is not armed (a host arms it with `wake_at(now)` to tick at start).
    pub fn new() -> Alarm {
        Alarm::default()
    }

    /// Arms the alarm for `at` unless it is armed for earlier; true when the deadline moved
    /// (the host re-arms its timer).
    pub fn wake_at(&mut self, at: u64) -> bool {
        match self.at {
            Some(armed) if armed <= at => false,
            _ => {
                let before = self.deadline();
                self.at = Some(at);
                self.deadline() != before
            }
        }
    }

    /// The timer fired and the host is about to tick: the alarm is disarmed until a
    /// wake-up arms it again.
    pub fn fire(&mut self) {
        self.at = None;
    }

    /// The tick (or a group commit) failed at `now`: the alarm is armed for a retry after
    /// the backoff, which doubles while failures last. Returns the wait (ms), for the log.
    pub fn failed(&mut self, now: u64) -> u64 {
        self.backoff = match self.backoff {
            0 => RETRY_FIRST_MS,
            b => b.saturating_mul(2).min(RETRY_MAX_MS),
        };
        self.not_before = now.saturating_add(self.backoff);
        self.wake_at(self.not_before);
        self.backoff
    }

    /// A tick succeeded: the backoff ends.
    pub fn succeeded(&mut self) {
        self.backoff = 0;
        self.not_before = 0;
    }

    /// When the timer must fire (ms), if it is armed: the earliest wake-up, held back
    /// while a retry's backoff runs.
    pub fn deadline(&self) -> Option<u64> {
        self.at.map(|at| at.max(self.not_before))
    }

    /// How long the host's timer sleeps from `now` (ms), if it is armed: at least 1, so a
    /// stuck core cannot make the timer spin.
    pub fn delay(&self, now: u64) -> Option<u64> {
        self.deadline().map(|d| d.saturating_sub(now).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_wake_up_wins_until_the_timer_fires() {
        let mut a = Alarm::new();
        assert_eq!(a.delay(1_000), None, "unarmed");
        assert!(a.wake_at(5_000));
        assert!(!a.wake_at(9_000), "a later wake-up does not move the timer");
        assert!(a.wake_at(2_000), "an earlier one does");
        assert!(!a.wake_at(2_000));
        assert_eq!(a.deadline(), Some(2_000));
        // A wake-up already past stays armed (it fires at once), and a later one keeps it.
        assert!(!a.wake_at(60_000));
        assert_eq!(
            a.delay(3_000),
            Some(1),
            "a due wake-up still waits a millisecond"
        );
        a.fire();
        assert_eq!(a.deadline(), None);
        assert!(
            a.wake_at(60_000),
            "after firing, the tick's own wake-up arms it"
        );
        assert_eq!(a.delay(59_000), Some(1_000));
    }

    #[test]
    fn failures_back_off_from_100_ms_doubling_to_10_s_and_a_success_ends_it() {
        let mut a = Alarm::new();
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..9 {
            a.fire();
            let w = a.failed(now);
            assert_eq!(a.deadline(), Some(now + w), "the retry is armed");
            waits.push(w);
            now += w;
        }
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000]
        );
        // While failing, an earlier wake-up (another call's) does not tick before the retry.
        a.fire();
        a.failed(now);
        assert!(!a.wake_at(now + 1));
        assert_eq!(a.deadline(), Some(now + 10_000));
        a.fire();
        a.succeeded();
        assert!(a.wake_at(now + 1));
        assert_eq!(a.deadline(), Some(now + 1), "a success ends the backoff");
        a.fire();
        assert_eq!(
            a.failed(now),
            RETRY_FIRST_MS,
            "and the next failure starts it afresh"
        );
    }

    #[test]
    fn a_failure_keeps_an_earlier_wake_up_held_back_to_the_retry() {
        let mut a = Alarm::new();
        a.wake_at(50);
        a.failed(1_000);
        assert_eq!(a.deadline(), Some(1_100));
        assert_eq!(a.delay(u64::MAX), Some(1));
    }
}
