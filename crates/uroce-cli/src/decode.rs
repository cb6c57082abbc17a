//! `uroce decode`: one line per RoCEv2 packet, with its ICRC checked.
//!
//! tshark decodes RoCEv2 but never checks the ICRC; this does, over exactly the bytes given:
//! for a hex line the IP and UDP headers are taken as they are (their length fields included),
//! for a capture the frame is cut at the IP length so link-layer padding does not count.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, Read, Write};

use uroce_wire::icrc::{self, PseudoHeader};
use uroce_wire::ip::{UdpDatagram, parse_udp_datagram, parse_udp_datagram_lenient};
use uroce_wire::{PacketRepr, ROCE_V2_PORT, bth, pcap};

/// Exit statuses.
const OK: u8 = 0;
const BAD_PACKET: u8 = 1;
const UNUSABLE: u8 = 2;

/// Decodes every file, printing packet lines to `out` and problems to `err`; returns the exit
/// status.
pub(crate) fn run(files: &[OsString], out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let mut status = OK;
    // A file whose every packet has been printed before what ended the reading is reported:
    // a truncated capture keeps its complete packets, as tshark keeps them.
    let prefix_names = files.len() > 1;
    for file in files {
        let name = file.to_string_lossy();
        let bytes = match read_input(file) {
            Ok(b) => b,
            Err(e) => {
                let _ = writeln!(err, "uroce: {name}: {e}");
                status = UNUSABLE;
                continue;
            }
        };
        if bytes.is_empty() {
            let _ = writeln!(err, "uroce: {name}: empty file: neither a capture nor hex text");
            status = UNUSABLE;
            continue;
        }
        let prefix = if prefix_names { format!("{name}: ") } else { String::new() };
        let result = if pcap::looks_like_capture(&bytes) {
            decode_capture(&bytes, &prefix, out)
        } else {
            decode_hex(&bytes, &prefix, out)
        };
        match result {
            Ok(summary) => {
                if summary.packets == 0 && summary.skipped == 0 {
                    let _ = writeln!(err, "uroce: {name}: no packets");
                }
                if let Some(problem) = &summary.cut_short {
                    let _ = writeln!(
                        err,
                        "uroce: {name}: {problem}, after {} complete frame(s)",
                        summary.packets + summary.skipped
                    );
                    status = UNUSABLE;
                }
                if summary.bad > 0 {
                    status = status.max(BAD_PACKET);
                }
                if summary.skipped > 0 {
                    let _ = writeln!(
                        err,
                        "uroce: {name}: {} frame(s) skipped: not UDP to port {ROCE_V2_PORT}",
                        summary.skipped
                    );
                }
                if summary.bad > 0 {
                    let _ = writeln!(
                        err,
                        "uroce: {name}: {} of {} packet(s) failed to parse or verify",
                        summary.bad, summary.packets
                    );
                }
            }
            Err(problem) => {
                let _ = writeln!(err, "uroce: {name}: {problem}");
                status = UNUSABLE;
            }
        }
    }
    status
}

fn read_input(file: &OsString) -> io::Result<Vec<u8>> {
    if file == "-" {
        let mut b = Vec::new();
        io::stdin().lock().read_to_end(&mut b)?;
        Ok(b)
    } else {
        std::fs::read(file)
    }
}

#[derive(Default)]
struct Summary {
    packets: usize,
    bad: usize,
    skipped: usize,
    /// What ended a capture early (its frames before it were decoded).
    cut_short: Option<String>,
}

impl Summary {
    fn add(&mut self, good: bool) {
        self.packets += 1;
        if !good {
            self.bad += 1;
        }
    }
}

fn decode_capture(bytes: &[u8], prefix: &str, out: &mut dyn Write) -> Result<Summary, String> {
    let (frames, problem) = pcap::read_frames_partial(bytes);
    if frames.is_empty()
        && let Some(p @ (pcap::ReadError::NotPcap | pcap::ReadError::BadBlock(_))) = &problem
    {
        return Err(p.to_string());
    }
    let mut summary = decode_frames(&frames, prefix, out);
    summary.cut_short = problem.map(|p| p.to_string());
    Ok(summary)
}

