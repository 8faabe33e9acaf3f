//! Attribute source: a node's attributes at kernel construction
//! (`TF_OpKernelConstruction_GetAttr*`), decoded and bound by kernel-core.

use crate::register::count_attr;
use crate::sys::*;
use kernel_core::{widen_f32_attr, ArgType, AttrSource, AttrValue, CallSite, Error, OpDef, Result};
use std::ffi::CString;
use std::os::raw::c_char;

/// A node's attributes at kernel construction.
struct NodeAttrs(*mut TF_OpKernelConstruction);

impl NodeAttrs {
    /// Run one `TF_OpKernelConstruction_GetAttr*` call with a fresh status.
    fn read<T>(
        &self,
        name: &str,
        what: &str,
        f: impl FnOnce(*const c_char, *mut TF_Status) -> T,
    ) -> Result<T> {
        let c = CString::new(name).map_err(|_| Error::internal("attr name"))?;
        let st = Status::new();
        let v = f(c.as_ptr(), st.0);
        if !st.ok() {
            return Err(Error::invalid(format!(
                "reading {what}attribute `{name}`: {}",
                st.message()
            )));
        }
        Ok(v)
    }
}

impl AttrSource for NodeAttrs {
    fn get(&mut self, name: &str, ty: &ArgType) -> Result<Option<AttrValue>> {
        let ctx = self.0;
        let (list, total) = match ty {
            ArgType::Str | ArgType::IntList(_) | ArgType::FloatList => {
                self.read(name, "the size of ", |n, st| {
                    let (mut list, mut total) = (0i32, 0i32);
                    // SAFETY: `ctx` is the live construction context of this kernel (see
                    // `read_attrs`); `read` passes a NUL-terminated name and a live status; the
                    // out-pointers are writable locals.
                    unsafe {
                        TF_OpKernelConstruction_GetAttrSize(ctx, n, &mut list, &mut total, st)
                    };
                    (list.max(0) as usize, total.max(0) as usize)
                })?
            }
            _ => (0, 0),
        };
        // SAFETY: as above; each out-buffer has room for what it is declared to hold: one
        // scalar, `total + 1` bytes for a string of `total` bytes, `list` list elements (the
        // sizes TF reported for this attribute above).
        self.read(name, "", |n, st| unsafe {
            Some(match ty {
                ArgType::Int => {
                    let mut v = 0i64;
                    TF_OpKernelConstruction_GetAttrInt64(ctx, n, &mut v, st);
                    AttrValue::Int(v)
                }
                ArgType::Float => {
                    let mut v = 0f32;
                    TF_OpKernelConstruction_GetAttrFloat(ctx, n, &mut v, st);
                    AttrValue::Float(widen_f32_attr(v))
                }
                ArgType::Bool => {
                    let mut v: TF_Bool = 0;
                    TF_OpKernelConstruction_GetAttrBool(ctx, n, &mut v, st);
                    AttrValue::Bool(v != 0)
                }
                ArgType::Str => {
                    let mut buf = vec![0u8; total + 1];
                    TF_OpKernelConstruction_GetAttrString(
                        ctx,
                        n,
                        buf.as_mut_ptr() as *mut c_char,
                        total,
                        st,
                    );
                    buf.truncate(total);
                    AttrValue::Str(String::from_utf8_lossy(&buf).into_owned())
                }
                ArgType::IntList(_) => {
                    let mut buf = vec![0i64; list];
                    TF_OpKernelConstruction_GetAttrInt64List(
                        ctx,
                        n,
                        buf.as_mut_ptr(),
                        list as i32,
                        st,
                    );
                    AttrValue::IntList(buf)
                }
                ArgType::FloatList => {
                    let mut buf = vec![0f32; list];
                    TF_OpKernelConstruction_GetAttrFloatList(
                        ctx,
                        n,
                        buf.as_mut_ptr(),
                        list as i32,
                        st,
                    );
                    AttrValue::FloatList(buf.into_iter().map(widen_f32_attr).collect())
                }
                ArgType::Tensor | ArgType::OptionalTensor => return None,
            })
        })
    }
}

/// Read the op's attributes from the node and bind them.
///
/// # Safety
/// `ctx` is the context of a running kernel construction.
pub(crate) unsafe fn read_attrs(
    op: &'static OpDef,
    ctx: *mut TF_OpKernelConstruction,
) -> Result<crate::call::KernelState> {
    let mut src = NodeAttrs(ctx);
    let attrs = op.decode_attrs(&mut src)?;
    let mut present = Vec::new();
    for a in op.schema.tensor_args() {
        if a.ty == ArgType::OptionalTensor {
            let n = match src.get(&count_attr(&a.name), &ArgType::Int)? {
                Some(AttrValue::Int(n)) => n,
                _ => 0,
            };
            if n > 1 {
                return Err(Error::invalid(format!(
                    "optional input `{}` takes a list of 0 or 1 tensors, got {n}",
                    a.name
                ))
                .in_op(op));
            }
            present.push(n == 1);
        } else {
            present.push(true);
        }
    }
    Ok(crate::call::KernelState {
        op,
        site: CallSite::new(attrs),
        present,
    })
}
