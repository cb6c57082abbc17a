//! `uroce`: the command-line tool of the uroce user-space RoCEv2 stack.
// Unsafe code only in the module that calls a system's libibverbs (`perf::backend::libibverbs`).
#![deny(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

mod capture;
mod decode;
mod exec;
mod host_view;
mod perf;
mod qp;
mod stat;

const USAGE: &str = "\
uroce: RoCEv2 RDMA in user space

Usage:
  uroce compare [OPTIONS]        Measure RDMA against TCP on loopback and write a report
  uroce decode FILE...           Decode RoCEv2 packets and verify their ICRC
  uroce exec [--addr A,…] -- CMD Run an unmodified program on uroce (drop-in libraries and the
                                 /dev/infiniband and /sys/class/infiniband view)
  uroce stat [DEVICE…] [-i SECS [-c N]] [--json]
                                 A device's counters, summed over its processes (rxe's names)
  uroce qp [DEVICE…] [--json] [--watch [-i SECS] [-D SECS]]
                                 Every QP on the host with its process, state and counters
  uroce capture [DEVICE…] [-w FILE] [-c COUNT] [--qp N] [-D SECS]
                                 Capture a running device's packets (every process, every path)
  uroce list                     List the tests, one line each
  uroce server [OPTIONS]         Wait for clients and answer their tests
  uroce client SERVER TEST... [OPTIONS]
                                 Run tests against a server, print each result
  uroce help                     Show this help
  uroce --version                Show the version

compare options:
  --quick          a reduced matrix (under 30 seconds)
  --sizes LIST     comma-separated sizes (default 64,1K,16K,256K,4M)
  --duration SECS  seconds per test, size and repeat (default 0.3; quick 0.1)
  --repeat N       measure every point N times, in rounds over the matrix (default 3): the
                   report gives each point's median and its spread; with 3 or more, a
                   point whose repeats span over a quarter of their median runs twice more
  --out DIR        where the report goes (default uroce-report)
  --with-peers     also run sockperf, qperf and iperf3 for TCP, and perftest for RDMA on the
                   same devices (each when installed), for the report
  --local ADDR     the client's device (default 127.0.0.2)
  --server ADDR    the server's device and control address (default 127.0.0.3)
  --verbs [--device NAME] [--gid N]
                   also run every RDMA series on a device of the system's libibverbs (both
                   sides on that device), each row labelled with it

server options:
  --addr ADDR      this side's address: TCP control and RDMA device (default 127.0.0.3)
  --port P         control port (default 19765)

server and client, the RDMA stack (both sides choose their own):
  --verbs          run the RDMA tests on a device of the system's libibverbs.so.1 (a hardware
                   RNIC, rxe, or uroce's drop-in under 'uroce exec') instead of uroce's API;
                   UROCE_LIBIBVERBS=FILE loads another file
  --device NAME    with --verbs: the device (default: the first listed)
  --gid N          with --verbs: the GID index of port 1 (default 0)

