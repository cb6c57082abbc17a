//! XRC through the safe API: two peers' initiators, each connected to its own target of one
//! domain, reach the same two SRQs; each request is received on, completed by and checked
//! against the SRQ it names; the domain outlives its handle while an SRQ or target remains.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "small test indices")]

use std::time::Duration;

use uroce::{Access, Context, QpType, SendRequest, WcOpcode, WcStatus};

#[test]
fn initiators_reach_the_srq_they_name_through_any_target_of_the_domain() {
    let host = Context::open("127.0.33.2".parse().unwrap()).unwrap();
    let peers = [
        Context::open("127.0.33.3".parse().unwrap()).unwrap(),
        Context::open("127.0.33.4".parse().unwrap()).unwrap(),
    ];
    let domain = host.xrc_domain();
    // Two SRQs, each with a PD, region and CQ of its own.
    let pds = [host.alloc_pd(), host.alloc_pd()];
    let cqs = [host.create_cq(16).unwrap(), host.create_cq(16).unwrap()];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mrs = [pds[0].register(4096, access).unwrap(), pds[1].register(4096, access).unwrap()];
    let srqs = [
        domain.create_srq(&pds[0], &cqs[0], 8).unwrap(),
        domain.create_srq(&pds[1], &cqs[1], 8).unwrap(),
    ];
    let targets = [
        domain.target(Access::REMOTE_WRITE).unwrap(),
        domain.target(Access::REMOTE_WRITE).unwrap(),
    ];
    // The domain handle may go first: its SRQs and targets keep it.
    drop(domain);

    let mut inis = Vec::new();
    let mut peer_cqs = Vec::new();
    let mut sources = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        let pd = peer.alloc_pd();
        let cq = peer.create_cq(16).unwrap();
        let ini = pd.qp(QpType::XrcIni, &cq).build().unwrap();
        ini.connect(&targets[i].endpoint()).unwrap();
        targets[i].connect(&ini.endpoint()).unwrap();
        let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        src.write(0, format!("from peer {i}").as_bytes()).unwrap();
        inis.push((pd, ini));
        peer_cqs.push(cq);
        sources.push(src);
    }
    // Every peer sends to both SRQs.
    for (j, srq) in srqs.iter().enumerate() {
        for k in 0..2usize {
            let wr_id = 10 * j as u64 + k as u64;
            srq.post_recv(wr_id, &mrs[j], k * 64..(k + 1) * 64).unwrap();
        }
    }
    for (i, (_, ini)) in inis.iter().enumerate() {
        for (j, srq) in srqs.iter().enumerate() {
            let wr = SendRequest::send(100 * i as u64 + j as u64)
                .sge(&sources[i], 0..11)
                .unwrap()
                .xrc_srq(srq.number());
            ini.post_send(wr).unwrap();
        }
    }
    for (i, cq) in peer_cqs.iter().enumerate() {
        for _ in 0..2 {
            let wc = cq.wait_one(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(wc.status, WcStatus::SUCCESS, "peer {i}: {wc:?}");
        }
    }
    for (j, cq) in cqs.iter().enumerate() {
        let mut through = Vec::new();
        for _ in 0..2 {
            let wc = cq.wait_one(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(
                (wc.status, wc.opcode, wc.byte_len),
                (WcStatus::SUCCESS, WcOpcode::Recv, 11)
            );
            through.push(wc.qp_num);
            let k = (wc.wr_id % 10) as usize;
            let text = mrs[j].to_vec(k * 64..k * 64 + 11).unwrap();
            let from = targets.iter().position(|t| t.qpn() == wc.qp_num).unwrap();
            assert_eq!(text, format!("from peer {from}").as_bytes(), "SRQ {j}");
        }
        through.sort_unstable();
        let mut want = vec![targets[0].qpn(), targets[1].qpn()];
        want.sort_unstable();
        assert_eq!(through, want, "SRQ {j} heard each target once");
    }

    // A WRITE is checked against the PD of the SRQ it names: SRQ 0's PD does not hold
    // region 1, SRQ 1's does.
    let (_, ini) = &inis[0];
    let remote = mrs[1].remote().at(512);
    let wr =
        SendRequest::write(7, remote).sge(&sources[0], 0..11).unwrap().xrc_srq(srqs[1].number());
    ini.post_send(wr).unwrap();
    let wc = peer_cqs[0].wait_one(Some(Duration::from_secs(5))).unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::SUCCESS));
    assert_eq!(mrs[1].to_vec(512..523).unwrap(), b"from peer 0");
    let wr =
        SendRequest::write(8, remote).sge(&sources[0], 0..11).unwrap().xrc_srq(srqs[0].number());
    ini.post_send(wr).unwrap();
    let wc = peer_cqs[0].wait_one(Some(Duration::from_secs(5))).unwrap();
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::REM_ACCESS_ERR));

    // A target has no queues of its own.
    assert!(targets[1].post_recv(1, &mrs[0], 0..8).is_err());
    assert!(targets[1].send(1, &mrs[0], 0..8).is_err());
}
