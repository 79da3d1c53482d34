//! What can go wrong while starting, watching and stopping the processes under test.
//!
//! Each variant says which step failed; `#[source]` carries the cause without repeating its
//! text, so print an error with [`Error::chain`] (or anyhow's `{:#}`) to see the whole story.
//! The panicking wrappers tests use print it that way.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// The result of every fallible harness call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file, directory, socket or spawn failed; `what` names the step.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A condition did not hold within its deadline.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// A process that should be running has exited.
    #[error("{name} exited ({status}); end of {}:\n{tail}", log.display())]
    Exited {
        name: String,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    /// A command ran to completion and failed.
    #[error("{what} failed ({status}): {stderr}")]
    Failed {
        what: String,
        status: ExitStatus,
        stderr: String,
    },
    /// A binary under test is missing, or building it failed.
    #[error("{0}")]
    Binaries(String),
    /// Output that does not say what it should (dog's JSON, a log).
    #[error("{what}: {detail}")]
    Unexpected { what: String, detail: String },
    /// SIGINT or SIGTERM arrived after [`crate::wait::install_interrupt_handlers`].
    #[error("interrupted")]
    Interrupted,
    /// `source`, in the course of `context`.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// An [`Error::Io`] naming the step.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// This error inside `context`.
    pub fn context(self, context: impl Into<String>) -> Error {
        Error::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The message and every source's, joined with ": ".
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            out.push_str(": ");
            out.push_str(&e.to_string());
            next = e.source();
        }
        out
    }
}

/// The value, or a panic with the whole chain: how the panicking wrappers end.
#[track_caller]
pub fn or_panic<T>(r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{}", e.chain()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_shows_every_source_once() {
        let e =
            Error::io("opening x", std::io::Error::other("no such thing")).context("starting y");
        assert_eq!(e.to_string(), "starting y");
        assert_eq!(e.chain(), "starting y: opening x: no such thing");
    }
}
