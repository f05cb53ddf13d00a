//! How a group member of `run` and `exec` stops (`--on-stop`, `--restart-window`) and tells its
//! supervisor it is ready (`--ready-file`, and `/ready` beside `--metrics-addr`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use headcount::recipes::group::{GroupConfig, Member};
use headcount::{Error, Result};
use tokio::task::JoinHandle;

/// What a stop signal means to a group member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnStop {
    /// Leave the group: the others take this member's keys at once (a scale-down, a member
    /// that will not come back under its id).
    #[default]
    Leave,
    /// Leave for a restart: the member's place in the group is kept for --restart-window, and
    /// the same --member coming back in time gets it back with no key moved (a StatefulSet pod,
    /// a unit restarted in place). Needs --member.
    Restart,
}

/// The lifecycle options of `run` and `exec` in group mode.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LifecycleArgs {
    /// What a stop signal (SIGTERM, SIGINT, ...) means: `leave` the group, so the others take
    /// this member's keys at once, or `restart`: keep its place for --restart-window so that the
    /// same --member, started again, takes it back with no key moved (static membership).
    #[arg(long, env = "HEADCOUNT_ON_STOP", value_enum, default_value = "leave")]
    pub on_stop: OnStop,
    /// How long a member stopped with `--on-stop restart` keeps its place for its id to come
    /// back (1s, 30s, 2m; at most 15m) [default: the TTL]. Its keys wait for it meanwhile; if it
    /// does not come back in time, the others take them as after a crash.
    #[arg(long, env = "HEADCOUNT_RESTART_WINDOW", value_parser = crate::util::parse_duration)]
    pub restart_window: Option<Duration>,
    /// Keep this member's place for this long beyond its lease if its process dies (1s, 20s;
    /// at most 15m; needs --member), so that the same --member started again (a container
    /// restarted in place) takes its keys back with none moved. A member that really died
    /// leaves its keys without an owner for this plus the TTL. Off by default.
    #[arg(long, env = "HEADCOUNT_CRASH_GRACE", value_parser = crate::util::parse_duration)]
    pub crash_grace: Option<Duration>,
    /// After the store did not answer for a heartbeat or more, how long the members of the
    /// last view have to claim their places again before any of them publishes a view without
    /// the others (0s turns it off; at most 15m) [default: the TTL]. A store down past the
    /// lease then comes back with no key moved.
    #[arg(long, env = "HEADCOUNT_OUTAGE_GRACE", value_parser = crate::util::parse_duration)]
    pub outage_grace: Option<Duration>,
    /// Join as a standby first, for up to this long (5s, 30s; at most 15m): outside the group,
    /// ready, waiting for a member that leaves to hand over its place, so that its keys move
    /// once, straight to this member (a Deployment rolled out with maxSurge). With nobody
    /// leaving, the member joins when the wait ends, so a scale-up takes that much longer.
    #[arg(long, env = "HEADCOUNT_STANDBY_FOR", value_parser = crate::util::parse_duration)]
    pub standby_for: Option<Duration>,
    /// Keep this file while the member is ready (active under a view that names it, no hand-off
    /// of its own pending, or standing by with --standby-for) and remove it otherwise: for a Kubernetes readiness probe
    /// (`exec: [test, -f, FILE]`). `/ready` on --metrics-addr answers the same.
    #[arg(long, env = "HEADCOUNT_READY_FILE", value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Only poll the store, at the heartbeat's pace, instead of also listening to its change
    /// notifications (Redis pub/sub, PostgreSQL LISTEN, an etcd watch), which make planned
    /// changes (joins, leaves, hand-overs) take round trips instead of heartbeats. For a proxy
    /// that mishandles subscriptions; a server that refuses them is detected without it.
    #[arg(long, env = "HEADCOUNT_NO_NOTIFICATIONS")]
    pub no_notifications: bool,
}

