//! JSON answers to requests hyper cannot parse at all.
//!
//! hyper answers a request it cannot parse (a malformed request line, raw non-UTF-8 bytes in the
//! path, headers over its buffer, a URI over its length) with its own empty `400`, `431` or
//! `414` and closes the connection, before any handler runs; it has no hook to shape that
//! answer. [`ParseErrorIo`] sits between hyper and the socket and holds back a response head
//! that looks like such an answer (a complete head with one of those statuses, `content-length:
//! 0` and no `content-type`) instead of sending it. Which way it goes is decided by what hyper
//! does next:
//! - hyper reads again or writes more: the held bytes were the tail of an ordinary response
//!   (a body that happens to end with such bytes) and are sent unchanged first, so no response
//!   is ever altered;
//! - the connection ends with a parse error: [`ParseErrorAnswer::answer`] sends the JSON error
//!   (`400 bad_request`, `431 headers_too_large`, `414 uri_too_long`) in their place.
//!
//! The socket is shared (`Arc<TcpStream>`) so that the answer can be written after hyper has
//! dropped its half. Writes stay vectored (hyper queues body chunks without copying them); the
//! look-back is to the end of the last slice of a write, where hyper's bodiless answer sits.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Longest held-back head looked for at the end of a write.
const MAX_HEAD_BYTES: usize = 256;

/// Most header lines looked at in a held-back head (hyper's own answer has two).
const MAX_HEAD_HEADERS: usize = 8;

/// hyper's side of a connection, and the bytes it asked to send that are held back.
#[derive(Debug)]
pub(crate) struct ParseErrorIo {
    stream: Arc<TcpStream>,
    held: Arc<Mutex<Held>>,
}

#[derive(Debug, Default)]
struct Held {
    /// Bytes hyper counts as sent that are not, yet.
    bytes: Vec<u8>,
    /// How many of them have been sent since they were released.
    sent: usize,
}

/// The serve task's handle on a connection, to answer after hyper is done with it.
#[derive(Debug)]
pub(crate) struct ParseErrorAnswer {
    stream: Arc<TcpStream>,
    held: Arc<Mutex<Held>>,
}

impl ParseErrorIo {
    pub(crate) fn new(stream: TcpStream) -> (Self, ParseErrorAnswer) {
        let stream = Arc::new(stream);
        let held = Arc::<Mutex<Held>>::default();
        (
            Self {
                stream: stream.clone(),
                held: held.clone(),
            },
            ParseErrorAnswer { stream, held },
        )
    }

