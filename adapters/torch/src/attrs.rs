//! Attribute source: torch passes attributes on the boxed stack in schema order; they are
//! decoded into kernel-core values here and bound (once per distinct set) by the call path.

use crate::sys::{self as ffi, AtenTensorHandle, StableIValue};
use crate::tensor::{check, Tensor};
use kernel_core::schema::ArgType;
use kernel_core::{AttrValue, Error, Few, OpDef, Result};

/// Take ownership of every argument on the stack (so each is released whatever happens next),
/// turning tensors into owning handles and attributes into [`AttrValue`]s.
///
/// # Safety
/// `stack` is torch's boxed stack for `op`: at least `op.schema.args.len()` entries, each
/// encoding an argument of the schema's type, owned by the callee; none is read again.
pub(crate) unsafe fn decode(op: &'static OpDef, stack: *mut StableIValue) -> Result<DecodedArgs> {
    let n_tensors = op.schema.tensor_args().count();
    let mut tensors = Few::with_capacity(n_tensors);
    let mut attrs = Few::with_capacity(op.schema.args.len() - n_tensors);
    let mut first_err = None;
    for (i, arg) in op.schema.args.iter().enumerate() {
        // SAFETY: torch passes a stack of at least num_args entries (checked by the caller).
        let v = unsafe { *stack.add(i) };
        // SAFETY: `v` is argument `i`, of type `arg.ty`, owned by us (this function's
        // contract) and decoded once.
        let r = unsafe { decode_one(&arg.ty, v) };
        match r {
            Ok(Decoded::Tensor(t)) => tensors.push(t),
            Ok(Decoded::Attr(a)) => attrs.push((arg.name.as_str(), a)),
            Err(e) => {
                if arg.ty.is_tensor() {
                    tensors.push(None);
                }
                first_err.get_or_insert(e.in_op(op));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok((tensors, attrs)),
    }
}

/// Tensor inputs (None = absent optional) and attributes by name.
pub(crate) type DecodedArgs = (Few<Option<Tensor>>, Few<(&'static str, AttrValue)>);

pub(crate) enum Decoded {
    Tensor(Option<Tensor>),
    Attr(AttrValue),
}

/// Take ownership of one stack entry.
///
/// # Safety
/// `v` is a StableIValue holding a value of type `ty` (a tensor handle, null or a heap
/// StableIValue for an optional tensor, a string or list handle, or a scalar), owned by the
/// caller and given up to this function.
pub(crate) unsafe fn decode_one(ty: &ArgType, v: StableIValue) -> Result<Decoded> {
    Ok(match ty {
        ArgType::Tensor => Decoded::Tensor(Some(Tensor(v as usize as AtenTensorHandle))),
        ArgType::OptionalTensor => {
            if v == 0 {
                Decoded::Tensor(None)
            } else {
                let p = v as usize as *mut StableIValue;
                // SAFETY: a present optional is a heap StableIValue we now own.
                let inner = unsafe { *p };
                let t = Tensor(inner as usize as AtenTensorHandle);
                check(
                    // SAFETY: `p` is the heap StableIValue read above, owned here and released
                    // once; its tensor handle now belongs to `t`.
                    unsafe { ffi::torch_delete_stable_ivalue(p) },
                    "delete_stable_ivalue",
                )?;
                Decoded::Tensor(Some(t))
            }
        }
        ArgType::Int => Decoded::Attr(AttrValue::Int(v as i64)),
        ArgType::Float => Decoded::Attr(AttrValue::Float(f64::from_bits(v))),
        ArgType::Bool => Decoded::Attr(AttrValue::Bool(v & 0xff != 0)),
        ArgType::Str => {
            let h = v as usize as ffi::StringHandle;
            let (mut len, mut data) = (0usize, std::ptr::null());
            // SAFETY: an owning string handle; read then release it.
            let s = unsafe {
                let ok = ffi::torch_string_length(h, &mut len) == ffi::SUCCESS
                    && ffi::torch_string_c_str(h, &mut data) == ffi::SUCCESS;
                let s = if ok && !data.is_null() {
                    Some(
                        String::from_utf8_lossy(std::slice::from_raw_parts(data as *const u8, len))
                            .into_owned(),
                    )
                } else {
                    None
                };
                ffi::torch_delete_string(h);
                s
            };
            Decoded::Attr(AttrValue::Str(s.ok_or_else(|| {
                Error::internal(format!("reading a str argument: {}", ffi::last_error()))
            })?))
        }
        ArgType::IntList(_) | ArgType::FloatList => {
            let h = v as usize as ffi::StableListHandle;
            let mut n = 0usize;
            let mut items = Vec::new();
            // SAFETY: an owning list handle; read then release it.
            let ok = unsafe {
                let mut ok = ffi::torch_list_size(h, &mut n) == ffi::SUCCESS;
                for i in 0..n {
                    let mut e = 0u64;
                    ok &= ffi::torch_list_get_item(h, i, &mut e) == ffi::SUCCESS;
                    items.push(e);
                }
                ffi::torch_delete_list(h);
                ok
            };
            if !ok {
                return Err(Error::internal(format!(
                    "reading a list argument: {}",
                    ffi::last_error()
                )));
            }
            Decoded::Attr(if matches!(ty, ArgType::IntList(_)) {
                AttrValue::IntList(items.into_iter().map(|e| e as i64).collect())
            } else {
                AttrValue::FloatList(items.into_iter().map(f64::from_bits).collect())
            })
        }
    })
}
