//! An idle device costs no CPU: with QPs connected and nothing to do, the progress thread sleeps
//! in `poll` without a deadline. (Its own test binary, so no other test's work is counted.)
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::time::Duration;

use uroce::{Access, Context, Options, QpType};

#[test]
fn an_idle_device_with_open_qps_uses_under_one_percent_of_a_core() {
    let a = Context::open_with("127.0.9.2".parse().unwrap(), Options::default()).unwrap();
    let b = Context::open_with("127.0.9.3".parse().unwrap(), Options::default()).unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let mut qps = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let (qa, qb) = (pa.qp(t, &ca).build().unwrap(), pb.qp(t, &cb).build().unwrap());
        qa.connect(&qb.endpoint()).unwrap();
        qb.connect(&qa.endpoint()).unwrap();
        qps.push((qa, qb));
    }
    // Some traffic first, so the timers have run and stopped.
    let mr = pa.register(4096, Access::LOCAL_WRITE).unwrap();
    let target = pb.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    qps[0].0.write(1, &mr, 0..4096, target.remote()).unwrap();
    assert!(ca.wait_one(Some(Duration::from_secs(10))).unwrap().status == uroce::WcStatus::SUCCESS);
    let (_, before_wakeups) = a.counters();
    let (u0, s0) = uroce::process_cpu_time();
    let span = Duration::from_secs(2);
    // Blocks this thread without spinning, as an idle application would.
    assert!(ca.wait(Some(span)).unwrap().is_empty());
    let (u1, s1) = uroce::process_cpu_time();
    let used = (u1 - u0) + (s1 - s0);
    let (_, after_wakeups) = a.counters();
    eprintln!(
        "idle for {span:?}: {used:?} of CPU ({:.3} % of a core), {} progress wake-ups",
        used.as_secs_f64() / span.as_secs_f64() * 100.0,
        after_wakeups.progress_wakeups - before_wakeups.progress_wakeups
    );
    assert!(used < span / 100, "an idle device used {used:?} of CPU in {span:?}");
}
