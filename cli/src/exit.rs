//! Exit statuses, the one error line, and stdout that may be closed or full.
//!
//! The statuses are the contract a supervisor acts on (also in `--help` and `docs/cli.md`):
//! retry on [`UNAVAILABLE`], fix the command line on [`USAGE`], page someone on [`FAILURE`].

use std::fmt::Display;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use headcount::{Error, ErrorKind};

/// The command ran and failed for good: a store refused us (authentication, a foreign value, a
/// member id already in use), the URL names a server of another protocol, a member gave up, a
/// conformance case failed, the demo lost or duplicated a task, or stdout could not be written.
/// Restarting as is will not help.
pub const FAILURE: u8 = 1;
/// A usage or configuration error: a bad flag, URL, name or value, or no store given where one
/// is required. Nothing was written to the store.
pub const USAGE: u8 = 2;
/// The store could not be reached or did not answer in time: retry later (sysexits'
/// `EX_TEMPFAIL`).
pub const UNAVAILABLE: u8 = 75;
/// `exec` only: headcount itself failed (any of the above), as `env` and `timeout` report it.
pub const EXEC_FAILED: u8 = 125;
/// `exec` only: the command was found but cannot be run (not executable, a directory).
pub const NOT_EXECUTABLE: u8 = 126;
/// `exec` only: the command was not found.
pub const NOT_FOUND: u8 = 127;

/// The table printed after every `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit status:
  0    success, or stopped by SIGINT, SIGTERM, SIGHUP or SIGQUIT (run, exec, status --watch)
  1    failed for good: the store refused us (auth, a foreign value, member id in use), the
       URL names a server of another protocol, a member gave up, a conformance case failed,
       output could not be written
  2    usage or configuration error: bad flag, URL or value, a database that is not ours or
       does not exist (read-only commands), no --store where one is required
  75   the store is unreachable or timed out: retry later
  exec: 125 headcount itself failed (the error line says why), 126 CMD is not executable,
       127 CMD not found, otherwise CMD's own status (128+N when signal N ended it)";

/// Why a command ends unsuccessfully.
#[derive(Debug)]
pub enum CliError {
    /// The library's error; its kind decides the status.
    Store(Error),
    /// Stdout was closed by its reader (`| head -1`): end quietly.
    StdoutClosed,
    /// Stdout could not be written for another reason (a full disk).
    Stdout(std::io::Error),
    /// A failure already phrased, with its status.
    Exit {
        /// The exit status.
        code: u8,
        /// The error line (without the `headcount: error:` prefix); empty to print nothing.
        message: String,
    },
}

impl From<Error> for CliError {
    fn from(e: Error) -> Self {
        CliError::Store(e)
    }
}

impl CliError {
    /// A usage error with this message.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError::Exit {
            code: USAGE,
            message: message.into(),
        }
    }

    /// The exit status of this error outside `exec`.
    pub fn code(&self) -> u8 {
        match self {
            CliError::Store(e) => code_of(e),
            CliError::StdoutClosed => 0,
            CliError::Stdout(_) => FAILURE,
            CliError::Exit { code, .. } => *code,
        }
    }

    /// The error line, or `None` when the command ends quietly.
    pub fn message(&self) -> Option<String> {
        match self {
            CliError::Store(e) => Some(e.to_string()),
            CliError::StdoutClosed => None,
            CliError::Stdout(e) => Some(format!("cannot write to stdout: {e}")),
            CliError::Exit { message, .. } if message.is_empty() => None,
            CliError::Exit { message, .. } => Some(message.clone()),
        }
    }
}

/// The status of a library error: usage, retryable, or permanent.
pub fn code_of(e: &Error) -> u8 {
    match e.kind() {
        ErrorKind::Config | ErrorKind::InvalidArgument => USAGE,
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Contended => UNAVAILABLE,
        _ => FAILURE,
    }
}

