//! Helpers for adapters at a C boundary, the same in every framework: strings and arrays a C
//! API hands over, messages handed back, attribute payloads as raw bytes, and the slot tables
//! of C callbacks that carry no user-data pointer.

use std::ffi::{c_char, CStr, CString};
use std::sync::RwLock;

/// `msg` as a C string for a framework's error: interior NULs are written as `\0`, so the
/// message is never cut short (or lost) at a NUL.
pub fn c_message(msg: &str) -> CString {
    CString::new(msg.replace('\0', "\\0")).unwrap_or_default()
}

/// An owned copy of a NUL-terminated C string (invalid UTF-8 replaced); `None` for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that is live for the call.
pub unsafe fn string_from_c(p: *const c_char) -> Option<String> {
    // SAFETY: non-null, so a live NUL-terminated string (this function's contract).
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The `len` elements at `p` as a slice: empty when `len` is 0 or `p` is null (C APIs report
/// an empty array either way, often with a null or dangling pointer).
///
/// # Safety
/// Unless `len` is 0 or `p` is null, `p` points to `len` initialised elements that stay live
/// and unchanged for `'a`.
pub unsafe fn slice_from_c<'a, T>(p: *const T, len: usize) -> &'a [T] {
    if len == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: this function's contract.
    unsafe { std::slice::from_raw_parts(p, len) }
}

/// A value read from native-endian bytes: how C APIs hand over attribute payloads.
pub trait FromNeBytes: Sized {
    /// The value in `b`; `None` unless `b` is exactly one value's size.
    fn from_ne(b: &[u8]) -> Option<Self>;
}

macro_rules! from_ne_bytes {
    ($($t:ty),*) => {$(
        impl FromNeBytes for $t {
            fn from_ne(b: &[u8]) -> Option<Self> {
                Some(<$t>::from_ne_bytes(b.try_into().ok()?))
            }
        }
    )*};
}
from_ne_bytes!(
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    f32,
    f64,
    half::f16,
    half::bf16
);

/// Every whole value of type `T` in `b`, in order (trailing bytes short of a value ignored).
pub fn ne_values<T: FromNeBytes>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(std::mem::size_of::<T>())
        .filter_map(T::from_ne)
        .collect()
}

/// What [`SlotTable::add`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Added in this slot.
    New(usize),
    /// The same item (by address) already has this slot.
    Already(usize),
    /// Every one of the table's slots is taken.
    Full,
}

/// Items that C callbacks without a user-data pointer find by position: the adapter hands the
/// framework the `i`-th function of a fixed table of trampolines, and trampoline `i` looks up
/// slot `i` here. Filled at registration, read on every call; a poisoned lock is recovered
/// (the table is only ever pushed to).
pub struct SlotTable<T: 'static>(RwLock<Vec<&'static T>>);

impl<T: 'static> SlotTable<T> {
    pub const fn new() -> Self {
        SlotTable(RwLock::new(Vec::new()))
    }

    /// The item in `slot`, if one was added there.
    pub fn get(&self, slot: usize) -> Option<&'static T> {
        let items = self.0.read().unwrap_or_else(|e| e.into_inner());
        items.get(slot).copied()
    }

    /// Add `item` in the next free slot unless it is already in the table or all `capacity`
    /// slots (the size of the trampoline table) are taken.
    pub fn add(&self, item: &'static T, capacity: usize) -> Added {
        let mut items = self.0.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = items.iter().position(|t| std::ptr::eq(*t, item)) {
            return Added::Already(i);
        }
        if items.len() >= capacity {
            return Added::Full;
        }
        items.push(item);
        Added::New(items.len() - 1)
    }
}

impl<T: 'static> Default for SlotTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_message_keeps_interior_nuls_visible() {
        assert_eq!(c_message("a\0b").as_bytes(), b"a\\0b");
        assert_eq!(c_message("plain").as_bytes(), b"plain");
    }

    #[test]
    fn string_from_c_copies_and_maps_null_to_none() {
        let s = CString::new("héllo").unwrap();
        // SAFETY: a live NUL-terminated string, and null.
        unsafe {
            assert_eq!(string_from_c(s.as_ptr()).as_deref(), Some("héllo"));
            assert_eq!(string_from_c(std::ptr::null()), None);
        }
    }

    #[test]
    fn slice_from_c_is_empty_for_null_or_zero_length() {
        let v = [1i64, 2, 3];
        // SAFETY: `v` has 3 elements; the other calls read nothing.
        unsafe {
            assert_eq!(slice_from_c(v.as_ptr(), 3), &v[..]);
            assert!(slice_from_c(v.as_ptr(), 0).is_empty());
            assert!(slice_from_c(std::ptr::null::<i64>(), 5).is_empty());
        }
    }

    #[test]
    fn reads_native_endian_values() {
        assert_eq!(i16::from_ne(&(-2i16).to_ne_bytes()), Some(-2));
        assert_eq!(u64::from_ne(&u64::MAX.to_ne_bytes()), Some(u64::MAX));
        assert_eq!(f32::from_ne(&1.5f32.to_ne_bytes()), Some(1.5));
        let h = half::bf16::from_f32(2.0);
        assert_eq!(half::bf16::from_ne(&h.to_ne_bytes()), Some(h));
        assert_eq!(i32::from_ne(&[0u8; 3]), None);
        assert_eq!(i32::from_ne(&[0u8; 8]), None);
        let mut b: Vec<u8> = [7i64, -8].iter().flat_map(|v| v.to_ne_bytes()).collect();
        b.push(1);
        assert_eq!(ne_values::<i64>(&b), vec![7, -8]);
        assert!(ne_values::<f32>(&[]).is_empty());
    }

    #[test]
    fn slot_table_adds_once_up_to_capacity() {
        static A: u8 = 1;
        static B: u8 = 2;
        static C: u8 = 3;
        let t = SlotTable::new();
        assert_eq!(t.add(&A, 2), Added::New(0));
        assert_eq!(t.add(&B, 2), Added::New(1));
        assert_eq!(t.add(&A, 2), Added::Already(0));
        assert_eq!(t.add(&C, 2), Added::Full);
        assert_eq!(t.get(1).copied(), Some(2));
        assert!(t.get(2).is_none());
    }
}
