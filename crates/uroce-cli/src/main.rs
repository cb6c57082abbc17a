//! `uroce`: the command-line tool of the uroce user-space RoCEv2 stack.
#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

mod decode;
mod exec;
mod perf;

const USAGE: &str = "\
uroce: RoCEv2 RDMA in user space

Usage:
  uroce compare [OPTIONS]        Measure RDMA against TCP on loopback and write a report
  uroce decode FILE...           Decode RoCEv2 packets and verify their ICRC
  uroce exec [--addr A,…] -- CMD Run an unmodified program on uroce (drop-in libraries and the
                                 /dev/infiniband and /sys/class/infiniband view)
  uroce list                     List the tests, one line each
  uroce server [OPTIONS]         Wait for clients and answer their tests
  uroce client SERVER TEST... [OPTIONS]
                                 Run tests against a server, print each result
  uroce help                     Show this help
  uroce --version                Show the version

compare options:
  --quick          a reduced matrix (under 30 seconds)
  --sizes LIST     comma-separated sizes (default 64,1K,16K,256K,4M)
  --duration SECS  seconds per test and size (default 0.8; quick 0.15)
  --out DIR        where the report goes (default uroce-report)
  --with-peers     also run sockperf, qperf and iperf3 (when installed) for the report
  --local ADDR     the client's device (default 127.0.0.2)
  --server ADDR    the server's device and control address (default 127.0.0.3)

server options:
  --addr ADDR      this side's address: TCP control and RDMA device (default 127.0.0.3)
  --port P         control port (default 19765)

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
  --mtu M          RDMA path MTU: 256, 512, 1024, 2048 or 4096 (default 4096)
  --depth N        RDMA messages in flight for streaming tests (default 32)
  --events         RDMA: sleep on completion events instead of busy polling
  --inline N       RDMA: SENDs of at most N bytes go inline (N <= 1024)
  --post-list N    RDMA streams: post N work requests back to back (default 1)
  --qps N          RDMA streams: spread the work over N QPs (default 1)
  --no-nodelay     TCP: leave Nagle's algorithm on
  --busy-poll      TCP/UDP: spin on non-blocking sockets instead of sleeping
  --sockbuf SIZE   TCP/UDP: send and receive buffer size
  --pin C,S        pin the client's test thread to CPU C and the server's to CPU S

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
        Value(cmd) if cmd == "decode" => {
            let mut files = Vec::new();
            while let Some(arg) = parser.next()? {
                match arg {
                    Value(v) => files.push(v),
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
            let stdout = io::stdout();
            let code = decode::run(&files, &mut stdout.lock(), &mut io::stderr());
            Ok(ExitCode::from(code))
        }
        Value(cmd) if cmd == "list" => {
            if let Some(arg) = parser.next()? {
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

fn parse_addr(v: &std::ffi::OsStr, what: &str) -> Result<std::net::IpAddr, lexopt::Error> {
    v.to_string_lossy()
        .parse()
        .map_err(|_| format!("{what}: '{}' is not an IP address", v.to_string_lossy()).into())
}

fn server(parser: &mut lexopt::Parser) -> Result<ExitCode, lexopt::Error> {
    use lexopt::prelude::*;
    let mut addr: std::net::IpAddr = std::net::Ipv4Addr::new(127, 0, 0, 3).into();
    let mut port = perf::DEFAULT_PORT;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("addr") => addr = parse_addr(&parser.value()?, "--addr")?,
            Long("port") => port = parser.value()?.parse()?,
            _ => return Err(arg.unexpected()),
        }
    }
    perf::server::serve(addr, port)?;
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
    while let Some(arg) = parser.next()? {
        match arg {
            Value(v) if server.is_none() => server = Some(parse_addr(&v, "SERVER")?),
            Value(v) => {
                let name = v.to_string_lossy().to_string();
                let t = perf::find(&name)
                    .ok_or_else(|| format!("unknown test '{name}' ('uroce list' shows them)"))?;
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
                params.mtu = uroce::Mtu::ALL
                    .into_iter()
                    .find(|x| x.bytes() == m)
                    .ok_or("--mtu must be 256, 512, 1024, 2048 or 4096")?;
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
    };
    while let Some(arg) = parser.next()? {
        match arg {
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
            Long("local") => args.local = parse_addr(&parser.value()?, "--local")?,
            Long("server") => args.server = parse_addr(&parser.value()?, "--server")?,
            _ => return Err(arg.unexpected()),
        }
    }
    let dir = perf::compare::run(&args)?;
    println!("report: {}/index.html, report.md, results.json", dir.display());
    Ok(ExitCode::SUCCESS)
}
