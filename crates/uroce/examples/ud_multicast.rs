//! UD multicast: one sender, three receiving QPs on two devices, over the host's loopback
//! (127.0.0.2 sends; two QPs on 127.0.0.3 and one on 127.0.0.4 join 239.1.1.1).
//!
//! ```sh
//! cargo run --release -p uroce --example ud_multicast
//! ```

use std::net::IpAddr;
use std::time::Duration;

use uroce::{Access, Context, QKey, QpType, Qpn};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let group: IpAddr = "239.1.1.1".parse()?;
    let qkey = QKey(0x1234);
    let sender = Context::open("127.0.0.2".parse()?)?;
    let pd = sender.alloc_pd();
    let cq = sender.create_cq(16)?;
    let qp = pd.qp(QpType::Ud, &cq).qkey(qkey).build()?;
    let msg = pd.register(64, Access::LOCAL_WRITE)?;
    let ah = pd.create_ah(group)?;
    let mut receivers = Vec::new();
    for (addr, n) in [("127.0.0.3", 2), ("127.0.0.4", 1)] {
        let ctx = Context::open(addr.parse()?)?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16)?;
        // 40 bytes of GRH area, then the payload.
        let buf = pd.register(n * 4096, Access::LOCAL_WRITE)?;
        let mut qps = Vec::new();
        for i in 0..n {
            let qp = pd.qp(QpType::Ud, &cq).qkey(qkey).build()?;
            qp.attach_mcast(group)?;
            qp.post_recv(i as u64, &buf, i * 4096..(i + 1) * 4096)?;
            qps.push(qp);
        }
        receivers.push((addr, ctx, cq, buf, qps));
    }
    let text = b"hello, group";
    msg.write(0, text)?;
    qp.send_to(1, &msg, 0..text.len(), &ah, Qpn::MULTICAST, qkey)?;
    println!(
        "sent {} bytes to {group} from QP {}: {}",
        text.len(),
        qp.qpn(),
        cq.wait_one(None)?.status
    );
    for (addr, _ctx, cq, buf, qps) in &receivers {
        for _ in qps {
            let wc = cq.wait_one(Some(Duration::from_secs(5)))?;
            let at = usize::try_from(wc.wr_id)? * 4096;
            let payload = buf.to_vec(at + 40..at + wc.byte_len as usize)?;
            println!(
                "{addr} QP {}: {} bytes from QP {} (GRH {}): {:?}",
                wc.qp_num,
                wc.byte_len - 40,
                wc.src_qp,
                wc.grh,
                String::from_utf8_lossy(&payload)
            );
        }
    }
    Ok(())
}
