//! Keys a peer cannot derive: a device opened without a seed draws its memory keys, QPNs and
//! PSNs from the operating system's randomness; one opened with a seed (for tests) repeats
//! them exactly.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "the high halves of SplitMix64 outputs")]

use uroce::{Access, Context, Options, QpType};

/// The keys of four regions and the first QPN and PSN of a device at `addr`.
fn draws(addr: &str, seed: Option<u64>) -> Vec<u32> {
    let options = Options { seed, no_progress_thread: true, ..Options::default() };
    let ctx = Context::open_with(addr.parse().unwrap(), options).unwrap();
    let pd = ctx.alloc_pd();
    let mrs: Vec<_> = (0..4).map(|_| pd.register(4096, Access::LOCAL_WRITE).unwrap()).collect();
    let cq = ctx.create_cq(4).unwrap();
    let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
    let mut v: Vec<u32> = mrs.iter().flat_map(|m| [m.lkey().0, m.rkey().0]).collect();
    // The QPN's low 16 bits: the top ones name the process's slot.
    v.push(qp.qpn().get() & 0xFFFF);
    v.push(qp.endpoint().psn.get());
    v
}

#[test]
fn a_seeded_device_repeats_itself_and_an_unseeded_one_never_does() {
    let (a, b) = ("127.0.28.30", "127.0.28.31");
    assert_eq!(draws(a, Some(42)), draws(b, Some(42)), "a seed reproduces every draw");
    // Same process, same moment, same address: nothing but the OS's randomness differs.
    let (x, y) = (draws(a, None), draws(a, None));
    let same = x.iter().zip(&y).filter(|(p, q)| p == q).count();
    assert_eq!(same, 0, "{x:x?} against {y:x?}");
    assert_ne!(x, draws(a, Some(42)));
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The inverse of `mix` (each step of SplitMix64's output function is a bijection).
fn unmix(mut z: u64) -> u64 {
    z ^= (z >> 31) ^ (z >> 62);
    z = z.wrapping_mul(0x3196_42B2_D24D_8EC3); // 0x94D0_49BB_1331_11EB⁻¹ mod 2⁶⁴
    z ^= (z >> 27) ^ (z >> 54);
    z = z.wrapping_mul(0x96DE_1B17_3F11_9089); // 0xBF58_476D_1CE4_E5B9⁻¹ mod 2⁶⁴
    z ^ (z >> 30) ^ (z >> 60)
}

/// The attack that recovered SplitMix64's state from three rkeys: for each guess of the 32
/// bits a key does not show, the state it implies predicts the next two keys; a guess that
/// predicts both gives every key after them. Searches guesses `0..limit`.
fn splitmix_next(keys: [u32; 3], limit: u64) -> Option<u32> {
    let high = u64::from(keys[0]) << 32;
    (0..limit).find_map(|low| {
        let s = unmix(high | low);
        let k2 = (mix(s.wrapping_add(GAMMA)) >> 32) as u32;
        let k3 = (mix(s.wrapping_add(GAMMA.wrapping_mul(2))) >> 32) as u32;
        (k2 == keys[1] && k3 == keys[2])
            .then(|| (mix(s.wrapping_add(GAMMA.wrapping_mul(3))) >> 32) as u32)
    })
}

/// The inversion that predicts SplitMix64's next key finds nothing in a real device's keys,
/// over all 2³² guesses.
#[test]
fn the_splitmix_inversion_predicts_nothing() {
    // The attack works: against SplitMix64 itself (an output whose hidden half is small, so
    // the check is quick), it predicts the next key.
    for z in [1u64, 1000] {
        let o1 = 0xDEAD_BEEF_0000_0000 | z;
        let s = unmix(o1);
        assert_eq!(mix(s), o1);
        let k = |i: u64| (mix(s.wrapping_add(GAMMA.wrapping_mul(i))) >> 32) as u32;
        assert_eq!(splitmix_next([k(0), k(1), k(2)], 1 << 16), Some(k(3)));
    }
    // A device's consecutive draws: the lkey and rkey of one region, the lkey of the next.
    let d = draws("127.0.28.32", None);
    assert_eq!(splitmix_next([d[0], d[1], d[2]], 1 << 32), None, "{d:x?}");
}
