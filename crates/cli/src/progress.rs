//! A progress bar for long lab runs: drawn on stderr when stderr is a terminal, silent otherwise.
//!
//! The bar counts units (trials: one case under one policy) and shows the elapsed wall time, the
//! ETA, the current unit's label and the lab time elapsed inside it:
//!
//! ```text
//! ⠙ [00:01:12] ███████░░░░░░░░░░░░░ 3/8 trials, ETA 00:02:00  bulk-bdp / meshwire · lab 4.2 s
//! ```
//!
//! Use:
//!
//! ```ignore
//! let progress = Progress::new(trials.len() as u64);
//! for (index, trial) in trials.iter().enumerate() {
//!     progress.start(index as u64, format!("{} / {}", trial.case, trial.policy));
//!     run(trial, |elapsed| progress.lab_time(elapsed))?;
//! }
//! progress.finish();
//! ```
//!
//! Dropping a `Progress` (on an early return with an error, say) clears the bar too.

use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// The bar's layout; `{wide_msg}` holds the label and the lab time, cut to the terminal's width.
const TEMPLATE: &str =
    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} trials, ETA {eta}  {wide_msg}";

/// How often the bar redraws by itself, so the clock and spinner move while a trial runs.
const TICK: Duration = Duration::from_millis(200);

/// A progress bar over a fixed number of units on stderr, or nothing when stderr is not a
/// terminal. Every method takes `&self`.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    /// The current unit's label, kept to rebuild the message when the lab time changes.
    label: Mutex<String>,
}

impl Progress {
    /// A bar over `units` units, shown if stderr is a terminal and hidden (every call a no-op,
    /// except [`Progress::println`]) otherwise.
    pub fn new(units: u64) -> Self {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            Self::with_target(units, ProgressDrawTarget::stderr())
        } else {
            Self::hidden(units)
        }
    }

    /// A bar that never draws, whatever stderr is.
    pub fn hidden(units: u64) -> Self {
        Self::with_target(units, ProgressDrawTarget::hidden())
    }

    fn with_target(units: u64, target: ProgressDrawTarget) -> Self {
        let style = ProgressStyle::with_template(TEMPLATE)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("█▌░");
        let bar = ProgressBar::with_draw_target(Some(units), target)
            .with_style(style)
            .with_finish(ProgressFinish::AndClear);
        if !bar.is_hidden() {
            bar.enable_steady_tick(TICK);
        }
        Self {
            bar,
            label: Mutex::new(String::new()),
        }
    }

    /// Unit `index` (0-based) starts, so `index` units are done: show `label` (e.g. "case /
    /// policy") until the next `start`.
    pub fn start(&self, index: u64, label: impl Into<String>) {
        self.bar.set_position(index);
        let label = label.into();
        self.bar.set_message(label.clone());
        *self.lock_label() = label;
    }

    /// The lab time elapsed inside the current unit, shown after its label.
    pub fn lab_time(&self, elapsed: Duration) {
        if self.bar.is_hidden() {
            return;
        }
        let message = format!("{} · lab {:.1} s", self.lock_label(), elapsed.as_secs_f64());
        self.bar.set_message(message);
    }

    /// Prints `line` on stderr: above the bar when it is shown, as a plain line otherwise (so a
    /// runner's log lines read the same with or without a terminal).
    pub fn println(&self, line: impl AsRef<str>) {
        if self.bar.is_hidden() {
            eprintln!("{}", line.as_ref());
        } else {
            self.bar.println(line);
        }
    }

    /// Removes the bar from the terminal (dropping it does too).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn lock_label(&self) -> std::sync::MutexGuard<'_, String> {
        self.label
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }

    #[test]
    fn a_hidden_bar_counts_and_stays_quiet() {
        let progress = Progress::hidden(4);
        assert!(progress.bar.is_hidden());
        progress.start(0, "case-a / meshwire");
        progress.lab_time(Duration::from_millis(1500));
        progress.start(1, "case-a / naive");
        assert_eq!(progress.bar.position(), 1);
        assert_eq!(*progress.lock_label(), "case-a / naive");
        progress.finish();
        assert!(progress.bar.is_finished());
    }
}
