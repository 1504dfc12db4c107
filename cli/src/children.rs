//! Child processes the CLI starts and watches (servers, workers, HAProxy).

use std::process::Stdio;

/// A command set up as a background child whose stderr the caller reads.
pub(crate) trait Watched {
    /// No stdin, stdout discarded, stderr piped to the caller (the lines
    /// the child logs), and killed when its handle is dropped, so no child
    /// outlives the run that started it.
    fn watched(&mut self) -> &mut Self;
}

impl Watched for tokio::process::Command {
    fn watched(&mut self) -> &mut Self {
        self.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
    }
}
