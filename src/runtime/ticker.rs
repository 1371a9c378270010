//! The epoch ticker: a thread that advances the engine's epoch every tick while guests run,
//! and sleeps on a condition variable while none does, so that an idle process (an admin,
//! which only validates modules, or an executor between runs) wakes for nothing.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Starts and stops the ticking.
#[derive(Debug, Default)]
pub(super) struct Ticker {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Runs in progress: the ticker ticks while there is one.
    running: usize,
    stop: bool,
}

/// A run in progress; the ticker may sleep again once every one is dropped.
pub(super) struct Running(Arc<Ticker>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.running = state.running.saturating_sub(1);
    }
}

impl Ticker {
    /// Spawns the thread that calls `advance` (the engine's `increment_epoch`) every `tick`
    /// while a run is in progress.
    pub(super) fn spawn(
        tick: Duration,
        advance: impl Fn() + Send + 'static,
    ) -> anyhow::Result<Arc<Ticker>> {
        let ticker = Arc::new(Ticker::default());
        let ticking = ticker.clone();
        std::thread::Builder::new().name("wasmjob-epoch".to_owned()).spawn(move || {
            while ticking.wait_for_runs() {
                #[expect(
                    clippy::disallowed_methods,
                    reason = "a dedicated OS thread, not async code"
                )]
                std::thread::sleep(tick);
                advance();
            }
        })?;
        Ok(ticker)
    }

    /// Counts a run in progress until the returned guard is dropped, and wakes the ticker.
    pub(super) fn enter(self: &Arc<Ticker>) -> Running {
        let mut state = self.state();
        state.running += 1;
        if state.running == 1 {
            self.wake.notify_one();
        }
        Running(self.clone())
    }

    /// Ends the thread.
    pub(super) fn stop(&self) {
        self.state().stop = true;
        self.wake.notify_one();
    }

    /// Blocks while no run is in progress; `false` once stopped.
    fn wait_for_runs(&self) -> bool {
        let mut state = self.state();
        while state.running == 0 && !state.stop {
            state = self.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        !state.stop
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many runs are in progress.
    #[cfg(test)]
    pub(super) fn running(&self) -> usize {
        self.state().running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_epoch_advances_only_while_a_run_is_in_progress() {
        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = ticks.clone();
        let ticker = Ticker::spawn(Duration::from_millis(1), move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
        let ticks = move || ticks.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(ticks(), 0, "the ticker ticked with nothing running");
        let running = ticker.enter();
        assert_eq!(ticker.running(), 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ticks() < 3 {
            assert!(std::time::Instant::now() < deadline, "the ticker did not tick for a run");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(running);
        assert_eq!(ticker.running(), 0);
        // The ticker parks: within a while (the tick under way may still land), the count stops.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let before = ticks();
            tokio::time::sleep(Duration::from_millis(50)).await;
            if ticks() == before {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the ticker went on after the run");
        }
        ticker.stop();
    }
}