client options:
  --local ADDR     this side's RDMA device (default 127.0.0.2)
  --port P         the server's control port (default 19765)
  -s SIZE          message size, with K/M/G suffixes (default 64)
  -a               every power of two from 1 B to 4 MiB
  --sizes LIST     comma-separated sizes
  -n ITERS         measured iterations (default 10000)
  -D SECONDS       run each test for this long instead
  --warmup N       unmeasured iterations first (default 100)
  --json           one JSON object per result instead of the table
  --mtu M          RDMA path MTU: 256, 512, 1024, 2048 or 4096 (default: the ports' active
                   MTU, the smaller of the two sides': 4096 on loopback, 1024 on a 1500-byte link)
  --depth N        RDMA messages in flight for streaming tests (default 128, as perftest)
  --events         RDMA: sleep on completion events instead of busy polling
  --inline N       RDMA: SENDs of at most N bytes go inline (N <= 1024)
  --post-list N    RDMA streams: post N work requests back to back (default 1)
  --qps N          RDMA streams: spread the work over N QPs (default 1)
  --no-nodelay     TCP: leave Nagle's algorithm on
  --busy-poll      TCP/UDP: spin on non-blocking sockets instead of sleeping
  --sockbuf SIZE   TCP/UDP: send and receive buffer size
  --pin C,S        pin the client's test thread to CPU C and the server's to CPU S

stat, qp and capture look at the devices in use on this host from outside the programs using
them, without restarting anything. DEVICE is an address or a configured name (uroce0, …); none
means every device. A user sees only their own devices' processes (root sees all).
  -i SECS   stat: print the rates over each interval; qp --watch: how often to look (0.1)
  -c N      stat: stop after N intervals; capture: after N packets
  -D SECS   qp --watch, capture: stop after this long (default: at Ctrl-C)
  -w FILE   capture: write pcap (for Wireshark) instead of printing decoded lines
  --qp N    capture: only the packets of QP N (to it, from it)

decode -f FILE follows a capture as it is written (-D SECS: stop once it has not grown for that
long).

decode reads pcap/pcapng captures (Ethernet, raw IP, Linux cooked, loopback) or text files with
one packet per line in hex, from the first byte of the IP header through the ICRC, optionally
preceded by a name; '#' starts a comment and '-' reads standard input. It prints one line per
packet and ends with status 0 when every packet parsed and its ICRC verified, 1 when any did
not, 2 when an input could not be read.
";

fn main() -> ExitCode {
    let mut parser = lexopt::Parser::from_env();
    let result = run(&mut parser);
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(io::stderr(), "uroce: {e}\nTry 'uroce help'.");
            ExitCode::from(2)
        }
    }
}

fn run(parser: &mut lexopt::Parser) -> Result<ExitCode, lexopt::Error> {
    use lexopt::prelude::*;
    let Some(arg) = parser.next()? else {
        print!("{USAGE}");
        return Ok(ExitCode::from(2));
    };
    match arg {
        Value(cmd) if cmd == "exec" => {
            // Everything after `exec` is ours to read (and then the command's): lexopt would
            // take the command's own options for ours.
            let rest: Vec<std::ffi::OsString> = parser.raw_args()?.collect();
            let message = exec::run(rest);
            let help = message == exec::USAGE;
            let _ = writeln!(io::stderr(), "{message}");
            Ok(ExitCode::from(if help { 0 } else { 127 }))
        }
        Value(cmd) if cmd == "stat" => inspect_command(parser, Inspect::Stat),
        Value(cmd) if cmd == "qp" => inspect_command(parser, Inspect::Qp),
        Value(cmd) if cmd == "capture" => inspect_command(parser, Inspect::Capture),
        Value(cmd) if cmd == "decode" => {
            let mut files = Vec::new();
            let mut follow = false;
            let mut idle = None;
            while let Some(arg) = parser.next()? {
                match arg {
                    Value(v) => files.push(v),
                    Short('f') | Long("follow") => follow = true,
                    Short('D') => idle = Some(seconds(&parser.value()?, "-D")?),
                    Short('h') | Long("help") => {
                        print!("{USAGE}");
                        return Ok(ExitCode::SUCCESS);
                    }
                    _ => return Err(arg.unexpected()),
                }
            }
            if files.is_empty() {
                return Err("decode needs at least one FILE".into());
            }
            if follow {
                let [file] = &files[..] else {
                    return Err("decode -f follows exactly one FILE".into());
                };
                let stdout = io::stdout();
                let code = decode::follow(file, idle, &mut stdout.lock(), &mut io::stderr());
                return Ok(ExitCode::from(code));
            }
            let stdout = io::stdout();
            let code = decode::run(&files, &mut stdout.lock(), &mut io::stderr());
            Ok(ExitCode::from(code))
        }
        Value(cmd) if cmd == "list" => {
            if let Some(arg) = parser.next()? {
                if matches!(arg, Short('h') | Long("help")) {
                    print!("{USAGE}");
                    return Ok(ExitCode::SUCCESS);
                }
                return Err(arg.unexpected());
            }
            for t in &perf::TESTS {
                println!("{:<24}{}", t.name, t.about);
            }
            Ok(ExitCode::SUCCESS)
        }
        Value(cmd) if cmd == "server" => server(parser),
        Value(cmd) if cmd == "compare" => compare(parser),
        Value(cmd) if cmd == "client" => client(parser),
        Value(cmd) if cmd == "help" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        Short('h') | Long("help") => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        Short('V') | Long("version") => {
            println!("uroce {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Value(cmd) => Err(format!("unknown command '{}'", cmd.to_string_lossy()).into()),
        _ => Err(arg.unexpected()),
    }
}

/// The three commands that look at running devices.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inspect {
    Stat,
    Qp,
    Capture,
}

/// A duration in seconds, checked.
fn seconds(v: &std::ffi::OsStr, what: &str) -> Result<core::time::Duration, lexopt::Error> {
    let text = v.to_string_lossy();
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 86_400.0 => Ok(core::time::Duration::from_secs_f64(s)),
        _ => {
            Err(format!("{what}: '{text}' is not a number of seconds (above 0, at most a day)")
                .into())
        }
    }
}