/// Whether the error and warning lines are JSON (`--log-format json`).
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// Writes the error and warning lines as JSON objects from now on, shaped like the log lines
/// of `--log-format json`, so that a log pipeline reading stderr gets no line of text.
pub fn json_lines(on: bool) {
    JSON_LINES.store(on, Ordering::Relaxed);
}

/// Prints the one error line on stderr, with the exit status it ends the command with.
pub fn print_error(message: &str, code: u8) {
    print_line("ERROR", "error", message, Some(code));
}

/// Prints a warning line on stderr.
pub fn print_warning(message: &str) {
    print_line("WARN", "warning", message, None);
}

fn print_line(level: &str, word: &str, message: &str, code: Option<u8>) {
    let line = if JSON_LINES.load(Ordering::Relaxed) {
        let mut fields = serde_json::json!({ "message": message });
        if let Some(code) = code {
            fields["exit_code"] = code.into();
        }
        serde_json::json!({
            "timestamp": crate::util::rfc3339(SystemTime::now()),
            "level": level,
            "fields": fields,
            "target": "headcount",
        })
        .to_string()
    } else {
        format!("headcount: {word}: {message}")
    };
    // stderr may be closed too: there is nowhere left to say so.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Ends the process for `e`: the error line, then the status (`exec` maps headcount's own
/// failures to [`EXEC_FAILED`]).
pub fn report(e: &CliError, exec: bool) -> ExitCode {
    let code = match e.code() {
        code @ (0 | NOT_EXECUTABLE | NOT_FOUND) => code,
        _ if exec => EXEC_FAILED,
        code => code,
    };
    if let Some(message) = e.message() {
        print_error(&message, code);
    }
    ExitCode::from(code)
}

/// Writes one line on stdout. A closed stdout is [`CliError::StdoutClosed`], any other failure
/// [`CliError::Stdout`]: never a panic.
pub fn emit(line: impl Display) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

/// Writes text as is on stdout (see [`emit`]).
pub fn emit_raw(text: &[u8]) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

/// Fails when stdout cannot be written at all: descriptor 1 is closed (`>&-`) or open for
/// reading only. A closed descriptor 1 never reaches us as such: Rust's runtime opens
/// `/dev/null` in its place (for reading and writing) before `main`, so every write "succeeds"
/// and lost output looks delivered. So `/dev/null` open for reading and writing counts as
/// closed; `> /dev/null` (write only) is a choice and passes. A command whose output is what
/// it spends (an ID) asks first.
#[allow(unsafe_code)]
pub fn check_stdout_writable() -> Result<(), CliError> {
    // SAFETY: fcntl(2) with F_GETFL reads the descriptor's flags and touches no memory of ours.
    let flags = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_GETFL) };
    let why = if flags == -1 {
        "stdout is closed"
    } else if flags & libc::O_ACCMODE == libc::O_RDONLY {
        "stdout is open for reading only"
    } else if flags & libc::O_ACCMODE == libc::O_RDWR && stdout_is_dev_null() {
        "stdout is closed (or /dev/null opened for reading and writing, which is what Rust's \
         runtime puts in place of a closed one; `> /dev/null` is accepted)"
    } else {
        return Ok(());
    };
    Err(CliError::Exit {
        code: FAILURE,
        message: why.to_owned(),
    })
}

/// Whether descriptor 1 is the `/dev/null` device.
#[allow(unsafe_code)]
fn stdout_is_dev_null() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(null) = std::fs::metadata("/dev/null") else {
        return false;
    };
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat(2) writes only the struct it is given, read below only when it succeeded.
    let rc = unsafe { libc::fstat(libc::STDOUT_FILENO, stat.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: fstat returned 0, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    stat.st_mode & libc::S_IFMT == libc::S_IFCHR && stat.st_rdev == null.rdev()
}

fn stdout_error(e: std::io::Error) -> CliError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CliError::StdoutClosed
    } else {
        CliError::Stdout(e)
    }
}

/// `emit!("{}", x)?` writes one formatted line on stdout (see [`emit`]).
macro_rules! emit {
    ($($arg:tt)*) => {
        $crate::exit::emit(format_args!($($arg)*))
    };
}
