//! `uroce`: the command-line tool of the uroce user-space RoCEv2 stack.
#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

mod decode;

const USAGE: &str = "\
uroce: RoCEv2 RDMA in user space

Usage:
  uroce decode FILE...    Decode RoCEv2 packets and verify their ICRC
  uroce help              Show this help
  uroce --version         Show the version

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
