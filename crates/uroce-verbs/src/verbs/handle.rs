//! The one way between a C handle and the Rust object behind it.
//!
//! Every object handed to C is a `#[repr(C)]` box holding the public structure (`struct
//! ibv_cq`, …) at a fixed offset: 0 for all but the context, whose `struct ibv_context` follows
//! the `struct verbs_context` the extended verbs find before it. The C pointer is the address
//! of that structure; [`CObject`] turns one into the other, for every object kind alike.

use super::*;

/// An object this library hands to C as a pointer to its public structure `Public`.
///
/// # Safety
///
/// The implementor is `#[repr(C)]` and holds a `Public` at byte offset `OFFSET`.
pub(crate) unsafe trait CObject: Sized {
    /// The rdma-core structure the caller sees.
    type Public;
    /// Where `Public` sits in `Self`.
    const OFFSET: usize = 0;

    /// Gives the object to C: the pointer the verb returns.
    fn into_c(self: Box<Self>) -> *mut Self::Public {
        Box::into_raw(self).wrapping_byte_add(Self::OFFSET).cast()
    }

    /// The object a C pointer leads to, without reading it; `None` for NULL.
    fn from_c(p: *mut Self::Public) -> Option<*mut Self> {
        (!p.is_null()).then(|| p.wrapping_byte_sub(Self::OFFSET).cast())
    }

    /// Takes the object back from C, for the verb that destroys it.
    ///
    /// # Safety
    ///
    /// `p` is NULL or came from [`CObject::into_c`] of this type, and the call is its last use.
    unsafe fn take(p: *mut Self::Public) -> Option<Box<Self>> {
        // SAFETY: the caller's contract: `from_c` undoes `into_c`'s offset, giving the box.
        Self::from_c(p).map(|o| unsafe { Box::from_raw(o) })
    }
}

// SAFETY: `#[repr(C)]` (checked by the compiler: `offset_of!` on a field of a context).
unsafe impl CObject for Context {
    type Public = IbvContext;
    const OFFSET: usize = offset_of!(Self, vctx) + offset_of!(VerbsContext, context);
}

/// Objects whose public structure is their first field, `ibv`.
macro_rules! public_first {
    ($($object:ty => $public:ty),* $(,)?) => {$(
        // SAFETY: `#[repr(C)]` and a `$public` at offset 0, which the assertion checks.
        unsafe impl CObject for $object {
            type Public = $public;
        }
        const _: () = assert!(offset_of!($object, ibv) == 0);
    )*};
}

public_first! {
    Pd => IbvPd,
    Mr => IbvMr,
    CompChannel => IbvCompChannel,
    Cq => IbvCq,
    Srq => IbvSrq,
    Qp => IbvQp,
    Ah => IbvAh,
    Mw => IbvMw,
    Td => IbvTd,
    Dm => IbvDm,
}