    /// Sends what is held back; `Ready(Ok)` once it is all out.
    fn poll_release(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        while held.sent < held.bytes.len() {
            ready!(self.stream.poll_write_ready(cx))?;
            let sent = held.sent;
            match self.stream.try_write(&held.bytes[sent..]) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(written) => held.sent += written,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        held.bytes.clear();
        held.sent = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_send(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

impl ParseErrorIo {
    fn poll_send_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

impl AsyncRead for ParseErrorIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // hyper reads on: what it wrote before was not its parse-error answer.
        ready!(self.poll_release(cx))?;
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            match self.stream.try_read(buf.initialize_unfilled()) {
                Ok(read) => {
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncWrite for ParseErrorIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_release(cx))?;
        match automatic_answer_at(buf) {
            // Everything before the candidate goes out first; hyper calls again with the rest.
            Some(start) if start > 0 => self.poll_send(cx, &buf[..start]),
            Some(_) => {
                let mut held = self
                    .held
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner());
                held.bytes.extend_from_slice(buf);
                Poll::Ready(Ok(buf.len()))
            }
            None => self.poll_send(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_release(cx))?;
        // hyper's answer is a head alone: the last non-empty slice, ending the write.
        let Some(last) = bufs.iter().rposition(|buf| !buf.is_empty()) else {
            return Poll::Ready(Ok(0));
        };
        if automatic_answer_at(&bufs[last]).is_some() {
            if bufs[..last].iter().any(|buf| !buf.is_empty()) {
                // What comes before it goes out first; hyper calls again with the rest.
                return self.poll_send_vectored(cx, &bufs[..last]);
            }
            return self.poll_write(cx, &bufs[last]);
        }
        self.poll_send_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        // hyper then queues body chunks instead of copying them into its own buffer (up to
        // its buffer size per connection: with 250 clients reading a 5 MB object that copy
        // held over 100 MB).
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // TCP has no user-space buffer here; held bytes wait for hyper's next move.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let holding = !self
            .held
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .bytes
            .is_empty();
        if holding {
            // Left to `ParseErrorAnswer::answer`, which knows how the connection ended.
            return Poll::Ready(Ok(()));
        }
        Poll::Ready(shutdown_write(&self.stream))
    }
}

impl ParseErrorAnswer {
    /// After hyper returned: on a parse error, sends the JSON answer in place of hyper's held
    /// one (and returns its error code); otherwise sends whatever is still held unchanged.
    pub(crate) async fn answer(self, parse_error: bool) -> Option<&'static str> {
        let held = std::mem::take(
            &mut *self
                .held
                .lock()
                .unwrap_or_else(|poison| poison.into_inner()),
        );
        let rest = &held.bytes[held.sent..];
        if rest.is_empty() {
            return None;
        }
        let (bytes, code) = match (parse_error, automatic_answer_status(rest)) {
            (true, Some(status)) => {
                let (code, body) = json_answer(status);
                (body, Some(code))
            }
            _ => (rest.to_vec(), None),
        };
        let mut sent = 0;
        while sent < bytes.len() {
            if self.stream.writable().await.is_err() {
                break;
            }
            match self.stream.try_write(&bytes[sent..]) {
                Ok(0) => break,
                Ok(written) => sent += written,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => break,
            }
        }
        let _ = shutdown_write(&self.stream);
        code
    }
}

/// Sends FIN after what was written, as hyper's own shutdown would: a client then reads the
/// whole answer and its end even when the close that follows resets the connection (request
/// bytes left unread, such as a body refused with `413`).
fn shutdown_write(stream: &TcpStream) -> io::Result<()> {
    socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write)
}

/// Where a write ends with what looks like hyper's automatic answer, its start. Only the last
/// [`MAX_HEAD_BYTES`] are looked at (hyper's answer is under 100 bytes), so a large body costs
/// nothing to check.
fn automatic_answer_at(buf: &[u8]) -> Option<usize> {
    const START: &[u8] = b"HTTP/1.1 ";
    if !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let from = buf.len().saturating_sub(MAX_HEAD_BYTES);
    let start = from + buf[from..].windows(START.len()).rposition(|w| w == START)?;
    automatic_answer_status(&buf[start..]).map(|_| start)
}

/// The status of `head` if it is exactly one complete response head with a status hyper
/// answers parse errors with, an empty body and no content type.
fn automatic_answer_status(head: &[u8]) -> Option<u16> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEAD_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(length) = response.parse(head).ok()? else {
        return None;
    };
    let status = response.code?;
    let empty = response
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("content-length") && h.value == b"0");
    let typed = response
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("content-type"));
    (length == head.len() && matches!(status, 400 | 414 | 431) && empty && !typed).then_some(status)
}

/// The JSON answer that replaces hyper's empty one: its error code and the whole response.
fn json_answer(status: u16) -> (&'static str, Vec<u8>) {
    let (reason, code, message) = match status {
        431 => (
            "Request Header Fields Too Large",
            "headers_too_large",
            "the request's headers are larger than the server reads",
        ),
        414 => (
            "URI Too Long",
            "uri_too_long",
            "the request's URI is longer than the server reads",
        ),
        _ => (
            "Bad Request",
            "bad_request",
            "the request could not be parsed as HTTP/1.1 (request line, path bytes or headers)",
        ),
    };
    let body = json!({ "error": code, "message": message }).to_string();
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    (code, response.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_empty_answers_are_candidates() {
        let canned = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 16:00:00 GMT\r\n\r\n";
        assert_eq!(automatic_answer_status(canned), Some(400));
        let mut after_body = b"abcHTTP/1.1 ".to_vec();
        after_body.extend_from_slice(canned);
        assert_eq!(automatic_answer_at(&after_body), Some(12));
        let large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(automatic_answer_status(large), Some(431));
        // Our own JSON errors, other statuses, a head with a body or cut short: not candidates.
        let json = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(automatic_answer_status(json), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(automatic_answer_at(ok), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx";
        assert_eq!(automatic_answer_at(with_body), None);
        assert_eq!(automatic_answer_at(&canned[..canned.len() - 2]), None);
    }

    #[test]
    fn the_json_answer_is_well_formed() {
        for status in [400, 414, 431] {
            let (code, answer) = json_answer(status);
            let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let body: serde_json::Value = serde_json::from_slice(&answer[split + 4..]).unwrap();
            assert_eq!(body["error"], code);
            let head = String::from_utf8_lossy(&answer[..split]).to_string();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(head.contains(&format!("content-length: {}", answer.len() - split - 4)));
        }
    }
}
