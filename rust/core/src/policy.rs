//! Timeouts and the retry budget of SPEC section 4, with a testing seam to shrink them.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::runtime::fork_guard;

/// Every constant of the storage layer's timing. Users get `Policy::SPEC`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub max_attempts: u32,
    pub window: Duration,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    pub connect_timeout: Duration,
    pub read_inactivity_timeout: Duration,
    pub request_timeout: Duration,
    pub stream_response_deadline: Duration,
}

impl Policy {
    pub const SPEC: Policy = Policy {
        max_attempts: 64,
        window: Duration::from_secs(15 * 60),
        backoff_base: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(10),
        read_inactivity_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(10 * 60),
        stream_response_deadline: Duration::from_secs(60),
    };
}

static CURRENT: RwLock<Policy> = RwLock::new(Policy::SPEC);

/// The policy in force for new operations.
pub fn current() -> Policy {
    let _no_fork = fork_guard();
    *CURRENT.read().unwrap_or_else(|p| p.into_inner())
}

/// Replaces the policy (testing seam; see `syvain_training_data.storage.testing`).
pub fn set(policy: Policy) {
    let _no_fork = fork_guard();
    *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = policy;
}

/// Attempts and time spent without progress; any received byte resets both.
#[derive(Debug)]
pub struct Budget {
    policy: Policy,
    failed_attempts: u32,
    last_progress: Instant,
    started: Instant,
}

impl Budget {
    pub fn new(policy: Policy) -> Self {
        let now = Instant::now();
        Self {
            policy,
            failed_attempts: 0,
            last_progress: now,
            started: now,
        }
    }

    pub fn progress(&mut self) {
        self.failed_attempts = 0;
        self.last_progress = Instant::now();
    }

    pub fn failed_attempts(&self) -> u32 {
        self.failed_attempts
    }

    pub fn elapsed_without_progress(&self) -> Duration {
        self.last_progress.elapsed()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Records a failed attempt; returns the delay before the next one, or `None` when the
    /// budget is spent. The delay before attempt n is uniform in [0, min(cap, base * 2^(n-1))],
    /// never reaching past the window.
    pub fn next_delay(&mut self) -> Option<Duration> {
        self.failed_attempts += 1;
        let elapsed = self.last_progress.elapsed();
        if self.failed_attempts >= self.policy.max_attempts || elapsed >= self.policy.window {
            return None;
        }
        let next_attempt = self.failed_attempts + 1;
        let exponent = (next_attempt - 1).min(30);
        let ceiling = self
            .policy
            .backoff_base
            .saturating_mul(1u32 << exponent)
            .min(self.policy.backoff_cap);
        let delay = ceiling.mul_f64(rand::rng().random_range(0.0..=1.0));
        let remaining = self.policy.window - elapsed;
        Some(delay.min(remaining))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast() -> Policy {
        Policy {
            max_attempts: 4,
            window: Duration::from_secs(60),
            backoff_base: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(30),
            ..Policy::SPEC
        }
    }

    #[test]
    fn budget_gives_up_after_max_attempts_without_progress() {
        let mut budget = Budget::new(fast());
        assert!(budget.next_delay().is_some());
        assert!(budget.next_delay().is_some());
        assert!(budget.next_delay().is_some());
        assert!(budget.next_delay().is_none());
        assert_eq!(budget.failed_attempts(), 4);
    }

    #[test]
    fn progress_resets_the_attempts() {
        let mut budget = Budget::new(fast());
        for _ in 0..3 {
            budget.next_delay().unwrap();
        }
        budget.progress();
        assert_eq!(budget.failed_attempts(), 0);
        assert!(budget.next_delay().is_some());
    }

    #[test]
    fn delays_stay_under_the_exponential_ceiling_and_the_cap() {
        let mut budget = Budget::new(Policy {
            max_attempts: 100,
            ..fast()
        });
        let first = budget.next_delay().unwrap();
        assert!(first <= Duration::from_millis(20), "{first:?}");
        for _ in 0..20 {
            assert!(budget.next_delay().unwrap() <= Duration::from_millis(30));
        }
    }

    #[test]
    fn spec_defaults() {
        let p = Policy::SPEC;
        assert_eq!(p.max_attempts, 64);
        assert_eq!(p.window, Duration::from_secs(900));
        assert_eq!(p.backoff_cap, Duration::from_secs(30));
    }
}