/// Decodes the frames of a capture, one line each.
fn decode_frames(frames: &[pcap::Frame<'_>], prefix: &str, out: &mut dyn Write) -> Summary {
    let mut summary = Summary::default();
    for frame in frames {
        let label = format!("{prefix}#{}", frame.number);
        let Some(ip_packet) = frame.ip_packet() else {
            summary.skipped += 1;
            continue;
        };
        let datagram = match parse_udp_datagram(ip_packet) {
            Ok(d) if d.udp.dst_port == ROCE_V2_PORT => d,
            Ok(_) | Err(uroce_wire::Error::NotUdp) => {
                summary.skipped += 1;
                continue;
            }
            Err(e) => {
                summary.add(false);
                line(out, &format!("{label} error=\"{e}\""));
                continue;
            }
        };
        let (text, good) = describe(&datagram);
        if !good && let Some((size, pseudo, id)) = gso_run(&datagram) {
            // One segmented send the capture took before the kernel cut it: each segment as
            // it went on the wire, with the identification the kernel gave it.
            let n = datagram.payload.len().div_ceil(size);
            for (k, seg) in datagram.payload.chunks(size).enumerate() {
                let id = id.wrapping_add(u16::try_from(k).unwrap_or(0));
                let icrc_ok = icrc::verify(&pseudo.with_ipv4_id(id), seg).is_ok();
                let head = format!("{} > {} ", datagram.src(), datagram.dst());
                let (text, good) = describe_roce(head, seg, icrc_ok);
                summary.add(good);
                line(out, &format!("{label}.{k} {text} (GSO segment {}/{n})", k + 1));
            }
            continue;
        }
        summary.add(good);
        line(out, &format!("{label} {text}"));
    }
    summary
}

/// A datagram captured before the kernel cut it into the datagrams of a segmented send (UDP
/// GSO: loopback, and interfaces that segment in hardware, show it whole): if its payload is a
/// run of packets of one size (the last may be shorter) whose first verifies, the segment size,
/// the pseudo-header of the segments and the first one's IPv4 identification (segment k
/// carries the first's plus k). Any size is tried, from the first packet's headers alone (a run
/// of ACKs) to a 4096-byte payload, in steps of 4: a packet is padded to a multiple of 4 bytes
/// (IBA 9.2), and headers and ICRC are multiples of 4 too.
fn gso_run(d: &UdpDatagram<'_>) -> Option<(usize, PseudoHeader, u16)> {
    let first = bth::Packet::new_checked(d.payload).ok()?;
    let info = bth::Repr::parse(&first).ok()?.opcode.info()?;
    let id = match d.ip {
        uroce_wire::ip::IpRepr::V4(v4) => v4.ident,
        uroce_wire::ip::IpRepr::V6(_) => 0,
    };
    let pseudo = PseudoHeader::for_endpoints(d.src(), d.dst()).ok()?;
    let first = pseudo.with_ipv4_id(id);
    let smallest = info.header_len + icrc::ICRC_LEN;
    // The largest IB path MTU (IBA 7.7.1).
    let largest = (smallest + 4096).min(d.payload.len().saturating_sub(1));
    (smallest..=largest)
        .step_by(4)
        .find(|&size| icrc::verify(&first, &d.payload[..size]).is_ok())
        .map(|size| (size, pseudo, id))
}

/// `uroce decode -f FILE`: decodes a capture as it is written (by `uroce capture -w` or
/// `UROCE_PCAP`), printing each frame once it is complete, until `stop` says so or, with
/// `idle`, the file has not grown for that long.
pub(crate) fn follow(
    file: &OsString,
    idle: Option<core::time::Duration>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let name = file.to_string_lossy();
    let mut f = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(err, "uroce: {name}: {e}");
            return UNUSABLE;
        }
    };
    let mut bytes = Vec::new();
    let mut printed = 0;
    let mut status = OK;
    #[expect(clippy::disallowed_methods, reason = "a tool's own timing")]
    let mut grew = std::time::Instant::now();
    loop {
        match f.read_to_end(&mut bytes) {
            Ok(0) => {}
            Ok(_) => {
                #[expect(clippy::disallowed_methods, reason = "a tool's own timing")]
                let now = std::time::Instant::now();
                grew = now;
            }
            Err(e) => {
                let _ = writeln!(err, "uroce: {name}: {e}");
                return UNUSABLE;
            }
        }
        // A file still being created may not have its header yet.
        if bytes.len() >= 24 {
            let (frames, problem) = pcap::read_frames_partial(&bytes);
            if let Some(p @ (pcap::ReadError::NotPcap | pcap::ReadError::BadBlock(_))) = &problem {
                let _ = writeln!(err, "uroce: {name}: {p}");
                return UNUSABLE;
            }
            if frames.len() > printed {
                let s = decode_frames(&frames[printed..], "", out);
                if s.bad > 0 {
                    status = BAD_PACKET;
                }
                printed = frames.len();
                let _ = out.flush();
            }
        }
        if idle.is_some_and(|d| grew.elapsed() >= d) {
            return status;
        }
        #[expect(clippy::disallowed_methods, reason = "waiting for the file to grow")]
        std::thread::sleep(core::time::Duration::from_millis(50));
    }
}