impl LifecycleArgs {
    /// Applies the restart window, the standby wait, the graces and `--no-notifications` to
    /// `config`.
    pub fn configure(&self, mut config: GroupConfig) -> GroupConfig {
        if let Some(w) = self.restart_window {
            config = config.with_restart_window(w);
        }
        if let Some(w) = self.standby_for {
            config = config.with_standby(w);
        }
        if let Some(g) = self.crash_grace {
            config = config.with_crash_grace(g);
        }
        if let Some(g) = self.outage_grace {
            config = config.with_outage_grace(g);
        }
        config.with_notifications(!self.no_notifications)
    }

    /// Refuses `--on-stop restart` without a member id, before any store is opened.
    pub fn check(&self, member: Option<&str>) -> Result<()> {
        if self.on_stop == OnStop::Restart && member.is_none() {
            return Err(Error::invalid(
                "--on-stop restart needs --member (or HEADCOUNT_MEMBER): a restarted process comes back under its member id",
            ));
        }
        if self.crash_grace.is_some_and(|g| !g.is_zero()) && member.is_none() {
            return Err(Error::invalid(
                "--crash-grace needs --member (or HEADCOUNT_MEMBER): only a process started again under the same id can come back to the place that waits for it",
            ));
        }
        if self.restart_window.is_some() && self.on_stop != OnStop::Restart {
            return Err(Error::invalid(
                "--restart-window applies to --on-stop restart (or HEADCOUNT_ON_STOP=restart)",
            ));
        }
        if let Some(file) = &self.ready_file {
            check_ready_file(file)?;
        }
        Ok(())
    }

    /// Leaves the group as `--on-stop` says.
    pub async fn leave(&self, member: Member) -> Result<()> {
        match self.on_stop {
            OnStop::Leave => member.leave().await,
            OnStop::Restart => member.leave_for_restart().await,
        }
    }
}

/// Refuses a `--ready-file` that could never be written: one naming a directory, or one in a
/// directory that does not exist. A member that ran on with it would never be ready, and a
/// deploy tool would wait on it for ever.
fn check_ready_file(file: &Path) -> Result<()> {
    if file.is_dir() {
        return Err(Error::invalid(format!(
            "--ready-file {}: is a directory; name a file in it (for example {})",
            file.display(),
            file.join("ready").display()
        )));
    }
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::invalid(format!(
            "--ready-file {}: directory {} does not exist; create it first (an emptyDir volume in Kubernetes)",
            file.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// Follows a member's readiness into `--ready-file` and `/ready` until dropped, when the member
/// is no longer ready (it is leaving).
pub struct Readiness {
    file: Option<PathBuf>,
    task: JoinHandle<()>,
}

impl Readiness {
    /// Starts following `member`.
    pub fn track(member: &Member, file: Option<PathBuf>) -> Readiness {
        let mut watch = member.watch();
        let member = member.clone();
        let path = file.clone();
        let task = tokio::spawn(async move {
            let mut was = None;
            loop {
                // The member's own answer: it counts a lease past its deadline as not ready
                // before the heartbeat task publishes it.
                let a = member.assignment();
                let now = (a.is_ready(), a.is_working());
                if was != Some(now) {
                    set(path.as_deref(), now.0, now.1);
                    was = Some(now);
                }
                tokio::select! {
                    changed = watch.changed() => if changed.is_err() { break },
                    // A lease deadline passes without a change being published at once.
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
            set(path.as_deref(), false, false);
        });
        Readiness { file, task }
    }
}

impl Drop for Readiness {
    fn drop(&mut self) {
        self.task.abort();
        set(self.file.as_deref(), false, false);
    }
}

/// Publishes readiness: the flags `/ready` and `/working` answer, and the file when there is
/// one.
fn set(file: Option<&Path>, ready: bool, working: bool) {
    crate::observe::set_ready(ready, working);
    let Some(file) = file else { return };
    let result = if ready {
        std::fs::write(file, b"ready\n")
    } else {
        match std::fs::remove_file(file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    };
    if let Err(e) = result {
        tracing::warn!(file = %file.display(), error = %e, ready, "cannot update the ready file");
    }
}
