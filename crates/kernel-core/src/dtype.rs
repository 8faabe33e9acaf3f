//! Element types, and the traits kernels are generic over.

use half::{bf16, f16};
use std::fmt;

/// A tensor element type. The discriminants are stable and used across FFI by adapters that
/// want a small integer code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    F16 = 0,
    BF16 = 1,
    F32 = 2,
    F64 = 3,
    I32 = 4,
    I64 = 5,
    Bool = 6,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];
    /// SPEC "float": the dtypes float ops accept.
    pub const FLOAT: &'static [DType] = &[DType::F16, DType::BF16, DType::F32, DType::F64];
    /// SPEC "numeric": float + int32 + int64.
    pub const NUMERIC: &'static [DType] = &[
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// The NumPy / PyTorch style name: `float32`, `bfloat16`, `int64`, `bool`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .or(match name {
                "half" => Some(DType::F16),
                "float" => Some(DType::F32),
                "double" => Some(DType::F64),
                "int" => Some(DType::I32),
                "long" => Some(DType::I64),
                _ => None,
            })
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The dtype whose discriminant (its position in [`DType::ALL`]) is `code`.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }
}

/// A framework's codes for the seven dtypes, in [`DType::ALL`] order: one table per adapter
/// serves both directions.
pub struct DTypeCodes<C>(pub [C; 7]);

impl<C: Copy + PartialEq> DTypeCodes<C> {
    /// The dtype of a framework code; `None` for a code polyop has no dtype for.
    pub fn dtype(&self, code: C) -> Option<DType> {
        self.0
            .iter()
            .position(|&c| c == code)
            .map(|i| DType::ALL[i])
    }
    /// The framework's code of `d`.
    pub fn code(&self, d: DType) -> C {
        self.0[d as usize]
    }
    /// The name of a framework code for messages: polyop's name of its dtype, else the name
    /// `others` (the framework's dtypes polyop has none for) gives it.
    pub fn name(&self, code: C, others: &[(C, &'static str)]) -> Option<&'static str> {
        self.dtype(code)
            .map(DType::name)
            .or_else(|| others.iter().find(|(c, _)| *c == code).map(|&(_, n)| n))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    /// Implemented only for the seven storage types below.
    pub trait Sealed {}
}

/// A Rust type that is the storage of one [`DType`].
///
/// Sealed: the tensor views hand out `&[T]` for any `T: Element` whose `DTYPE` matches the
/// view's dtype, which is sound only because `T` really is that dtype's storage type (its
/// size, alignment and valid values). So no other crate can implement it:
///
/// ```compile_fail
/// use kernel_core::{DType, Element};
/// #[derive(Clone, Copy, PartialEq, Default, Debug)]
/// struct Wide([u64; 4]);
/// impl Element for Wide {
///     const DTYPE: DType = DType::F64;
///     fn is_zero(self) -> bool {
///         self == Wide::default()
///     }
/// }
/// ```
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + PartialEq + Default + fmt::Debug + 'static
{
    const DTYPE: DType;
    fn is_zero(self) -> bool;
}

macro_rules! element {
    ($t:ty, $d:expr, $zero:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn is_zero(self) -> bool {
                self == $zero
            }
        }
    };
}
element!(f16, DType::F16, f16::ZERO);
element!(bf16, DType::BF16, bf16::ZERO);
element!(f32, DType::F32, 0.0);
element!(f64, DType::F64, 0.0);
element!(i32, DType::I32, 0);
element!(i64, DType::I64, 0);
element!(bool, DType::Bool, false);

/// Float storage types. Arithmetic happens in `Acc` (f32 for the half types, so they are
/// computed in f32 and rounded once, f64 for f64).
pub trait FloatElem: Element {
    type Acc: num_traits::Float + Send + Sync + Default + fmt::Debug + 'static;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(v: Self::Acc) -> Self;
    fn acc_from_f64(v: f64) -> Self::Acc;
}

impl FloatElem for f16 {
    type Acc = f32;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn acc_from_f64(v: f64) -> f32 {
        v as f32
    }
}
impl FloatElem for bf16 {
    type Acc = f32;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn acc_from_f64(v: f64) -> f32 {
        v as f32
    }
}
impl FloatElem for f32 {
    type Acc = f32;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_acc(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn acc_from_f64(v: f64) -> f32 {
        v as f32
    }
}
impl FloatElem for f64 {
    type Acc = f64;
    #[inline(always)]
    fn to_acc(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_acc(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn acc_from_f64(v: f64) -> f64 {
        v
    }
}

/// Run `$body` with `$T` bound to the storage type of `$dtype`, for float dtypes; otherwise
/// evaluate `$else`.
#[macro_export]
macro_rules! dispatch_float {
    ($dtype:expr, $T:ident => $body:expr, _ => $else:expr) => {
        match $dtype {
            $crate::DType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            #[allow(unreachable_patterns)]
            _ => $else,
        }
    };
}

/// Like [`dispatch_float!`] over the numeric dtypes (float + i32 + i64).
#[macro_export]
macro_rules! dispatch_numeric {
    ($dtype:expr, $T:ident => $body:expr, _ => $else:expr) => {
        match $dtype {
            $crate::DType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            #[allow(unreachable_patterns)]
            _ => $else,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_map_both_ways_in_all_order() {
        let codes = DTypeCodes([10, 11, 12, 13, 14, 15, 16]);
        for (i, d) in DType::ALL.into_iter().enumerate() {
            assert_eq!(codes.code(d), 10 + i as i32);
            assert_eq!(codes.dtype(10 + i as i32), Some(d));
        }
        assert_eq!(codes.dtype(9), None);
        assert_eq!(codes.dtype(17), None);
    }

    #[test]
    fn dtype_codes_name_polyop_dtypes_then_others() {
        let codes = DTypeCodes([10, 11, 12, 13, 14, 15, 16]);
        let others = [(3, "int8"), (12, "shadowed")];
        assert_eq!(codes.name(12, &others), Some("float32"));
        assert_eq!(codes.name(16, &others), Some("bool"));
        assert_eq!(codes.name(3, &others), Some("int8"));
        assert_eq!(codes.name(4, &others), None);
    }
}
