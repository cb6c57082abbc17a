//! One-sided RDMA: a WRITE into another device's memory and a READ back, with the target
//! application doing nothing at all (its device's progress thread serves both). Two devices in
//! one process, on 127.0.0.2 and 127.0.0.3.
//!
//! ```sh
//! cargo run --release -p uroce --example rdma_write_read
//! ```

use uroce::{Access, Context, Mtu, QpType, WcStatus};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let initiator = Context::open("127.0.0.2".parse()?)?;
    let target = Context::open("127.0.0.3".parse()?)?;
    let (pd_i, pd_t) = (initiator.alloc_pd(), target.alloc_pd());
    let (cq_i, cq_t) = (initiator.create_cq(16)?, target.create_cq(16)?);
    let qp_i = pd_i.qp(QpType::Rc, &cq_i).mtu(Mtu::Mtu4096).build()?;
    let qp_t = pd_t.qp(QpType::Rc, &cq_t).mtu(Mtu::Mtu4096).build()?;
    // The target offers 1 MiB for remote reads and writes.
    let len = 1 << 20;
    let window =
        pd_t.register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let local = pd_i.register(2 * len, Access::LOCAL_WRITE)?;
    qp_i.connect(&qp_t.endpoint())?;
    qp_t.connect(&qp_i.endpoint())?;
    let data: Vec<u8> = (0..len).map(|i| u8::try_from(i * 7 % 251).unwrap_or(0)).collect();
    local.write(0, &data)?;
    qp_i.write(1, &local, 0..len, window.remote())?;
    qp_i.read(2, &local, len..2 * len, window.remote().at(0))?;
    for _ in 0..2 {
        let wc = cq_i.wait_one(None)?;
        if wc.status != WcStatus::SUCCESS {
            return Err(format!("work request {} failed: {}", wc.wr_id, wc.status).into());
        }
        println!("completed wr {} ({:?}, {} bytes)", wc.wr_id, wc.opcode, wc.byte_len);
    }
    let landed = window.to_vec(0..len)?;
    let back = local.to_vec(len..2 * len)?;
    println!("target memory matches what was written: {}", landed == data);
    println!("READ returned the same bytes: {}", back == data);
    let (c, n) = initiator.counters();
    println!(
        "initiator sent {} packets ({} retransmitted) in {} sendmmsg calls",
        c.sent_pkts, c.retransmitted_pkts, n.tx_batches
    );
    if landed != data || back != data {
        return Err("data mismatch".into());
    }
    Ok(())
}
