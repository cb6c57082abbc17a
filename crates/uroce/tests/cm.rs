//! Connections through the CM with the safe API: listen, connect, accept with private data
//! both ways, a SEND over the connected QPs, disconnect (the QPs end in Error, the peer is
//! told); a connect to a port nobody listens on is rejected; a port listened on is taken.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::disallowed_methods, reason = "a test waits on real time")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uroce::{Access, CmError, Context, Error, QpState, QpType, WcOpcode, WcStatus};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

#[test]
fn a_listener_accepts_a_connection_that_carries_a_send_and_disconnects() {
    let (a, b) = (Context::open("127.0.18.1".parse().unwrap()).unwrap(), {
        Context::open("127.0.18.2".parse().unwrap()).unwrap()
    });
    let listener = b.listen(0, 4).unwrap();
    let server = listener.local_addr();
    assert_eq!(server.ip(), b.addr());
    assert!(server.port() >= 32768, "an ephemeral port: {server}");
    let t = std::thread::spawn(move || {
        let (pd, cq) = (b.alloc_pd(), b.create_cq(16).unwrap());
        let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
        let buf = pd.register(64, Access::LOCAL_WRITE).unwrap();
        // The receive is posted before the accept: the first SEND may follow the RTU at once.
        qp.post_recv(7, &buf, 0..64).unwrap();
        let conn = listener.accept(&qp, b"welcome", WAIT).unwrap();
        assert!(conn.private_data().starts_with(b"hello"), "{:?}", conn.private_data());
        assert_eq!(qp.state(), Some(QpState::Rts));
        let wc = cq.wait_one(WAIT).unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (7, WcStatus::SUCCESS, WcOpcode::Recv, 5)
        );
        assert_eq!(buf.to_vec(0..5).unwrap(), b"ping!");
        conn.wait_disconnect(WAIT).unwrap();
        assert_eq!(qp.state(), Some(QpState::Error));
    });
    let (pd, cq) = (a.alloc_pd(), a.create_cq(16).unwrap());
    let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
    let conn = qp.connect_to(server, b"hello", WAIT).unwrap();
    assert!(conn.private_data().starts_with(b"welcome"));
    assert_eq!(qp.state(), Some(QpState::Rts));
    let src = pd.register(64, Access::LOCAL_WRITE).unwrap();
    src.write(0, b"ping!").unwrap();
    qp.send(1, &src, 0..5).unwrap();
    assert_eq!(cq.wait_one(WAIT).unwrap().status, WcStatus::SUCCESS);
    conn.disconnect(WAIT).unwrap();
    assert_eq!(qp.state(), Some(QpState::Error));
    t.join().unwrap();
}

#[test]
fn a_connect_to_a_port_nobody_listens_on_is_rejected_at_once() {
    let (a, b) = (Context::open("127.0.18.3".parse().unwrap()).unwrap(), {
        Context::open("127.0.18.4".parse().unwrap()).unwrap()
    });
    let (pd, cq) = (a.alloc_pd(), a.create_cq(4).unwrap());
    let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
    let t = Instant::now();
    let r = qp.connect_to(SocketAddr::new(b.addr(), 7), b"", WAIT);
    // IBA table 112: 8, invalid service ID; Linux's CM answers so, and so does B's host.
    assert!(matches!(r, Err(Error::Cm(CmError::Rejected(8)))), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(qp.state(), Some(QpState::Init), "a rejected QP is left as it was");
}

#[test]
fn a_port_listened_on_is_taken_until_its_listener_goes() {
    let b = Context::open("127.0.18.5".parse().unwrap()).unwrap();
    let first = b.listen(0, 1).unwrap();
    let port = first.local_addr().port();
    let again = b.listen(port, 1);
    assert!(matches!(again, Err(Error::Cm(CmError::Bind(_)))), "{again:?}");
    drop(first);
    let second = b.listen(port, 1).unwrap();
    assert_eq!(second.local_addr().port(), port);
}

#[test]
fn a_ud_qp_does_not_connect_through_the_cm() {
    let a = Context::open("127.0.18.6".parse().unwrap()).unwrap();
    let (pd, cq) = (a.alloc_pd(), a.create_cq(4).unwrap());
    let qp = pd.qp(QpType::Ud, &cq).build().unwrap();
    let r = qp.connect_to(SocketAddr::new(a.addr(), 7), b"", WAIT);
    assert!(matches!(r, Err(Error::Cm(CmError::NotConnected(QpType::Ud)))), "{r:?}");
}

#[test]
fn an_ipv4_device_cannot_connect_to_an_ipv6_listener() {
    let a = Context::open("127.0.18.10".parse().unwrap()).unwrap();
    let (pd, cq) = (a.alloc_pd(), a.create_cq(4).unwrap());
    let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
    let r = qp.connect_to("[::1]:7".parse().unwrap(), b"", WAIT);
    assert!(matches!(r, Err(Error::Cm(CmError::AddressFamilies))), "{r:?}");
    assert_eq!(qp.state(), Some(QpState::Init));
}
