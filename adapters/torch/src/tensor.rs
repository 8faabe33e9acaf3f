//! Framework tensors in and out: owning tensor handles, torch dtype and device codes, input
//! views of torch tensors, and the output allocator (`empty_strided`) that kernel-core's call
//! path asks for memory.

use crate::sys::{self as ffi, AtenTensorHandle};
use kernel_core::ffi::slice_from_c;
use kernel_core::op::OutputAllocator;
use kernel_core::{
    with_i64_contiguous, DType, DTypeCodes, Error, Few, OpDef, Result, TensorMut, TensorRef,
};
use std::sync::OnceLock;

/// An owning tensor handle, deleted on drop.
pub(crate) struct Tensor(pub AtenTensorHandle);

impl Drop for Tensor {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we own the handle.
            unsafe { ffi::aoti_torch_delete_tensor_object(self.0) };
        }
    }
}

impl Tensor {
    pub(crate) fn into_raw(self) -> AtenTensorHandle {
        let h = self.0;
        std::mem::forget(self);
        h
    }
    /// A new owning handle to the same tensor.
    pub(crate) fn share(&self) -> Result<Tensor> {
        let mut h = std::ptr::null_mut();
        check(
            // SAFETY: `self.0` is a live handle owned by `self`; `h` a writable local.
            unsafe { ffi::aoti_torch_new_tensor_handle(self.0, &mut h) },
            "new_tensor_handle",
        )?;
        Ok(Tensor(h))
    }
}

pub(crate) fn check(rc: i32, what: &str) -> Result<()> {
    if rc == ffi::SUCCESS {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "torch call `{what}` failed: {}",
            ffi::last_error()
        )))
    }
}

/// Shim constants (dtype and device codes are runtime values, not part of the ABI).
pub(crate) struct Codes {
    cpu: i32,
    pub meta: i32,
    cuda: i32,
    dtypes: DTypeCodes<i32>,
    others: [(i32, &'static str); 11],
}

pub(crate) fn codes() -> &'static Codes {
    static C: OnceLock<Codes> = OnceLock::new();
    // SAFETY: constant getters without arguments.
    C.get_or_init(|| unsafe {
        Codes {
            cpu: ffi::aoti_torch_device_type_cpu(),
            meta: ffi::aoti_torch_device_type_meta(),
            cuda: ffi::aoti_torch_device_type_cuda(),
            dtypes: DTypeCodes([
                ffi::aoti_torch_dtype_float16(),
                ffi::aoti_torch_dtype_bfloat16(),
                ffi::aoti_torch_dtype_float32(),
                ffi::aoti_torch_dtype_float64(),
                ffi::aoti_torch_dtype_int32(),
                ffi::aoti_torch_dtype_int64(),
                ffi::aoti_torch_dtype_bool(),
            ]),
            others: [
                (ffi::aoti_torch_dtype_uint8(), "uint8"),
                (ffi::aoti_torch_dtype_int8(), "int8"),
                (ffi::aoti_torch_dtype_int16(), "int16"),
                (ffi::aoti_torch_dtype_uint16(), "uint16"),
                (ffi::aoti_torch_dtype_uint32(), "uint32"),
                (ffi::aoti_torch_dtype_uint64(), "uint64"),
                (ffi::aoti_torch_dtype_float8_e5m2(), "float8_e5m2"),
                (ffi::aoti_torch_dtype_float8_e4m3fn(), "float8_e4m3fn"),
                (ffi::aoti_torch_dtype_complex32(), "complex32"),
                (ffi::aoti_torch_dtype_complex64(), "complex64"),
                (ffi::aoti_torch_dtype_complex128(), "complex128"),
            ],
        }
    })
}

pub(crate) fn dtype_from_code(code: i32) -> std::result::Result<DType, String> {
    let c = codes();
    c.dtypes.dtype(code).ok_or_else(|| {
        let name = c.dtypes.name(code, &c.others);
        name.map_or_else(|| format!("<torch dtype code {code}>"), String::from)
    })
}

/// One input tensor: its device and a view of it.
pub(crate) struct Info<'a> {
    pub device_type: i32,
    pub device_index: i32,
    pub view: TensorRef<'a>,
}