/// The decode line of one RoCEv2 packet given as its datagram's addresses and bytes (what
/// `uroce capture` prints live).
pub(crate) fn describe_packet(
    src: core::net::SocketAddr,
    dst: core::net::SocketAddr,
    roce: &[u8],
) -> String {
    let mut frame = Vec::new();
    if let Err(e) = pcap::ethernet_frame(src, dst, roce, &mut frame) {
        return format!("{src} > {dst} error=\"{e}\"");
    }
    let parsed = pcap::ip_packet(pcap::LinkType::ETHERNET, &frame).map(parse_udp_datagram);
    match parsed {
        Some(Ok(d)) => describe(&d).0,
        Some(Err(e)) => format!("{src} > {dst} error=\"{e}\""),
        None => format!("{src} > {dst} error=\"not IP\""),
    }
}

fn decode_hex(bytes: &[u8], prefix: &str, out: &mut dyn Write) -> Result<Summary, String> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| "not pcap, pcapng or hex text".to_string())?;
    // Parse every line before printing anything, so that a file that is not hex at all gives
    // one clear error rather than a screen of packets and then an error.
    let mut packets = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let (name, data) = parse_hex_line(content)
            .map_err(|why| format!("line {}: {why} (not pcap, pcapng or hex text)", i + 1))?;
        packets.push((name.map_or_else(|| format!("line {}", i + 1), str::to_string), data));
    }
    let mut summary = Summary::default();
    for (name, data) in packets {
        let label = format!("{prefix}{name}");
        match parse_udp_datagram_lenient(&data) {
            Ok(d) => {
                let (text, good) = describe(&d);
                summary.add(good);
                line(out, &format!("{label} {text}"));
            }
            Err(e) => {
                summary.add(false);
                line(out, &format!("{label} error=\"{e}\""));
            }
        }
    }
    Ok(summary)
}

/// One packet's line (after the label) and whether it parsed and verified.
fn describe(d: &UdpDatagram<'_>) -> (String, bool) {
    // Not RoCE, and nothing wrong: what two uroce processes sharing a device send themselves
    // (a capture on `lo` holds them).
    if let Some(probe) = uroce_wire::steer_probe::Probe::parse(d.payload) {
        return (format!("{} > {} {probe}", d.src(), d.dst()), true);
    }
    let icrc_ok = PseudoHeader::from_headers(d.headers)
        .and_then(|pseudo| icrc::verify(&pseudo, d.payload))
        .is_ok();
    describe_roce(format!("{} > {} ", d.src(), d.dst()), d.payload, icrc_ok)
}

