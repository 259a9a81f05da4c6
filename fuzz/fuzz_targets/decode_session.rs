//! Fuzz the multipath session's datagram decoder and the receiver behind it.
//!
//! Input layout: `[mtu][datagram...]`: `mtu` (0..=255) limits data payloads.
//!
//! Invariants checked (a panic here is a bug):
//! * `Packet::decode` never panics, and whatever it accepts re-encodes to a datagram that decodes
//!   to the same packet;
//! * a `Receiver` fed the datagram returns a typed error or accepts it, and never buffers more than
//!   its window.
#![no_main]

use std::time::Instant;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use meshwire_session::proto::{Packet, PathId, Policy, Receiver, SessionConfig};

fuzz_target!(|data: &[u8]| {
    let Some((&mtu, datagram)) = data.split_first() else {
        return;
    };
    let mtu = usize::from(mtu).max(1);
    let Ok(packet) = Packet::decode(Bytes::copy_from_slice(datagram), mtu) else {
        return;
    };
    assert_eq!(Packet::decode(packet.encode(), mtu).as_ref(), Ok(&packet));
    let mut config = SessionConfig::new(Policy::Meshwire);
    config.mtu_bytes = mtu;
    config.receive_window_bytes = mtu * 8;
    let mut receiver = Receiver::new(config);
    let _ = receiver.handle_packet(PathId(0), packet, Instant::now());
    assert!(receiver.buffered_bytes() <= config.receive_window_bytes);
    while receiver.poll_transmit(Instant::now()).is_some() {}
});