pub(crate) fn info<'a>(op: &OpDef, name: &str, t: &'a Tensor) -> Result<Info<'a>> {
    let h = t.0;
    let (mut dim, mut sizes, mut strides) = (0i64, std::ptr::null_mut(), std::ptr::null_mut());
    let (mut dt, mut dev, mut idx) = (0i32, 0i32, 0i32);
    // SAFETY: valid handle, plain out-parameters; sizes/strides are borrowed arrays of `dim`.
    unsafe {
        check(ffi::aoti_torch_get_dtype(h, &mut dt), "get_dtype")?;
        check(
            ffi::aoti_torch_get_device_type(h, &mut dev),
            "get_device_type",
        )?;
        check(
            ffi::aoti_torch_get_device_index(h, &mut idx),
            "get_device_index",
        )?;
        check(ffi::aoti_torch_get_dim(h, &mut dim), "get_dim")?;
        check(ffi::aoti_torch_get_sizes(h, &mut sizes), "get_sizes")?;
        check(ffi::aoti_torch_get_strides(h, &mut strides), "get_strides")?;
    }
    let c = codes();
    if dev != c.cpu && dev != c.meta {
        let what = if dev == c.cuda {
            "cuda".to_string()
        } else {
            format!("device type {dev}")
        };
        return Err(Error::unsupported(format!(
            "input `{name}` is on {what}; polyop's torch kernels run on CPU tensors only"
        ))
        .in_op(op));
    }
    let dtype = dtype_from_code(dt).map_err(|n| op.unsupported_dtype(name, &n))?;
    // SAFETY: torch returns arrays of length dim, valid while the tensor lives.
    let (sizes, strides) = unsafe {
        (
            slice_from_c(sizes, dim as usize),
            slice_from_c(strides, dim as usize),
        )
    };
    let shape = sizes.iter().map(|&s| s as usize).collect();
    let strides = strides.iter().map(|&s| s as isize).collect();
    // (The data pointer already includes the storage offset.)
    let ptr = if dev == c.cpu {
        data_ptr(t)?
    } else {
        std::ptr::null_mut()
    };
    Ok(Info {
        device_type: dev,
        device_index: idx,
        // SAFETY: the handle `t` keeps the storage alive while the view is used; torch strides
        // are in elements; meta tensors carry no data and are never read.
        view: unsafe { TensorRef::from_raw(dtype, shape, strides, ptr) },
    })
}

pub(crate) fn empty(dtype: DType, shape: &[usize], device: (i32, i32)) -> Result<Tensor> {
    let mut h = std::ptr::null_mut();
    // (Sizes and strides on the stack for the usual ranks: this runs on every call.)
    let rc = with_i64_contiguous(shape, |sizes, strides| {
        // SAFETY: `sizes` and `strides` both have the `sizes.len()` entries passed as ndim;
        // `h` is a writable local that receives a new owning handle.
        unsafe {
            ffi::aoti_torch_empty_strided(
                sizes.len() as i64,
                sizes.as_ptr(),
                strides.as_ptr(),
                codes().dtypes.code(dtype),
                device.0,
                device.1,
                &mut h,
            )
        }
    });
    check(rc, "empty_strided")?;
    Ok(Tensor(h))
}

pub(crate) fn data_ptr(t: &Tensor) -> Result<*mut u8> {
    let mut p = std::ptr::null_mut();
    check(
        // SAFETY: `t.0` is a live handle owned by `t`; `p` a writable local.
        unsafe { ffi::aoti_torch_get_data_ptr(t.0, &mut p) },
        "get_data_ptr",
    )?;
    Ok(p as *mut u8)
}

/// Outputs allocated by torch (`empty_strided` on the inputs' device), kept as owning handles
/// until they are pushed on the stack.
pub(crate) struct TorchOutputs {
    pub device: (i32, i32),
    pub outputs: Few<Tensor>,
}

impl<'a> OutputAllocator<'a> for TorchOutputs {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>> {
        if index != self.outputs.len() {
            return Err(Error::internal(format!(
                "output {index} allocated out of order"
            )));
        }
        let t = empty(dtype, shape, self.device)?;
        let p = data_ptr(&t)?;
        self.outputs.push(t);
        // SAFETY: a fresh contiguous torch tensor (null data on meta, never written), owned
        // by `self` until pushed on the stack.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, p) })
    }
    /// `empty_strided` always gives new storage.
    fn always_fresh(&self) -> bool {
        true
    }
    /// Not in a virtual machine that reports free pages to its host. There, with two intra-op
    /// threads, the first writes to a fresh output's huge pages ran in phases: `relu` on 16M
    /// float32 took 8 ms a call, then 13, then 88 for runs of calls, where 4 KiB pages took a
    /// steady 13.6 ms. torch's own huge pages (`THP_MEM_ALLOC_ENABLE=1`) did the same with
    /// `torch.relu`; one thread, or JAX's outputs, did not.
    fn huge_pages(&self) -> bool {
        !kernel_core::hugepages::reports_free_pages()
    }
}
