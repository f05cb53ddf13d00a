//! What the stores answered in one phase of a round ([`Answers`], [`Read`]), what a lost attempt
//! saw ([`Summary`], [`Lost`]), and the errors built from them.

use std::fmt;
use std::time::Duration;

use super::RECIPE;
use crate::error::Error;

/// The same failure for another caller of one round: the kind kept where the error says what
/// happened to the call (unavailable, timed out), the message kept otherwise.
pub(super) fn copy_error(e: &Error) -> Error {
    match e {
        Error::Timeout { backend, op, after } => Error::Timeout {
            backend,
            op,
            after: *after,
        },
        e if e.is_retryable() => Error::Unavailable {
            backend: RECIPE,
            message: e.to_string(),
            source: None,
        },
        e => Error::Rejected {
            backend: RECIPE,
            message: e.to_string(),
            source: None,
        },
    }
}

pub(super) fn deadline_error(op: &'static str, after: Duration) -> Error {
    Error::Timeout {
        backend: RECIPE,
        op,
        after,
    }
}

/// One store's counter, as it answered a read (or, for a block round that skips the read, as the
/// generator last saw it: [`Known::Holds`](super::majority::Known::Holds)).
pub(super) struct Read {
    pub(super) node: usize,
    pub(super) text: Option<String>,
    pub(super) value: i64,
}

/// The first other store that shares a server with store `i`, and that server.
pub(super) fn same_server(servers: &[Vec<String>], i: usize) -> Option<(usize, &str)> {
    servers.iter().enumerate().find_map(|(j, other)| {
        if j == i {
            return None;
        }
        servers[i]
            .iter()
            .find(|s| other.contains(s))
            .map(|s| (j, s.as_str()))
    })
}

pub(super) fn one_server(j: usize, i: usize, server: &str) -> Error {
    let (j, i) = (j.min(i), j.max(i));
    Error::invalid(format!(
        "stores #{j} and #{i} are one server ({server}): a majority must be of independent \
         stores, or one failure (or one lost disk) takes several votes"
    ))
}

/// The answers of one phase: the values, how many of them count toward the majority, the
/// failures.
pub(super) struct Answers<T> {
    pub(super) ok: Vec<T>,
    pub(super) counted: usize,
    pub(super) errors: Vec<(usize, Error)>,
    /// Stores whose answer was not awaited: a majority came first, or could no longer come.
    pub(super) unawaited: usize,
}

impl<T> Default for Answers<T> {
    fn default() -> Self {
        Answers {
            ok: Vec::new(),
            counted: 0,
            errors: Vec::new(),
            unawaited: 0,
        }
    }
}

/// What one lost attempt saw, for the error at the deadline.
#[derive(Default)]
pub(super) struct Summary {
    /// How many stores answered the read; `None` when the attempt proposed from its hint.
    pub(super) answered: Option<usize>,
    pub(super) accepted: usize,
    pub(super) refused: usize,
    pub(super) errors: Vec<(usize, Error)>,
    /// Stores still to answer when the phase stopped (no majority was possible any more).
    pub(super) unawaited: usize,
    /// Whether the attempt got as far as proposing.
    pub(super) proposed: bool,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.answered {
            Some(n) => write!(f, "{n} stores answered the read, ")?,
            None => write!(f, "proposed one above the last ID seen without a read, ")?,
        }
        if self.proposed {
            write!(
                f,
                "{} accepted the proposal, {} held as much or more",
                self.accepted, self.refused
            )?;
        } else {
            write!(f, "too few for a proposal")?;
        }
        if self.unawaited > 0 {
            write!(
                f,
                ", {} not awaited (no majority was possible any more)",
                self.unawaited
            )?;
        }
        if let Some((i, e)) = self.errors.first() {
            write!(f, "; store #{i}: {e}")?;
            if self.errors.len() > 1 {
                write!(f, " (and {} more failed)", self.errors.len() - 1)?;
            }
        }
        Ok(())
    }
}

pub(super) enum Lost {
    Retry(Summary),
    Permanent(Error),
}
