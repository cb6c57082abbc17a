//! CRC-32 values as polynomials over GF(2), modulo the CRC polynomial, in the reflected bit
//! order of the CRC itself (bit 31 holds the coefficient of x⁰, bit 0 that of x³¹).
//!
//! Hashing one more zero byte multiplies the CRC register by x⁸ (modulo the polynomial), so a
//! change of δ in the register before `n` further bytes shows as δ·x⁸ⁿ in the result, whatever
//! those bytes are. Multiplying by x⁻⁸ⁿ undoes that: from a difference seen in the result it
//! gives back the difference in the register, which is how a receiver finds which IPv4
//! identification a packet's ICRC was computed with (see [`super::IdRecovery`]). The same
//! arithmetic is behind zlib's `crc32_combine`.

/// The CRC-32 polynomial x³²+x²⁶+…+1 without its x³² term, reflected.
const POLY: u32 = 0xEDB8_8320;

/// The polynomial 1.
pub(crate) const ONE: u32 = 1 << 31;

/// `v`·x.
const fn times_x(v: u32) -> u32 {
    if v & 1 != 0 { (v >> 1) ^ POLY } else { v >> 1 }
}

/// `a`·`b` modulo the CRC polynomial.
pub(crate) const fn mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut i = 0;
    while i < 32 {
        if a & (ONE >> i) != 0 {
            product ^= b;
        }
        b = times_x(b);
        i += 1;
    }
    product
}

/// x⁻¹. The polynomial P is x·R + 1 for R = (P − 1)/x, so x·R ≡ 1: R is x's inverse. In the
/// usual (unreflected) order P is 0x1_04C1_1DB7, so R is 0x8260_8EDB.
const X_INV: u32 = 0x8260_8EDB_u32.reverse_bits();

/// `v` raised to `n`.
const fn pow(v: u32, mut n: u32) -> u32 {
    let mut result = ONE;
    let mut square = v;
    while n != 0 {
        if n & 1 != 0 {
            result = mul(result, square);
        }
        square = mul(square, square);
        n >>= 1;
    }
    result
}

/// Entry `j`: `per_byte` raised to 2ʲ, for up to 2¹⁷ − 1 bytes.
const fn powers_of_two(per_byte: u32) -> [u32; 17] {
    let mut t = [0u32; 17];
    t[0] = per_byte;
    let mut j = 1;
    while j < t.len() {
        t[j] = mul(t[j - 1], t[j - 1]);
        j += 1;
    }
    t
}

/// x^(8·2ʲ): what 2ʲ bytes of hashing multiply a register difference by.
const SHIFT: [u32; 17] = powers_of_two(pow(ONE >> 1, 8));
/// x^(−8·2ʲ): undoing 2ʲ bytes.
const UNSHIFT: [u32; 17] = powers_of_two(pow(X_INV, 8));

/// The product of the entries of `table` that the bits of `bytes` pick: its per-byte factor
/// raised to `bytes`.
fn for_bytes(table: &[u32; 17], bytes: usize) -> u32 {
    let mut factor = ONE;
    for (j, &t) in table.iter().enumerate() {
        if bytes >> j & 1 != 0 {
            factor = mul(factor, t);
        }
    }
    factor
}

/// x^(8·`bytes`): what `bytes` bytes of hashing multiply a register difference by (`bytes` <
/// 2¹⁷).
pub(crate) fn shift_factor(bytes: usize) -> u32 {
    for_bytes(&SHIFT, bytes)
}

/// x^(−8·`bytes`): the factor that undoes `bytes` bytes of hashing (`bytes` < 2¹⁷).
pub(crate) fn unshift_factor(bytes: usize) -> u32 {
    for_bytes(&UNSHIFT, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_inverse_is_the_inverse_of_x() {
        assert_eq!(mul(ONE >> 1, X_INV), ONE);
        assert_eq!(mul(pow(X_INV, 8), pow(ONE >> 1, 8)), ONE);
    }

    /// A register difference of δ before `n` zero bytes becomes δ·x⁸ⁿ (the shift factor for
    /// `n`), and the unshift factor undoes it: checked against crc32fast itself.
    #[test]
    fn unshift_undoes_hashing_zero_bytes() {
        for n in [0usize, 1, 3, 16, 1000, 4112, 9000, 65_535] {
            let zeros = vec![0u8; n];
            for delta in [1u32, 0x8000_0000, 0xDEAD_BEEF] {
                let run = |init: u32| {
                    let mut h = crc32fast::Hasher::new_with_initial(init);
                    h.update(&zeros);
                    h.finalize()
                };
                let seen = run(0x1234_5678) ^ run(0x1234_5678 ^ delta);
                assert_eq!(mul(seen, unshift_factor(n)), delta, "n {n}");
                assert_eq!(mul(delta, shift_factor(n)), seen, "n {n}");
            }
        }
    }
}