/// A RoCE packet's line, after `s` (its addresses), given whether its ICRC verified; and
/// whether it parsed and verified.
fn describe_roce(mut s: String, roce: &[u8], icrc_ok: bool) -> (String, bool) {
    let parsed_ok = match PacketRepr::parse_ignoring_icrc(roce) {
        Ok(p) => {
            let _ = write!(s, "{}", p.repr);
            match uroce_wire::mad::gmp_payload(&p.repr) {
                Ok(mad) => match describe_mad(mad) {
                    Ok(m) => {
                        let _ = write!(s, " {m}");
                        true
                    }
                    Err(e) => {
                        let _ = write!(s, " error=\"{e}\"");
                        false
                    }
                },
                Err(_) => true,
            }
        }
        Err(e) => {
            // Show what can be read: the BTH, if there is one.
            if let Ok(b) = bth::Packet::new_checked(roce).and_then(|p| bth::Repr::parse(&p)) {
                let _ = write!(s, "{b} ");
            }
            let _ = write!(s, "error=\"{e}\"");
            false
        }
    };
    let _ = write!(s, " icrc={}", if icrc_ok { "ok" } else { "BAD" });
    (s, icrc_ok && parsed_ok)
}

/// A MAD to QP1, as the CM reads it: the message's fields, then the RDMA CM header of a
/// request (the connection's IP addresses and port) and the private data, without the
/// padding zeros.
fn describe_mad(mad: &[u8]) -> Result<String, uroce_wire::Error> {
    use uroce_wire::cm::{CmMad, Message};
    let m = CmMad::parse(mad)?;
    let mut s = m.to_string();
    let private = match &m.message {
        Message::Req(r) => r.private_data,
        Message::SidrReq(r) => r.private_data,
        Message::Rep(r) => r.private_data,
        Message::Rej(r) => r.private_data,
        Message::Mra(r) => r.private_data,
        Message::Rtu(r) | Message::Drep(r) => r.private_data,
        Message::Dreq(r) => r.private_data,
        Message::SidrRep(r) => r.private_data,
    };
    let request = matches!(m.message, Message::Req(_) | Message::SidrReq(_));
    let mut user = private;
    if request && let Ok(h) = uroce_wire::cma::Header::parse(private) {
        let _ = write!(s, " cma(src={}:{} dst={})", h.src, h.src_port, h.dst);
        if let Some((space, port)) = match m.message {
            Message::Req(r) => uroce_wire::cma::PortSpace::of_service_id(r.service_id),
            Message::SidrReq(r) => uroce_wire::cma::PortSpace::of_service_id(r.service_id),
            _ => None,
        } {
            let _ = write!(s, " ps={space:?} port={port}");
        }
        user = &private[uroce_wire::cma::HEADER_LEN..];
    }
    let used = user.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let _ = write!(s, " private={}", if used == 0 { "-".to_owned() } else { hex(&user[..used]) });
    Ok(s)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut acc, b| {
        let _ = write!(acc, "{b:02x}");
        acc
    })
}

/// Reads `[name] hex...`: if every token is hex the whole line is data, otherwise the first
/// token is the packet's name. Colons between bytes are allowed.
fn parse_hex_line(content: &str) -> Result<(Option<&str>, Vec<u8>), String> {
    let tokens: Vec<&str> = content.split_whitespace().collect();
    let is_hex = |t: &str| t.chars().all(|c| c.is_ascii_hexdigit() || c == ':');
    let (name, data_tokens) = if tokens.iter().all(|t| is_hex(t)) {
        (None, &tokens[..])
    } else {
        (tokens.first().copied(), &tokens[1..])
    };
    let digits: String = data_tokens.concat().chars().filter(|&c| c != ':').collect();
    if digits.is_empty() {
        return Err("no hex bytes".into());
    }
    if let Some(bad) = digits.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("'{bad}' is not a hex digit"));
    }
    if !digits.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    let bytes = (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect::<Result<Vec<u8>, String>>()?;
    Ok((name, bytes))
}

fn line(out: &mut dyn Write, text: &str) {
    let _ = writeln!(out, "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_lines_with_and_without_names() {
        assert_eq!(parse_hex_line("45 00 0a").unwrap(), (None, vec![0x45, 0, 0x0a]));
        assert_eq!(parse_hex_line("ack 4500:0a").unwrap(), (Some("ack"), vec![0x45, 0, 0x0a]));
        assert!(parse_hex_line("ack 450").unwrap_err().contains("odd"));
        assert!(parse_hex_line("hello world").unwrap_err().contains("not a hex digit"));
        assert!(parse_hex_line("name").unwrap_err().contains("no hex"));
    }
}
