//! The control connection: one TCP stream, one text line per message.
//!
//! ```text
//! client: uroce-perf 1                 server: uroce-perf 1   (or: error <why>, then close)
//! client: run <test> <params>          server: ready <port or endpoint hex> | error <why>
//! client: peer <endpoint hex>          (RDMA tests: the client's QP)
//! server: go                           both run the test
//! client: stop                         server: done user=<s> sys=<s> secs=<s> msgs=<n> bytes=<n>
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;

/// A line-oriented control connection.
pub(crate) struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Control {
    pub(crate) fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(Self { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    pub(crate) fn send(&mut self, line: &str) -> io::Result<()> {
        self.writer.write_all(line.as_bytes())?;
        self.writer.write_all(b"\n")?;
        self.writer.flush()
    }

    /// The next line, without its newline; an error at end of stream.
    pub(crate) fn recv(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the control connection",
            ));
        }
        Ok(line.trim_end().to_string())
    }
}

/// Hex of bytes, for endpoints on the text protocol.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of hex; `None` if malformed.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Endpoints as comma-separated hex (one per QP).
pub(crate) fn endpoints_hex(list: &[uroce::Endpoint]) -> String {
    list.iter().map(|e| hex(&e.to_bytes())).collect::<Vec<_>>().join(",")
}

/// Parses [`endpoints_hex`].
pub(crate) fn endpoints_from_hex(s: &str) -> Result<Vec<uroce::Endpoint>, String> {
    s.split(',')
        .map(|h| {
            let bytes = unhex(h).ok_or("an endpoint is not hex")?;
            uroce::Endpoint::from_bytes(&bytes).map_err(|e| e.to_string())
        })
        .collect()
}
