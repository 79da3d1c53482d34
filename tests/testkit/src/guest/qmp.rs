//! A minimal QMP client: one qemu's monitor socket, commands run one at a time.
//!
//! QMP sends one JSON object a line: a greeting (`{"QMP": ...}`) on connect, then for each
//! command either `{"return": ...}` or `{"error": {"class", "desc"}}`, with asynchronous
//! `{"event": ...}` lines in between. A command is answered before the next one is read, so
//! the first non-event line after a command is its answer; events are kept, in order, for
//! whoever wants them ([`Qmp::events`]).
//!
//! Every read has a deadline (a socket timeout): a qemu that stops answering fails the call
//! instead of hanging the test. A timed-out read may leave half a line behind, so the client
//! refuses further commands after one.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{try_wait_until, Error, Proc, Result};

/// A QMP connection in command mode.
pub struct Qmp {
    name: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: Vec<Value>,
    broken: bool,
}

impl Qmp {
    /// Connects to the monitor socket `path` of `proc` (polled until qemu listens, up to
    /// `timeout`; an error at once if qemu exits), reads the greeting and leaves the
    /// capabilities negotiation. Each later read waits up to `reply_timeout`.
    pub fn connect(
        path: &Path,
        proc: &mut Proc,
        timeout: Duration,
        reply_timeout: Duration,
    ) -> Result<Qmp> {
        let mut stream = None;
        try_wait_until(
            &format!("{}'s QMP socket {}", proc.name(), path.display()),
            timeout,
            || {
                proc.check_alive()?;
                stream = UnixStream::connect(path).ok();
                Ok(stream.is_some())
            },
        )?;
        let writer = stream.expect("connected");
        writer
            .set_read_timeout(Some(reply_timeout))
            .map_err(|e| Error::io("setting the QMP read timeout", e))?;
        let reader = writer
            .try_clone()
            .map_err(|e| Error::io("duplicating the QMP socket", e))?;
        let mut qmp = Qmp {
            name: proc.name().to_string(),
            reader: BufReader::new(reader),
            writer,
            events: Vec::new(),
            broken: false,
        };
        let greeting = qmp.read_message("the QMP greeting")?;
        if greeting.get("QMP").is_none() {
            return Err(qmp.unexpected("the QMP greeting", format!("got {greeting}")));
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments` (an object; `{}` for none) and returns its `return`
    /// value; a QMP error becomes [`Error::Unexpected`] with its class and description.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value> {
        if self.broken {
            return Err(self.unexpected(command, "an earlier read timed out".into()));
        }
        let mut line = if arguments.as_object().is_some_and(|a| a.is_empty()) {
            json!({ "execute": command })
        } else {
            json!({ "execute": command, "arguments": arguments })
        }
        .to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| Error::io(format!("sending {command} to {}", self.name), e))?;
        loop {
            let mut msg = self.read_message(command)?;
            if msg.get("event").is_some() {
                self.events.push(msg);
                continue;
            }
            if let Some(ret) = msg.get_mut("return") {
                return Ok(ret.take());
            }
            if let Some(err) = msg.get("error") {
                let detail = format!(
                    "{}: {}",
                    err["class"].as_str().unwrap_or("?"),
                    err["desc"].as_str().unwrap_or("?")
                );
                return Err(self.unexpected(command, detail));
            }
            return Err(self.unexpected(command, format!("got {msg}")));
        }
    }

    /// The events received so far, oldest first.
    pub fn events(&self) -> &[Value] {
        &self.events
    }

    fn read_message(&mut self, what: &str) -> Result<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(self.unexpected(what, "qemu closed the QMP socket".into())),
            Ok(_) => serde_json::from_str(&line)
                .map_err(|e| self.unexpected(what, format!("not JSON ({e}): {line:?}"))),
            Err(e) => {
                self.broken = true;
                Err(Error::io(
                    format!("reading the answer to {what} from {}", self.name),
                    e,
                ))
            }
        }
    }

    fn unexpected(&self, what: &str, detail: String) -> Error {
        Error::Unexpected {
            what: format!("QMP {what} on {}", self.name),
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::process::Command;

    /// A scripted QMP server on a thread: greets, then answers each command line with the
    /// next canned reply (events first where the script says so).
    #[test]
    fn skips_events_and_reports_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n")
                .unwrap();
            let replies: [&[u8]; 3] = [
                b"{\"return\": {}}\r\n",
                b"{\"event\": \"STOP\", \"timestamp\": {}}\r\n{\"return\": {\"status\": \"paused\"}}\r\n",
                b"{\"error\": {\"class\": \"GenericError\", \"desc\": \"no way\"}}\r\n",
            ];
            let mut got = Vec::new();
            for reply in replies {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                got.push(serde_json::from_str::<Value>(&line).unwrap());
                w.write_all(reply).unwrap();
            }
            got
        });
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut proc = Proc::spawn("sleeper", cmd, &dir.path().join("log"));
        let mut qmp = Qmp::connect(
            &sock,
            &mut proc,
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .unwrap();
        let st = qmp.execute("query-status", json!({})).unwrap();
        assert_eq!(st["status"], "paused");
        assert_eq!(qmp.events().len(), 1);
        let e = qmp
            .execute("migrate", json!({"uri": "unix:/x"}))
            .unwrap_err();
        assert!(e.to_string().contains("GenericError: no way"), "{e}");
        let got = server.join().unwrap();
        assert_eq!(got[0], json!({"execute": "qmp_capabilities"}));
        assert_eq!(got[1], json!({"execute": "query-status"}));
        assert_eq!(
            got[2],
            json!({"execute": "migrate", "arguments": {"uri": "unix:/x"}})
        );
    }
}
