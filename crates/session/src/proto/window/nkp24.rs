//! NKP-0024's windows: they start at the session window shared equally, have no cap, and are rescaled after every change so that together they hold the session window.

use std::collections::BTreeMap;

use super::super::{PathId, SessionConfig};
use super::ncp::{halve, NcpWindows, MIN_WINDOW_PACKETS};

/// NKP-0024's normalised per-connection windows.
#[derive(Debug)]
pub(super) struct Nkp24 {
    session_window_packets: f64,
    windows: BTreeMap<PathId, f64>,
}

impl Nkp24 {
    pub(super) fn new(config: &SessionConfig) -> Self {
        Self {
            session_window_packets: config.session_window_packets() as f64,
            windows: BTreeMap::new(),
        }
    }

    /// Scales every window so that together they hold the session window.
    fn normalize(&mut self) {
        let total: f64 = self.windows.values().sum();
        if total <= 0.0 {
            return;
        }
        let scale = self.session_window_packets / total;
        for window in self.windows.values_mut() {
            *window = (*window * scale).max(MIN_WINDOW_PACKETS);
        }
    }
}

impl NcpWindows for Nkp24 {
    /// A path whose window is given keeps it until the next change; otherwise it starts at the
    /// session window shared among all paths, and all are rescaled at once.
    fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>) {
        let shared = self.session_window_packets / (self.windows.len() + 1) as f64;
        let window = initial_window_packets.unwrap_or(shared).max(1.0);
        self.windows.insert(path, window);
        if initial_window_packets.is_none() {
            self.normalize();
        }
    }

    fn remove_path(&mut self, path: PathId) {
        self.windows.remove(&path);
        self.normalize();
    }

    fn window_packets(&self, path: PathId) -> f64 {
        self.windows.get(&path).copied().unwrap_or_default()
    }

    fn on_acked(&mut self, path: PathId) {
        if let Some(window) = self.windows.get_mut(&path) {
            *window += 1.0;
        }
    }

    fn on_progress(&mut self) {
        self.normalize();
    }

    fn on_timed_out(&mut self, path: PathId) {
        if let Some(window) = self.windows.get_mut(&path) {
            *window = halve(*window);
        }
        self.normalize();
    }

    fn on_send_error(&mut self, path: PathId) {
        if let Some(window) = self.windows.get_mut(&path) {
            *window = halve(*window);
        }
        self.normalize();
    }
}
