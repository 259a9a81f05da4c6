//! NCP's windows before NKP-0024: 16 packets to start, one more per ACK of a packet not resent, halved per timed-out packet, between 1 and 256 packets.

use std::collections::BTreeMap;

use super::super::{PathId, SessionConfig};
use super::ncp::{halve, NcpWindows};

/// Classic NCP's per-connection windows.
#[derive(Debug)]
pub(super) struct Classic {
    initial_window_packets: f64,
    max_window_packets: f64,
    windows: BTreeMap<PathId, f64>,
}

impl Classic {
    pub(super) fn new(config: &SessionConfig) -> Self {
        Self {
            initial_window_packets: f64::from(config.initial_window_packets),
            max_window_packets: f64::from(config.ncp_max_window_packets),
            windows: BTreeMap::new(),
        }
    }
}

impl NcpWindows for Classic {
    fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>) {
        let window = initial_window_packets
            .unwrap_or(self.initial_window_packets)
            .max(1.0);
        self.windows.insert(path, window);
    }

    fn remove_path(&mut self, path: PathId) {
        self.windows.remove(&path);
    }

    fn window_packets(&self, path: PathId) -> f64 {
        self.windows.get(&path).copied().unwrap_or_default()
    }

    fn on_acked(&mut self, path: PathId) {
        if let Some(window) = self.windows.get_mut(&path) {
            *window = (*window + 1.0).min(self.max_window_packets);
        }
    }

    fn on_progress(&mut self) {}

    fn on_timed_out(&mut self, path: PathId) {
        if let Some(window) = self.windows.get_mut(&path) {
            *window = halve(*window);
        }
    }

    fn on_send_error(&mut self, _: PathId) {}
}
