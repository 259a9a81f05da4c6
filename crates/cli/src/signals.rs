//! Turn SIGINT (ctrl-c) and SIGTERM into one graceful stop.

use anyhow::Context;

/// SIGINT (ctrl-c) and, on Unix, SIGTERM: either starts a graceful shutdown.
/// Both are registered once, so a signal arriving between two waits is not lost.
#[derive(Debug)]
pub struct Stop {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Stop {
    pub fn install() -> anyhow::Result<Self> {
        #[cfg(unix)]
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            #[cfg(unix)]
            interrupt: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            #[cfg(unix)]
            terminate: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    /// Resolves with the signal's name when one arrives.
    pub async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => "SIGINT",
                _ = self.terminate.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