fn inspect_command(parser: &mut lexopt::Parser, which: Inspect) -> Result<ExitCode, lexopt::Error> {
    use lexopt::prelude::*;
    let name = match which {
        Inspect::Stat => "stat",
        Inspect::Qp => "qp",
        Inspect::Capture => "capture",
    };
    let (mut devices, mut json, mut watch) = (Vec::new(), false, false);
    let (mut interval, mut count, mut duration, mut write, mut qpn) =
        (None, None, None, None, None);
    while let Some(arg) = parser.next()? {
        match arg {
            Value(v) => devices.push(
                host_view::parse_device(&v.to_string_lossy())
                    .map_err(|e| format!("{name}: {e}"))?,
            ),
            Long("json") if which != Inspect::Capture => json = true,
            Long("watch") if which == Inspect::Qp => watch = true,
            Short('i') if which != Inspect::Capture => {
                interval = Some(seconds(&parser.value()?, "-i")?);
            }
            Short('c') if which != Inspect::Qp => {
                let v = parser.value()?;
                let n: u64 =
                    v.to_string_lossy().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                        format!("-c: '{}' is not a count above 0", v.to_string_lossy())
                    })?;
                count = Some(n);
            }
            Short('D') if which != Inspect::Stat => {
                duration = Some(seconds(&parser.value()?, "-D")?)
            }
            Short('w') if which == Inspect::Capture => write = Some(parser.value()?.into()),
            Long("qp") if which == Inspect::Capture => {
                let v = parser.value()?.to_string_lossy().to_string();
                let parsed = match v.strip_prefix("0x") {
                    Some(hex) => u32::from_str_radix(hex, 16).ok(),
                    None => v.parse().ok(),
                };
                qpn = Some(
                    parsed
                        .filter(|&n| n < 1 << 24)
                        .ok_or_else(|| format!("--qp: '{v}' is not a QPN (below 2^24)"))?,
                );
            }
            Short('h') | Long("help") => {
                print!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    let stdout = io::stdout();
    let (mut out, mut err) = (stdout.lock(), io::stderr());
    let code = match which {
        Inspect::Stat => {
            let args = stat::StatArgs { devices, interval, count, json };
            stat::run(&args, &mut out, &mut err)
        }
        Inspect::Qp => {
            let interval = interval.unwrap_or(core::time::Duration::from_millis(100));
            let args = qp::QpArgs { devices, json, watch, interval, duration };
            qp::run(&args, &mut out, &mut err)
        }
        Inspect::Capture => {
            drop(out);
            let args = capture::CaptureArgs { devices, write, count, qp: qpn, duration };
            let stdout = io::stdout();
            capture::run(&args, &mut stdout.lock(), &mut err)
        }
    };
    Ok(ExitCode::from(code))
}

fn parse_addr(v: &std::ffi::OsStr, what: &str) -> Result<std::net::IpAddr, lexopt::Error> {
    v.to_string_lossy()
        .parse()
        .map_err(|_| format!("{what}: '{}' is not an IP address", v.to_string_lossy()).into())
}

/// `--verbs [--device NAME] [--gid N]`: the RDMA tests on a device of the system's
/// libibverbs instead of uroce's own API.
#[derive(Default)]
struct VerbsArgs {
    verbs: bool,
    device: Option<String>,
    gid: Option<u32>,
}

impl VerbsArgs {
    /// `--gid N`.
    fn gid(&mut self, parser: &mut lexopt::Parser) -> Result<(), lexopt::Error> {
        use lexopt::ValueExt as _;
        let v: String = parser.value()?.parse()?;
        self.gid = Some(v.parse().map_err(|_| format!("--gid: '{v}' is not a GID index"))?);
        Ok(())
    }

    fn stack(&self) -> Result<perf::Stack, lexopt::Error> {
        if !self.verbs && (self.device.is_some() || self.gid.is_some()) {
            return Err("--device and --gid choose a libibverbs device: add --verbs".into());
        }
        Ok(if self.verbs {
            perf::Stack::Verbs { device: self.device.clone(), gid_index: self.gid.unwrap_or(0) }
        } else {
            perf::Stack::Uroce { udp_only: false }
        })
    }
}

fn server(parser: &mut lexopt::Parser) -> Result<ExitCode, lexopt::Error> {
    use lexopt::prelude::*;
    let mut addr: std::net::IpAddr = std::net::Ipv4Addr::new(127, 0, 0, 3).into();
    let mut port = perf::DEFAULT_PORT;
    let mut verbs = VerbsArgs::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("verbs") => verbs.verbs = true,
            Long("device") => verbs.device = Some(parser.value()?.parse()?),
            Long("gid") => verbs.gid(parser)?,
            Long("addr") => addr = parse_addr(&parser.value()?, "--addr")?,
            Long("port") => port = parser.value()?.parse()?,
            Short('h') | Long("help") => {
                print!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    perf::server::serve(addr, port, &verbs.stack()?)?;
    Ok(ExitCode::SUCCESS)
}

fn client(parser: &mut lexopt::Parser) -> Result<ExitCode, lexopt::Error> {
    use lexopt::prelude::*;
    let mut server = None;
    let mut tests = Vec::new();
    let mut local: std::net::IpAddr = std::net::Ipv4Addr::new(127, 0, 0, 2).into();
    let mut port = perf::DEFAULT_PORT;
    let mut sizes: Option<Vec<usize>> = None;
    let mut params = perf::Params::default();
    let mut json = false;
    let mut verbs = VerbsArgs::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("verbs") => verbs.verbs = true,
            Long("device") => verbs.device = Some(parser.value()?.parse()?),
            Long("gid") => verbs.gid(parser)?,
            Value(v) if server.is_none() => server = Some(parse_addr(&v, "SERVER")?),
            Value(v) => {
                let name = v.to_string_lossy().to_string();
                let t = perf::find_or_suggest(&name)?;
                tests.push(t);
            }
            Long("local") => local = parse_addr(&parser.value()?, "--local")?,
            Long("port") => port = parser.value()?.parse()?,
            Short('s') => {
                let v = parser.value()?;
                sizes = Some(vec![perf::parse_size(&v.to_string_lossy())?]);
            }
            Short('a') => sizes = Some((0..=22).map(|k| 1usize << k).collect()),
            Long("sizes") => {
                let v = parser.value()?.to_string_lossy().to_string();
                let list: Result<Vec<usize>, String> = v.split(',').map(perf::parse_size).collect();
                sizes = Some(list?);
            }
            Short('n') => {
                params.iters = parser.value()?.parse()?;
                if params.iters == 0 {
                    return Err("-n must be at least 1".into());
                }
            }
            Short('D') => {
                let secs: f64 = parser.value()?.parse()?;
                if !(secs > 0.0 && secs <= 3600.0) {
                    return Err("-D must be between 0 and 3600 seconds".into());
                }
                params.duration = Some(core::time::Duration::from_secs_f64(secs));
            }
            Long("warmup") => params.warmup = parser.value()?.parse()?,
            Long("json") => json = true,
            Long("mtu") => {
                let m: u32 = parser.value()?.parse()?;
                params.mtu = Some(
                    uroce::Mtu::from_bytes(m)
                        .ok_or("--mtu must be 256, 512, 1024, 2048 or 4096")?,
                );
            }
            Long("depth") => params.depth = parser.value()?.parse()?,
            Long("events") => params.events = true,
            Long("no-nodelay") => params.nodelay = false,
            Long("busy-poll") => params.busy_poll = true,
            Long("inline") => params.inline = parser.value()?.parse()?,
            Long("post-list") => params.post_list = parser.value()?.parse()?,
            Long("qps") => params.qps = parser.value()?.parse()?,
            Long("sockbuf") => {
                let v = parser.value()?;
                params.sockbuf = perf::parse_size(&v.to_string_lossy())?;
            }
            Long("pin") => {
                let v = parser.value()?.to_string_lossy().to_string();
                let (c, s) = v.split_once(',').ok_or("--pin takes CLIENT_CPU,SERVER_CPU")?;
                let cpu = |x: &str| {
                    x.parse::<usize>().map_err(|_| format!("--pin: '{x}' is not a CPU number"))
                };
                params.pin = Some((cpu(c)?, cpu(s)?));
            }
            Short('h') | Long("help") => {
                print!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    let server = server.ok_or("client needs a SERVER address and at least one TEST")?;
    if tests.is_empty() {
        return Err("client needs at least one TEST ('uroce list' shows them)".into());
    }
    let plan = perf::client::Plan {
        server,
        port,
        local,
        tests,
        sizes: sizes.unwrap_or(vec![params.size]),
        params,
        json,
        stack: verbs.stack()?,
    };
    let stdout = io::stdout();
    perf::client::run(&plan, &mut stdout.lock())?;
    Ok(ExitCode::SUCCESS)
}

fn compare(parser: &mut lexopt::Parser) -> Result<ExitCode, lexopt::Error> {
    use lexopt::prelude::*;
    let mut args = perf::compare::CompareArgs {
        quick: false,
        sizes: None,
        duration: None,
        out: std::path::PathBuf::from("uroce-report"),
        with_peers: false,
        local: std::net::Ipv4Addr::new(127, 0, 0, 2).into(),
        server: std::net::Ipv4Addr::new(127, 0, 0, 3).into(),
        verbs: None,
        repeat: 3,
    };
    let mut verbs = VerbsArgs::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("verbs") => verbs.verbs = true,
            Long("device") => verbs.device = Some(parser.value()?.parse()?),
            Long("gid") => verbs.gid(parser)?,
            Long("quick") => args.quick = true,
            Long("sizes") => {
                let v = parser.value()?.to_string_lossy().to_string();
                let list: Result<Vec<usize>, String> = v.split(',').map(perf::parse_size).collect();
                args.sizes = Some(list?);
            }
            Long("duration") => {
                let secs: f64 = parser.value()?.parse()?;
                if !(secs > 0.0 && secs <= 60.0) {
                    return Err("--duration must be between 0 and 60 seconds".into());
                }
                args.duration = Some(core::time::Duration::from_secs_f64(secs));
            }
            Long("out") => args.out = parser.value()?.into(),
            Long("with-peers") => args.with_peers = true,
            Long("repeat") => {
                let v: String = parser.value()?.parse()?;
                args.repeat = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=20).contains(n))
                    .ok_or_else(|| format!("--repeat: '{v}' is not a count from 1 to 20"))?;
            }
            Long("local") => args.local = parse_addr(&parser.value()?, "--local")?,
            Long("server") => args.server = parse_addr(&parser.value()?, "--server")?,
            Short('h') | Long("help") => {
                print!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    args.verbs = Some(verbs.stack()?).filter(|s| matches!(s, perf::Stack::Verbs { .. }));
    let dir = perf::compare::run(&args)?;
    println!("report: {}/index.html, report.md, results.json", dir.display());
    Ok(ExitCode::SUCCESS)
}
