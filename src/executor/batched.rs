//! Blocking file work of many runs done in batches, one blocking thread at a time.
//!
//! Journaling a run's start and storing its result block on file writes and syncs. Done with a
//! blocking thread per run, a burst of runs (a thousand jobs sharing one instant) wakes
//! hundreds of threads that mostly wait on one shared sync, and the machine spends its time
//! switching between them instead of running guests. A [`Batched`] queues the items instead:
//! one task takes whatever waits, hands the whole batch to one blocking call, and answers each
//! item when it returns; items that arrive meanwhile make the next batch. So a burst costs a
//! few blocking calls and syncs, and a lone item waits for no one.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

/// The most items one blocking call takes.
const MAX_BATCH: usize = 1024;

/// A queue of items of type `T` whose work, answering `R` per item, is done in batches.
pub struct Batched<T, R> {
    queue: mpsc::UnboundedSender<(T, oneshot::Sender<R>)>,
}

impl<T: Send + 'static, R: Send + 'static> Batched<T, R> {
    /// Starts the task that runs `work` on each batch, off the async runtime. `work` answers
    /// every item of its batch, in order. The task ends when the last handle is dropped.
    pub fn start<F>(name: &'static str, work: F) -> Batched<T, R>
    where
        F: Fn(Vec<T>) -> Vec<R> + Send + Sync + 'static,
    {
        let (queue, mut items) = mpsc::unbounded_channel::<(T, oneshot::Sender<R>)>();
        let work = Arc::new(work);
        let span = tracing::info_span!("batched", work = name);
        tokio::spawn(
            async move {
                let mut batch = Vec::new();
                while items.recv_many(&mut batch, MAX_BATCH).await > 0 {
                    let (inputs, answers): (Vec<T>, Vec<oneshot::Sender<R>>) =
                        batch.drain(..).unzip();
                    let work = work.clone();
                    match tokio::task::spawn_blocking(move || work(inputs)).await {
                        Ok(results) => {
                            for (answer, result) in answers.into_iter().zip(results) {
                                // The caller may be gone (a cancelled task): nothing to tell.
                                let _ = answer.send(result);
                            }
                        }
                        // Every caller of this batch hears `None`.
                        Err(error) => tracing::error!(%error, "a batch of {name} failed"),
                    }
                }
            }
            .instrument(span),
        );
        Batched { queue }
    }

    /// Queues `item` and waits for its answer; `None` if its batch failed (a panic).
    pub async fn call(&self, item: T) -> Option<R> {
        let (answer, answered) = oneshot::channel();
        self.queue.send((item, answer)).ok()?;
        answered.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_items_are_answered_each_in_batches() {
        let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = batches.clone();
        let batched = Arc::new(Batched::start("test", move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            // Long enough that the callers queue up behind the first batch.
            #[expect(clippy::disallowed_methods, reason = "the batch's blocking thread")]
            std::thread::sleep(std::time::Duration::from_millis(20));
            items.into_iter().map(|item| item * 2).collect()
        }));
        let calls: Vec<_> = (0..500u32)
            .map(|item| {
                let batched = batched.clone();
                tokio::spawn(async move { (item, batched.call(item).await) })
            })
            .collect();
        for call in calls {
            let (item, answer) = call.await.unwrap();
            assert_eq!(answer, Some(item * 2));
        }
        let batches = batches.lock().unwrap();
        assert_eq!(batches.iter().sum::<usize>(), 500);
        assert!(batches.len() < 500, "every item had a batch of its own: {batches:?}");
    }

    #[tokio::test]
    async fn a_batch_that_panics_answers_none_and_the_next_one_works() {
        let batched = Batched::start("test", |items: Vec<u32>| {
            assert!(!items.contains(&0), "zero");
            items
        });
        assert_eq!(batched.call(0).await, None);
        assert_eq!(batched.call(7).await, Some(7));
    }
}
