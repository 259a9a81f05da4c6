//! The node's real UDP socket: kernel buffers sized for the path it should fill, and the kernel's
//! own count of datagrams it dropped on receive.
//!
//! A QUIC sender keeps a bandwidth-delay product in flight, and the receiving kernel must hold what
//! arrives while the node's task is not running. The kernel default receive buffer (208 KiB on
//! Linux) holds 1.7 ms at 1 Gbit/s: a descheduled receiver drops the rest, and the sender reads
//! those drops as congestion. [`bind`] asks for [`TransportSettings::socket_buffer_bytes`] in both
//! directions. The kernel caps the request at `net.core.rmem_max` / `net.core.wmem_max`; the node
//! then runs with what it got, warns once naming the setting to raise, and reports both figures
//! ([`SocketBuffers`], `meshwire_udp_*_buffer_bytes`).
//!
//! GSO on send and GRO on receive come from quinn-udp, which uses them wherever the kernel has them
//! (Linux ≥ 4.18 / 5.0) and falls back to one datagram per system call elsewhere; [`bind`] logs
//! which it found. MTU discovery is on by default for real sockets
//! ([`TransportSettings::mtu_discovery`]).
//!
//! [`TransportSettings::socket_buffer_bytes`]: crate::TransportSettings::socket_buffer_bytes
//! [`TransportSettings::mtu_discovery`]: crate::TransportSettings::mtu_discovery

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

/// What the node asked the kernel for and what it got, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBuffers {
    /// Bytes asked for in each direction.
    pub requested: usize,
    /// Receive buffer the kernel granted (for the node's datagrams; on Linux, half of what
    /// `SO_RCVBUF` reports, the other half being the kernel's bookkeeping).
    pub receive: usize,
    /// Send buffer the kernel granted (as for `receive`).
    pub send: usize,
}

impl SocketBuffers {
    /// Whether the kernel granted less than asked in either direction.
    pub fn capped(&self) -> bool {
        self.receive < self.requested || self.send < self.requested
    }
}

/// Binds a UDP socket at `address` with `buffer_bytes` of kernel buffer asked for in each
/// direction. A refused or capped buffer is not an error: the socket keeps what the kernel gives
/// and the node warns.
pub(crate) fn bind(
    address: SocketAddr,
    buffer_bytes: usize,
) -> io::Result<(std::net::UdpSocket, SocketBuffers)> {
    let domain = socket2::Domain::for_address(address);
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    if address.is_ipv6() {
        // Dual-stack where the platform allows it; a refusal keeps IPv6 only.
        let _ = socket.set_only_v6(false);
    }
    if let Err(error) = socket.set_recv_buffer_size(buffer_bytes) {
        tracing::warn!(%error, buffer_bytes, "cannot set the UDP receive buffer; keeping the kernel's");
    }
    if let Err(error) = socket.set_send_buffer_size(buffer_bytes) {
        tracing::warn!(%error, buffer_bytes, "cannot set the UDP send buffer; keeping the kernel's");
    }
    socket.bind(&address.into())?;
    let buffers = SocketBuffers {
        requested: buffer_bytes,
        receive: granted(socket.recv_buffer_size()?),
        send: granted(socket.send_buffer_size()?),
    };
    if buffers.capped() {
        // A kernel setting, the same for every socket: said once per process, then at debug.
        static WARNED: AtomicBool = AtomicBool::new(false);
        let message = "the kernel capped the UDP buffers: raise net.core.rmem_max and \
                       net.core.wmem_max to at least the requested bytes (sysctl -w \
                       net.core.rmem_max=N net.core.wmem_max=N); bursts above the granted bytes \
                       are dropped";
        if WARNED.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                requested = buffers.requested,
                receive = buffers.receive,
                send = buffers.send,
                "{message}"
            );
        } else {
            tracing::warn!(
                requested = buffers.requested,
                receive = buffers.receive,
                send = buffers.send,
                "{message}"
            );
        }
    }
    Ok((socket.into(), buffers))
}

/// The usable bytes of a buffer whose size the kernel reports as `reported`.
fn granted(reported: usize) -> usize {
    // Linux doubles what it grants for its own bookkeeping and reports the doubled figure
    // (socket(7)); the other platforms report what the socket may hold.
    if cfg!(target_os = "linux") {
        reported / 2
    } else {
        reported
    }
}

/// Datagrams the kernel dropped on receive for the UDP socket bound at `local`, where the
/// platform reports them (Linux: the `drops` column of `/proc/net/udp` and `/proc/net/udp6`).
/// `None` elsewhere or when the socket is not listed.
pub fn kernel_receive_drops(local: SocketAddr) -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let table = if local.is_ipv6() {
        "/proc/net/udp6"
    } else {
        "/proc/net/udp"
    };
    let text = std::fs::read_to_string(table).ok()?;
    drops_in_table(&text, local)
}

/// The `drops` of the row for `local` in a `/proc/net/udp{,6}` table.
fn drops_in_table(text: &str, local: SocketAddr) -> Option<u64> {
    let wanted_port = local.port();
    let wanted_ip = match local {
        // A wildcard bind is listed as all zeros, a specific one as the kernel's hex of it.
        SocketAddr::V4(v4) => format!("{:08X}", u32::from_le_bytes(v4.ip().octets())),
        SocketAddr::V6(v6) => v6
            .ip()
            .octets()
            .chunks(4)
            .map(|word| {
                format!(
                    "{:08X}",
                    u32::from_le_bytes([word[0], word[1], word[2], word[3]])
                )
            })
            .collect(),
    };
    text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (ip, port) = fields.get(1)?.split_once(':')?;
        let port = u16::from_str_radix(port, 16).ok()?;
        if port != wanted_port || !ip.eq_ignore_ascii_case(&wanted_ip) {
            return None;
        }
        fields.last()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  123: 0100007F:1B58 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 4242 2 0000000000000000 17
  124: 00000000:1B59 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 4243 2 0000000000000000 0
";

    #[test]
    fn finds_the_drops_of_the_bound_address_and_port() {
        assert_eq!(
            drops_in_table(TABLE, "127.0.0.1:7000".parse().unwrap()),
            Some(17)
        );
        assert_eq!(
            drops_in_table(TABLE, "0.0.0.0:7001".parse().unwrap()),
            Some(0)
        );
        assert_eq!(
            drops_in_table(TABLE, "127.0.0.1:7001".parse().unwrap()),
            None
        );
        assert_eq!(
            drops_in_table("garbage\nnot a table", "127.0.0.1:1".parse().unwrap()),
            None
        );
    }

    #[test]
    fn an_impossible_buffer_is_capped_not_fatal() {
        let (socket, buffers) = bind("127.0.0.1:0".parse().unwrap(), 1 << 30).unwrap();
        assert!(buffers.capped(), "{buffers:?}");
        assert!(buffers.receive > 0 && buffers.send > 0);
        socket.send_to(b"x", socket.local_addr().unwrap()).unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(socket.recv(&mut byte).unwrap(), 1);
    }

    #[test]
    fn a_bound_socket_is_listed_with_its_drops() {
        let (socket, _) = bind("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
        let local = socket.local_addr().unwrap();
        if cfg!(target_os = "linux") && std::path::Path::new("/proc/net/udp").exists() {
            assert_eq!(kernel_receive_drops(local), Some(0));
        } else {
            assert_eq!(kernel_receive_drops(local), None);
        }
    }
}
