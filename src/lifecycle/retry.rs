//! When a failed run's retry is due: the job's interval, grown by its backoff, capped, less a
//! jitter of up to 10 % so that the retries of many runs that failed together spread out.
//!
//! The retry run is created in the transaction that ends the failed run, `pending` and due at
//! the instant this module decides, so a restarted admin finds it waiting and sends it when it
//! is due.

use crate::model::{MAX_RETRY_INTERVAL_SECS, RetryBackoff};

/// The most a jitter takes off a retry's wait, as a fraction of the wait.
pub const MAX_JITTER: f64 = 0.1;

/// A job's retry settings (see [`crate::model::JobSpec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait before the first retry, in seconds; 0 retries at once.
    pub interval_secs: i64,
    /// How the wait grows with each further retry.
    pub backoff: RetryBackoff,
    /// The longest wait, in seconds; 0 means [`MAX_RETRY_INTERVAL_SECS`].
    pub max_interval_secs: i64,
}

impl RetryPolicy {
    /// The policy of a job that retries at once (XXL-JOB's behaviour).
    pub const IMMEDIATE: RetryPolicy =
        RetryPolicy { interval_secs: 0, backoff: RetryBackoff::Fixed, max_interval_secs: 0 };
}

/// How long (ms) retry number `attempt` (1 for the first retry) waits after the failure that
/// calls for it. `jitter` is a number in `[0, 1)` drawn by the caller: the wait is shortened by
/// `jitter` × [`MAX_JITTER`] of itself, so it never exceeds the cap. Out-of-range inputs are
/// clamped: a wait is never negative and never longer than [`MAX_RETRY_INTERVAL_SECS`].
pub fn retry_delay_ms(policy: RetryPolicy, attempt: i64, jitter: f64) -> i64 {
    let interval_ms = policy.interval_secs.clamp(0, MAX_RETRY_INTERVAL_SECS) * 1000;
    if interval_ms == 0 {
        return 0;
    }
    let cap_secs = match policy.max_interval_secs {
        secs if secs <= 0 => MAX_RETRY_INTERVAL_SECS,
        secs => secs.min(MAX_RETRY_INTERVAL_SECS),
    };
    let grown = match policy.backoff {
        RetryBackoff::Fixed => interval_ms,
        RetryBackoff::Exponential => {
            // 2^62 ms is far past any cap; a larger shift would overflow.
            let doublings = u32::try_from(attempt.saturating_sub(1).clamp(0, 62)).unwrap_or(62);
            interval_ms.saturating_mul(1_i64 << doublings)
        }
    };
    let wait = grown.min(cap_secs * 1000);
    let jitter = if jitter.is_finite() { jitter.clamp(0.0, 1.0) } else { 0.0 };
    // At most a tenth of a wait of at most a day: exact in an f64.
    let shortened = (wait as f64 * MAX_JITTER * jitter) as i64;
    wait - shortened
}

/// The instant (ms) a retry of `attempt` is due, for a failure at `failed_at_ms`.
pub fn retry_due_ms(failed_at_ms: i64, policy: RetryPolicy, attempt: i64, jitter: f64) -> i64 {
    failed_at_ms.saturating_add(retry_delay_ms(policy, attempt, jitter))
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn retry_waits() {
        let policy = |interval_secs, backoff, max_interval_secs| RetryPolicy {
            interval_secs,
            backoff,
            max_interval_secs,
        };
        use RetryBackoff::{Exponential, Fixed};
        let cases = [
            ("immediate", RetryPolicy::IMMEDIATE, 1, 0.0),
            ("immediate, any attempt and jitter", RetryPolicy::IMMEDIATE, 7, 0.9),
            ("fixed 10 s, first", policy(10, Fixed, 0), 1, 0.0),
            ("fixed 10 s, fifth", policy(10, Fixed, 0), 5, 0.0),
            ("fixed 10 s, half jitter", policy(10, Fixed, 0), 1, 0.5),
            ("fixed 10 s, jitter near 1", policy(10, Fixed, 0), 1, 0.999_999),
            ("fixed past its cap", policy(60, Fixed, 30), 1, 0.0),
            ("exponential 10 s, first", policy(10, Exponential, 0), 1, 0.0),
            ("exponential 10 s, second", policy(10, Exponential, 0), 2, 0.0),
            ("exponential 10 s, fourth", policy(10, Exponential, 0), 4, 0.0),
            ("exponential 10 s, capped at 60 s", policy(10, Exponential, 60), 4, 0.0),
            ("exponential, capped, full jitter", policy(10, Exponential, 60), 4, 1.0),
            ("exponential, no cap: a day", policy(10, Exponential, 0), 100, 0.0),
            ("exponential, attempt 0 as 1", policy(10, Exponential, 0), 0, 0.0),
            ("cap over a day is a day", policy(10, Exponential, 1_000_000), 100, 0.0),
            ("negative interval", policy(-5, Fixed, 0), 1, 0.0),
            ("jitter below 0", policy(10, Fixed, 0), 1, -3.0),
            ("jitter NaN", policy(10, Fixed, 0), 1, f64::NAN),
        ];
        let mut table = String::new();
        for (name, policy, attempt, jitter) in cases {
            let wait = retry_delay_ms(policy, attempt, jitter);
            assert!((0..=MAX_RETRY_INTERVAL_SECS * 1000).contains(&wait), "{name}: {wait}");
            table.push_str(&format!("{name:<40} attempt {attempt:>3}: {wait:>10} ms\n"));
        }
        expect![[r#"
            immediate                                attempt   1:          0 ms
            immediate, any attempt and jitter        attempt   7:          0 ms
            fixed 10 s, first                        attempt   1:      10000 ms
            fixed 10 s, fifth                        attempt   5:      10000 ms
            fixed 10 s, half jitter                  attempt   1:       9500 ms
            fixed 10 s, jitter near 1                attempt   1:       9001 ms
            fixed past its cap                       attempt   1:      30000 ms
            exponential 10 s, first                  attempt   1:      10000 ms
            exponential 10 s, second                 attempt   2:      20000 ms
            exponential 10 s, fourth                 attempt   4:      80000 ms
            exponential 10 s, capped at 60 s         attempt   4:      60000 ms
            exponential, capped, full jitter         attempt   4:      54000 ms
            exponential, no cap: a day               attempt 100:   86400000 ms
            exponential, attempt 0 as 1              attempt   0:      10000 ms
            cap over a day is a day                  attempt 100:   86400000 ms
            negative interval                        attempt   1:          0 ms
            jitter below 0                           attempt   1:      10000 ms
            jitter NaN                               attempt   1:      10000 ms
        "#]]
        .assert_eq(&table);
    }

    #[test]
    fn a_retry_is_due_its_wait_after_the_failure() {
        let policy = RetryPolicy {
            interval_secs: 5,
            backoff: RetryBackoff::Exponential,
            max_interval_secs: 0,
        };
        assert_eq!(retry_due_ms(1_000, policy, 3, 0.0), 21_000);
        assert_eq!(retry_due_ms(i64::MAX - 1, policy, 3, 0.0), i64::MAX);
        // Jitter only shortens: many retries of one failure spread over the last tenth.
        let waits: Vec<i64> =
            (0..10).map(|i| retry_delay_ms(policy, 1, f64::from(i) / 10.0)).collect();
        assert_eq!(waits.first(), Some(&5_000));
        assert!(waits.windows(2).all(|w| w[1] < w[0]));
        assert!(waits.iter().all(|wait| (4_500..=5_000).contains(wait)));
    }
}
