//! The pure helpers of the verbs API: enum names as rdma-core prints them (`ibv_wc_status_str`
//! and friends, ibv_*_str(3)) and the static-rate conversions (ibv_rate_to_mult(3),
//! ibv_rate_to_mbps(3)).

use core::ffi::{c_char, c_int};

/// `ibv_wc_status_str(3)`: the text for each `enum ibv_wc_status`.
const WC_STATUS: [&core::ffi::CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `ibv_event_type_str(3)`: the text for each `enum ibv_event_type`.
const EVENT_TYPE: [&core::ffi::CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// `ibv_node_type_str(3)`, from `IBV_NODE_CA` (1) on.
const NODE_TYPE: [&core::ffi::CStr; 7] = [
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// `ibv_port_state_str(3)`.
const PORT_STATE: [&core::ffi::CStr; 6] =
    [c"no state change (NOP)", c"down", c"init", c"armed", c"active", c"active defer"];

fn lookup(
    table: &[&'static core::ffi::CStr],
    i: c_int,
    unknown: &'static core::ffi::CStr,
) -> *const c_char {
    usize::try_from(i).ok().and_then(|i| table.get(i)).copied().unwrap_or(unknown).as_ptr()
}

pub(crate) fn wc_status_str(status: c_int) -> *const c_char {
    lookup(&WC_STATUS, status, c"unknown")
}

pub(crate) fn event_type_str(event: c_int) -> *const c_char {
    lookup(&EVENT_TYPE, event, c"unknown")
}

pub(crate) fn node_type_str(node_type: c_int) -> *const c_char {
    lookup(&NODE_TYPE, node_type - 1, c"unknown")
}

pub(crate) fn port_state_str(state: c_int) -> *const c_char {
    lookup(&PORT_STATE, state, c"unknown")
}

/// `enum ibv_rate` → (multiple of 2.5 Gbit/s, Mbit/s); -1 where there is none.
const RATES: [(c_int, c_int); 25] = [
    (-1, -1), // IBV_RATE_MAX
    (-1, -1),
    (1, 2500),
    (4, 10000),
    (12, 30000),
    (2, 5000),
    (8, 20000),
    (16, 40000),
    (24, 60000),
    (32, 80000),
    (48, 120000),
    (-1, 14062),
    (-1, 56250),
    (-1, 112500),
    (-1, 168750),
    (-1, 25781),
    (-1, 103125),
    (-1, 206250),
    (-1, 309375),
    (11, 28125),
    (20, 53125),
    (160, 425000),
    (240, 637500),
    (320, 850000),
    (480, 1275000),
];

pub(crate) fn rate_to_mult(rate: c_int) -> c_int {
    usize::try_from(rate).ok().and_then(|r| RATES.get(r)).map_or(-1, |r| r.0)
}

pub(crate) fn rate_to_mbps(rate: c_int) -> c_int {
    usize::try_from(rate).ok().and_then(|r| RATES.get(r)).map_or(-1, |r| r.1)
}

/// The rate with this multiple of 2.5 Gbit/s; `IBV_RATE_MAX` (0) if none.
pub(crate) fn mult_to_rate(mult: c_int) -> c_int {
    rate_where(|r| r.0 == mult && mult > 0)
}

/// The rate of exactly this many Mbit/s; `IBV_RATE_MAX` (0) if none.
pub(crate) fn mbps_to_rate(mbps: c_int) -> c_int {
    rate_where(|r| r.1 == mbps && mbps > 0)
}

fn rate_where(f: impl Fn(&(c_int, c_int)) -> bool) -> c_int {
    RATES.iter().position(f).and_then(|i| c_int::try_from(i).ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> String {
        // SAFETY: every pointer these functions return is a static C string.
        unsafe { core::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn names_match_rdma_core() {
        assert_eq!(s(wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(s(wc_status_str(12)), "transport retry counter exceeded");
        assert_eq!(s(wc_status_str(99)), "unknown");
        assert_eq!(s(event_type_str(4)), "communication established");
        assert_eq!(s(node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(s(node_type_str(-1)), "unknown");
        assert_eq!(s(port_state_str(4)), "active");
    }

    #[test]
    fn rates_round_trip() {
        for rate in 2..25 {
            if rate_to_mult(rate) > 0 {
                assert_eq!(mult_to_rate(rate_to_mult(rate)), rate);
            }
            assert_eq!(mbps_to_rate(rate_to_mbps(rate)), rate);
        }
        assert_eq!(mult_to_rate(3), 0);
        assert_eq!(rate_to_mbps(0), -1);
    }
}
