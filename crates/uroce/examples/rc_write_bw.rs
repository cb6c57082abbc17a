//! RDMA WRITE bandwidth between two devices of one process (127.0.0.2 → 127.0.0.3), like
//! qperf's `rc_rdma_write_bw`: a window of WRITEs kept in flight, the target application idle.
//!
//! ```sh
//! cargo run --release -p uroce --example rc_write_bw -- [-s SIZE] [-n COUNT] [-w WINDOW] [--copy]
//! ```
//!
//! `--copy` copies each payload into its packet instead of sending it from registered memory.

use std::time::Instant;

use uroce::{Access, Context, Mtu, Options, QpType, WcStatus};

fn arg(name: &str, default: usize) -> Result<usize, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).ok_or(format!("{name} needs a value"))?.parse()?),
        None => Ok(default),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let size = arg("-s", 1 << 20)?;
    let count = arg("-n", 2000)?;
    let window = arg("-w", 8)?;
    let copy = std::env::args().any(|a| a == "--copy");
    let opts = || Options { copy_payloads: copy, ..Options::default() };
    let a = Context::open_with("127.0.0.2".parse()?, opts())?;
    let b = Context::open_with("127.0.0.3".parse()?, opts())?;
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(1024)?, b.create_cq(16)?);
    let qa = pa.qp(QpType::Rc, &ca).mtu(Mtu::Mtu4096).build()?;
    let qb = pb.qp(QpType::Rc, &cb).mtu(Mtu::Mtu4096).build()?;
    qa.connect(&qb.endpoint())?;
    qb.connect(&qa.endpoint())?;
    let src = pa.register(size, Access::LOCAL_WRITE)?;
    let dst = pb.register(size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    src.write(0, &vec![0x5a; size])?;
    let (u0, s0) = uroce::process_cpu_time();
    #[expect(clippy::disallowed_methods, reason = "a benchmark reads the clock")]
    let start = Instant::now();
    let (mut posted, mut done) = (0, 0);
    let mut wcs = Vec::new();
    while done < count {
        while posted < count && posted - done < window {
            qa.write(posted as u64, &src, 0..size, dst.remote())?;
            posted += 1;
        }
        wcs.clear();
        ca.poll(&mut wcs);
        for wc in &wcs {
            if wc.status != WcStatus::SUCCESS {
                return Err(format!("WRITE {} failed: {}", wc.wr_id, wc.status).into());
            }
            done += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let (u1, s1) = uroce::process_cpu_time();
    let cpu = ((u1 - u0) + (s1 - s0)).as_secs_f64();
    #[expect(clippy::cast_precision_loss, reason = "rates to two decimals")]
    let bytes = (size * count) as f64;
    let (_, n) = a.counters();
    println!(
        "rc_rdma_write_bw size={size} count={count} window={window} copy={copy}: {:.2} Gbit/s, \
         {:.0} MiB/s, CPU {:.0} % of a core, {:.2} s CPU per GB, {} of {} packets zero-copy",
        bytes * 8.0 / secs / 1e9,
        bytes / secs / f64::from(1 << 20),
        cpu / secs * 100.0,
        cpu / (bytes / 1e9),
        n.tx_zero_copy,
        n.tx_datagrams
    );
    Ok(())
}
