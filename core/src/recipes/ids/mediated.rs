//! The in-process mediator with group commit: [`MediatedIds`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::answers::copy_error;
use super::{check_block, MajorityIds, MAX_BLOCK, RECIPE};
use crate::clock::timeout_at;
use crate::error::{Error, Result};

/// The in-process mediator the seed suggests, with group commit: callers that arrive while a
/// majority round is in flight wait together, and the next round takes one block of IDs for all
/// of them ([`MajorityIds::next_block`]), handed out in their order of arrival. The callers of
/// one process never make each other's proposals lose, and `k` waiting callers cost one round
/// instead of `k`. Calls from other processes still contend as usual.
///
/// Linearizable: the `k` calls served by one round all overlapped it (each was waiting when it
/// started and is answered after it ended), so any order among them is allowed, and every ID
/// of the block is greater than every ID returned before the round started, which includes
/// every call that completed before any of the `k` started.
#[derive(Debug)]
pub struct MediatedIds {
    ids: MajorityIds,
    /// Held by the caller running a round.
    turn: tokio::sync::Mutex<()>,
    /// The most callers one round serves: [`MediatedIds::MAX_BATCH`], or 1 for
    /// [`MediatedIds::one_at_a_time`].
    batch: usize,
    /// The callers waiting for an ID, oldest first.
    queue: std::sync::Mutex<std::collections::VecDeque<Waiter>>,
}

/// A caller of [`MediatedIds::next_block`] waiting for its IDs.
#[derive(Debug)]
struct Waiter {
    deadline: Duration,
    count: i64,
    reply: tokio::sync::oneshot::Sender<Result<std::ops::RangeInclusive<i64>>>,
}

impl MediatedIds {
    /// The most callers one round serves.
    pub const MAX_BATCH: usize = 4096;

    /// Mediates the calls of `ids`, with group commit.
    pub fn new(ids: MajorityIds) -> Self {
        MediatedIds {
            ids,
            turn: tokio::sync::Mutex::new(()),
            batch: Self::MAX_BATCH,
            queue: std::sync::Mutex::default(),
        }
    }

    /// Mediates the calls of `ids` without group commit: the callers take turns, one majority
    /// round each, in their order of arrival: the seed's plain mediator, the baseline that group
    /// commit is measured against.
    pub fn one_at_a_time(ids: MajorityIds) -> Self {
        MediatedIds {
            batch: 1,
            ..MediatedIds::new(ids)
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Waiter>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`MajorityIds::next`], mediated: the ID comes from the next round after the call, which
    /// serves every caller waiting when it starts. The deadline runs from the call, waiting
    /// included: a caller queued behind a slow round fails closed within its own deadline.
    pub async fn next(&self) -> Result<i64> {
        self.next_range(1).await.map(|ids| *ids.start())
    }

    /// [`MajorityIds::next_block`], mediated: the block is part of the next round's, which
    /// serves every caller waiting when it starts.
    pub async fn next_block(&self, count: u64) -> Result<std::ops::RangeInclusive<i64>> {
        check_block(count)?;
        self.next_range(count).await
    }

    async fn next_range(&self, count: u64) -> Result<std::ops::RangeInclusive<i64>> {
        let count = i64::try_from(count).unwrap_or(1);
        let deadline = self.ids.config.clock.monotonic() + self.ids.config.deadline;
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        self.queue().push_back(Waiter {
            deadline,
            count,
            reply,
        });
        loop {
            tokio::select! {
                biased;
                got = &mut answer => {
                    if let Ok(got) = got {
                        return got;
                    }
                    // The caller running the round that took this call was cancelled (its
                    // IDs, if stored, are holes): wait for another.
                    let (reply, again) = tokio::sync::oneshot::channel();
                    answer = again;
                    self.queue().push_back(Waiter {
                        deadline,
                        count,
                        reply,
                    });
                }
                turn = timeout_at(self.ids.config.clock.as_ref(), deadline, self.turn.lock()) => {
                    let Some(_turn) = turn else {
                        self.ids.stats.failures.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::Unavailable {
                            backend: RECIPE,
                            message: format!(
                                "no round within {:?}: the rounds ahead of this call took the whole deadline",
                                self.ids.config.deadline
                            ),
                            source: None,
                        });
                    };
                    // This caller runs the next round, for everyone waiting (itself included,
                    // unless an earlier round served it meanwhile: the answer is then ready).
                    self.round().await;
                }
            }
        }
    }

    /// One round for the callers waiting now (at most [`MediatedIds::MAX_BATCH`]).
    async fn round(&self) {
        let batch: Vec<Waiter> = {
            let mut queue = self.queue();
            queue.retain(|w| !w.reply.is_closed());
            // The oldest callers, while their IDs fit in one block (the first always does).
            let (mut n, mut k) = (0, 0i64);
            while n < self.batch.min(queue.len())
                && (n == 0 || k + queue[n].count <= MAX_BLOCK as i64)
            {
                k += queue[n].count;
                n += 1;
            }
            queue.drain(..n).collect()
        };
        let Some(deadline) = batch.iter().map(|w| w.deadline).min() else {
            return;
        };
        let k: i64 = batch.iter().map(|w| w.count).sum();
        match self.ids.next_range_until(deadline, k).await {
            Ok(ids) => {
                let mut next = *ids.start();
                for w in batch {
                    let _ = w.reply.send(Ok(next..=next + w.count - 1));
                    next += w.count;
                }
            }
            Err(e) => {
                let now = self.ids.config.clock.monotonic();
                let retryable = e.is_retryable();
                // A round that ran out of the oldest caller's time did not run out of the
                // others': they wait for the next round.
                let (fail, again): (Vec<Waiter>, Vec<Waiter>) = batch
                    .into_iter()
                    .partition(|w| !retryable || w.deadline <= now);
                let mut errors: Vec<Error> = (1..fail.len()).map(|_| copy_error(&e)).collect();
                errors.push(e);
                for (w, e) in fail.into_iter().zip(errors.into_iter().rev()) {
                    let _ = w.reply.send(Err(e));
                }
                let mut queue = self.queue();
                for w in again.into_iter().rev() {
                    queue.push_front(w);
                }
            }
        }
    }

    /// The generator behind the mediator.
    pub fn inner(&self) -> &MajorityIds {
        &self.ids
    }
}
