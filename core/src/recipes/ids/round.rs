//! One majority round of [`MajorityIds`]: read a majority, propose one ID (`set_max`) or a block
//! (`compare_and_set`), and count the answers until a majority decided.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

use super::answers::{deadline_error, Answers, Lost, Read, Summary};
use super::majority::{Known, MajorityIds, Node};
use super::{MAX_JUMP, RECIPE};
use crate::clock::timeout_at;
use crate::error::{Error, Result};
use crate::store::parse_counter;

impl MajorityIds {
    /// One round: read a majority, propose the maximum plus one to every store.
    pub(super) async fn attempt(
        &self,
        deadline: Duration,
        optimistic: bool,
    ) -> std::result::Result<i64, Lost> {
        let mut summary = Summary::default();
        let hint = self.hint.load(Ordering::Relaxed);
        let max = if optimistic && hint > 0 {
            // The largest number this generator saw: with no rival since, the majority holds
            // exactly it, and proposing one more wins in one round trip.
            hint
        } else {
            let reads = self.read_majority(deadline, &mut summary).await?;
            let max = reads.iter().map(|r| r.value).max().unwrap_or(0).max(0);
            self.hint.fetch_max(max, Ordering::Relaxed);
            max
        };
        let Some(proposal) = max.checked_add(1) else {
            return Err(Lost::Permanent(Error::Rejected {
                backend: RECIPE,
                message: format!("the ID counter `{}` reached i64::MAX", self.key),
                source: None,
            }));
        };
        let writes: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move { (i, self.write(node, proposal, deadline).await) })
            .collect();
        // Only `true` counts: see "Why it is safe" in the module docs.
        let writes = self.first_majority(writes, |wrote| *wrote).await;
        if writes.counted >= self.majority {
            self.hint.fetch_max(proposal, Ordering::Relaxed);
            return Ok(proposal);
        }
        Err(self.lost_proposal(summary, writes))
    }

    /// A proposal too few stores accepted.
    fn lost_proposal(&self, mut summary: Summary, writes: Answers<bool>) -> Lost {
        summary.accepted = writes.counted;
        summary.refused = writes.ok.len() - writes.counted;
        summary.errors = writes.errors;
        summary.unawaited = writes.unawaited;
        summary.proposed = true;
        self.lost(summary)
    }

    /// One round for a block of `k` IDs: compare-and-set every store that counts from the text
    /// it holds (as this generator last saw it when `optimistic` and it knows a majority, else
    /// read now) to `base + k`, where `base` is the largest of those values; the block
    /// `base + 1 ..= base + k` is this call's once a majority of them answered `true`.
    pub(super) async fn attempt_block(
        &self,
        deadline: Duration,
        optimistic: bool,
        k: i64,
    ) -> std::result::Result<std::ops::RangeInclusive<i64>, Lost> {
        let mut summary = Summary::default();
        // What a node is known to hold is always a number (a read that passed, or this
        // generator's own write); one that does not parse is taken as unknown.
        let known: Option<Vec<Read>> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(node, n)| match n.known() {
                Known::Holds(text) => Some((node, text)),
                Known::Unknown => None,
            })
            .map(|(node, text)| {
                let value = text
                    .as_deref()
                    .map_or(Ok(0), |t| parse_counter(&self.key, t))
                    .ok()?;
                Some(Read { node, text, value })
            })
            .collect();
        let expected = match known {
            Some(known) if optimistic && known.len() >= self.majority => known,
            _ => self.read_majority(deadline, &mut summary).await?,
        };
        let base = expected.iter().map(|r| r.value).max().unwrap_or(0).max(0);
        self.hint.fetch_max(base, Ordering::Relaxed);
        let Some(last) = base.checked_add(k) else {
            return Err(Lost::Permanent(Error::Rejected {
                backend: RECIPE,
                message: format!(
                    "the ID counter `{}` cannot grow by {k} past {base}: i64::MAX",
                    self.key
                ),
                source: None,
            }));
        };
        let new = last.to_string();
        // A store whose answer is not awaited (a majority came first) may or may not take the
        // write: this generator no longer knows what it holds.
        for r in &expected {
            self.nodes[r.node].set_known(Known::Unknown);
        }
        let writes: FuturesUnordered<_> = expected
            .into_iter()
            .map(|Read { node: i, text, .. }| {
                let node = &self.nodes[i];
                let new = new.as_str();
                async move {
                    let cas = node
                        .store
                        .compare_and_set(&self.key, text.as_deref(), new, None);
                    let answer = timeout_at(self.config.clock.as_ref(), deadline, cas)
                        .await
                        .unwrap_or_else(|| {
                            Err(deadline_error("compare_and_set", self.config.deadline))
                        });
                    node.set_known(match answer {
                        Ok(true) => Known::Holds(Some(new.to_owned())),
                        _ => Known::Unknown,
                    });
                    (i, answer)
                }
            })
            .collect();
        // Only `true` counts: each such store held at most `base` and now holds `last`.
        let writes = self.first_majority(writes, |wrote| *wrote).await;
        if writes.counted >= self.majority {
            self.hint.fetch_max(last, Ordering::Relaxed);
            return Ok(base + 1..=last);
        }
        Err(self.lost_proposal(summary, writes))
    }

    /// A lost attempt: permanent when the stores that failed for good leave no majority.
    fn lost(&self, mut summary: Summary) -> Lost {
        let permanent = summary
            .errors
            .iter()
            .filter(|(_, e)| !e.is_retryable())
            .count();
        if permanent > 0 && self.nodes.len() - permanent < self.majority {
            if let Some(at) = summary.errors.iter().position(|(_, e)| !e.is_retryable()) {
                let (i, e) = summary.errors.swap_remove(at);
                tracing::warn!(store = i, error = %e, "majority IDs: too many stores fail for good");
                return Lost::Permanent(e);
            }
        }
        Lost::Retry(summary)
    }

    /// `get` on one node (after its durability check, if it still owes one): the text and its
    /// value (0 when absent).
    async fn read(&self, i: usize, node: &Node, deadline: Duration) -> Result<Read> {
        let work = async {
            self.check_durable(i, node).await?;
            node.store.get(&self.key).await
        };
        let text = timeout_at(self.config.clock.as_ref(), deadline, work)
            .await
            .unwrap_or_else(|| Err(deadline_error("get", self.config.deadline)))?;
        let value = match &text {
            None => 0,
            Some(t) => {
                parse_counter(&self.key, t).inspect_err(|_| node.set_known(Known::Unknown))?
            }
        };
        Ok(Read {
            node: i,
            text,
            value,
        })
    }

    /// Reads until a majority answered, and returns their answers less any store that holds a
    /// number absurdly far above a majority of the stores (see "A store far ahead" in the
    /// module docs): when the largest answer stands more than [`MAX_JUMP`] above the next, it
    /// reads on until a majority of the other stores are seen to hold that much less (the
    /// store is left out) or not (it is kept); it fails the attempt when it cannot tell.
    async fn read_majority(
        &self,
        deadline: Duration,
        summary: &mut Summary,
    ) -> std::result::Result<Vec<Read>, Lost> {
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move { (i, self.read(i, node, deadline).await) })
            .collect();
        let mut reads = Answers::default();
        self.collect(&mut pending, &mut reads, self.majority, |_| true)
            .await;
        summary.answered = Some(reads.counted);
        if reads.counted < self.majority {
            summary.errors = reads.errors;
            summary.unawaited = reads.unawaited;
            return Err(self.lost(std::mem::take(summary)));
        }
        loop {
            let mut values: Vec<i64> = reads.ok.iter().map(|r| r.value.max(0)).collect();
            values.sort_unstable_by(|a, b| b.cmp(a));
            let (top, bottom) = (values[0], values[values.len() - 1]);
            if top.saturating_sub(bottom) <= MAX_JUMP {
                // The usual case: every answer within MAX_JUMP of the others.
                return Ok(self.accept(reads.ok));
            }
            // The number a majority holds is the M-th largest of all N; taking the stores not
            // heard from as holding more, it is at most `bound`, and no ID above it was ever
            // returned (it would be held by a majority, and two majorities share a store).
            let unknown = self.nodes.len() - values.len();
            if let Some(&bound) = self
                .majority
                .checked_sub(unknown + 1)
                .and_then(|at| values.get(at))
            {
                let far = |v: i64| v.max(0).saturating_sub(bound) > MAX_JUMP;
                let kept = reads.ok.iter().filter(|r| !far(r.value)).count();
                if kept < reads.ok.len() && kept >= self.majority {
                    let (out, kept): (Vec<Read>, Vec<Read>) =
                        reads.ok.into_iter().partition(|r| far(r.value));
                    for r in &out {
                        self.nodes[r.node].set_known(Known::Unknown);
                        tracing::warn!(
                            store = r.node,
                            holds = r.value,
                            majority_holds_at_most = bound,
                            key = %self.key,
                            "majority IDs: a store holds a number far above what a majority of \
                             the stores hold (a bad restore?); it is left out of proposals until \
                             repaired (see the module docs, \"A store far ahead\")"
                        );
                    }
                    return Ok(self.accept(kept));
                }
                if kept == reads.ok.len() && unknown == 0 {
                    // Every store answered and a majority holds the largest numbers: a store far
                    // behind, which proposals raise.
                    return Ok(self.accept(reads.ok));
                }
            }
            if pending.is_empty() {
                summary.errors = reads.errors;
                let at = reads
                    .ok
                    .iter()
                    .find(|r| r.value.max(0) == top)
                    .map_or(0, |r| r.node);
                summary.errors.push((
                    at,
                    Error::Unavailable {
                        backend: RECIPE,
                        message: format!(
                            "holds {top}, more than {MAX_JUMP} above another store's {bottom}: \
                             too few stores answered to tell what a majority holds"
                        ),
                        source: None,
                    },
                ));
                return Err(self.lost(std::mem::take(summary)));
            }
            let want = reads.counted + 1;
            self.collect(&mut pending, &mut reads, want, |_| true).await;
        }
    }

    /// The reads a proposal goes on: each node remembers what it read as [`Node::known`] (a
    /// store left out as far ahead never is, so an optimistic block round cannot use it).
    fn accept(&self, reads: Vec<Read>) -> Vec<Read> {
        for r in &reads {
            self.nodes[r.node].set_known(Known::Holds(r.text.clone()));
        }
        reads
    }

    /// `set_max(proposal)` on one node, if it passed its durability check.
    async fn write(&self, node: &Node, proposal: i64, deadline: Duration) -> Result<bool> {
        if !node.checked.load(Ordering::Acquire) {
            return Err(Error::Unavailable {
                backend: node.store.capabilities().backend,
                message: "not used until it answers the durability check".into(),
                source: None,
            });
        }
        // Unknown while the write is out (its answer may never be awaited), the proposal once
        // the store took it: a block round compares against what the store holds.
        node.set_known(Known::Unknown);
        let answer = timeout_at(
            self.config.clock.as_ref(),
            deadline,
            node.store.set_max(&self.key, proposal, None),
        )
        .await
        .unwrap_or_else(|| Err(deadline_error("set_max", self.config.deadline)));
        if matches!(answer, Ok(true)) {
            node.set_known(Known::Holds(Some(proposal.to_string())));
        }
        answer
    }

    /// Collects answers until `M` of them count (`counts`) or too few remain for that.
    async fn first_majority<T, F>(
        &self,
        mut pending: FuturesUnordered<F>,
        counts: impl Fn(&T) -> bool,
    ) -> Answers<T>
    where
        F: std::future::Future<Output = (usize, Result<T>)>,
    {
        let mut out = Answers::default();
        self.collect(&mut pending, &mut out, self.majority, counts)
            .await;
        out
    }

    /// Adds answers to `out` until `want` of them count (`counts`) or too few remain for that.
    async fn collect<T, F>(
        &self,
        pending: &mut FuturesUnordered<F>,
        out: &mut Answers<T>,
        want: usize,
        counts: impl Fn(&T) -> bool,
    ) where
        F: std::future::Future<Output = (usize, Result<T>)>,
    {
        while out.counted < want && out.counted + pending.len() >= want {
            let Some((i, answer)) = pending.next().await else {
                break;
            };
            match answer {
                Ok(v) => {
                    out.counted += usize::from(counts(&v));
                    out.ok.push(v);
                }
                Err(e) => {
                    self.log_node_error(i, &e);
                    out.errors.push((i, e));
                }
            }
        }
        out.unawaited = pending.len();
    }

    fn log_node_error(&self, i: usize, e: &Error) {
        if e.is_retryable() {
            tracing::debug!(store = i, error = %e, "majority IDs: a store did not answer");
        } else {
            tracing::warn!(store = i, error = %e, "majority IDs: a store fails for good");
        }
    }
}
