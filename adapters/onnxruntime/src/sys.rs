//! The raw bindings: thin, checked wrappers over the parts of the ONNX Runtime C API table
//! the adapter uses (types from `ort-sys`).
//!
//! The table (`OrtApi`) arrives at load time through `RegisterCustomOps`; nothing here links
//! against onnxruntime. Every wrapper turns a non-null `OrtStatus*` into a `kernel_core::Error`
//! (releasing the status), so callers can use `?`.
//!
//! The contract of every `unsafe fn` here: each pointer argument is a live handle of the type
//! it names, from the onnxruntime whose table `self` is, valid for the whole call (a kernel
//! context or shape-inference context during its callback, a kernel info during
//! `CreateKernelV2`, a value or attribute obtained from one of those), and each index is below
//! the count the same handle reports.

pub mod ep;

use kernel_core::ffi::{slice_from_c, string_from_c};
use kernel_core::{with_i64_dims, Dim, Error, Result};
use ort_sys::{
    ONNXTensorElementDataType as ET, OrtApi, OrtKernelContext, OrtKernelInfo, OrtOpAttr,
    OrtOpAttrType, OrtShapeInferContext, OrtStatusPtr, OrtTensorTypeAndShapeInfo, OrtValue,
};
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;

/// The C API version the adapter requests and declares in every `OrtCustomOp`. 17 is the
/// oldest version that has everything used here (`CreateKernelV2`/`KernelComputeV2` from 16,
/// `InferOutputShapeFn`/`OrtShapeInferContext`/`ReadOpAttr` from 17, `KernelContext_ParallelFor`
/// from 14), so the same library loads into ONNX Runtime 1.17 and every later release
/// (tested with 1.31.1). The bindings come from `ort-sys` (made for 1.31); requesting an older
/// version is allowed by the C API's append-only table.
pub const API_VERSION: u32 = 17;

/// A borrowed `OrtApi` table; valid for the life of the process that handed it out.
#[derive(Clone, Copy)]
pub struct Api(pub &'static OrtApi);

// SAFETY: `OrtApi` is a struct of function pointers only, static data of the loaded library
// that onnxruntime never writes after handing it out, and its functions may be called from any
// thread; sending the reference to another thread is sound.
unsafe impl Send for Api {}
// SAFETY: as for `Send`: the table is read-only, so shared references on several threads only
// read it.
unsafe impl Sync for Api {}

/// `OrtApi::GetTensorElementTypeAndShapeDataReference` (C API 24, onnxruntime 1.24): element
/// type and a borrowed pointer to the value's dims, without the allocation (and four extra
/// calls) of `GetTensorTypeAndShape`. The bindings are built for API 17, so the entry is read by
/// its index in the append-only table: 414 (byte offset 3312). The 276 entries of API <= 17
/// are checked below against `ort-sys`'s struct; 414 = 276 + the 138 entries added by APIs
/// 18-23 and this one's position in 24 (counted from `ort-sys` with feature `api-24`; the
/// offset matches onnxruntime_c_api.h).
pub type ShapeRefFn = unsafe extern "system" fn(
    value: *const OrtValue,
    elem_type: *mut ET,
    shape_data: *mut *const i64,
    shape_data_count: *mut usize,
) -> OrtStatusPtr;
const SHAPE_REF_API_VERSION: u32 = 24;
const SHAPE_REF_INDEX: usize = 414;
const _: () = assert!(std::mem::size_of::<OrtApi>() == 276 * std::mem::size_of::<usize>());
const _: () = assert!(
    std::mem::offset_of!(OrtApi, KernelContext_ParallelFor) == 274 * std::mem::size_of::<usize>()
);

static SHAPE_REF: std::sync::OnceLock<Option<ShapeRefFn>> = std::sync::OnceLock::new();

/// The loaded onnxruntime's version string and its C API version (a 1.x release serves C API
/// versions up to its minor number), read once at registration.
static RUNTIME: std::sync::OnceLock<(String, u32)> = std::sync::OnceLock::new();

/// The running onnxruntime's version string (e.g. `"1.31.1"`) and newest C API version.
///
/// # Safety
/// `base` is the `OrtApiBase` onnxruntime passed to `RegisterCustomOps`.
pub unsafe fn runtime(base: &ort_sys::OrtApiBase) -> &'static (String, u32) {
    RUNTIME.get_or_init(|| {
        // SAFETY: `GetVersionString` returns a static NUL-terminated string of the library.
        let v = unsafe { string_from_c((base.GetVersionString)()) }.unwrap_or_default();
        let api = v
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        (v, api)
    })
}

/// The running onnxruntime's C API version (0 before [`runtime`] has run).
pub fn runtime_api() -> u32 {
    RUNTIME.get().map_or(0, |r| r.1)
}

/// Look up [`ShapeRefFn`] once per process (at registration): `None` on runtimes older
/// than API 24, or when `POLYOP_ORT_NO_SHAPE_REF` is set (to test the fallback).
///
/// # Safety
/// `base` is the `OrtApiBase` onnxruntime passed to `RegisterCustomOps`.
pub unsafe fn init_shape_ref(base: &ort_sys::OrtApiBase) {
    SHAPE_REF.get_or_init(|| {
        // (asking an older runtime for API 24 would make it print an error line)
        if std::env::var_os("POLYOP_ORT_NO_SHAPE_REF").is_some()
            // SAFETY: as for this function.
            || unsafe { runtime(base) }.1 < SHAPE_REF_API_VERSION
        {
            return None;
        }
        // SAFETY: `base` is onnxruntime's own `OrtApiBase` (this function's contract);
        // `GetApi` accepts any version and answers null for one the runtime lacks.
        let t = unsafe { (base.GetApi)(SHAPE_REF_API_VERSION) };
        if t.is_null() {
            return None;
        }
        // SAFETY: a table of version >= 24 has at least SHAPE_REF_INDEX + 1 entries, each a
        // function pointer (entries are never removed or reordered).
        unsafe { *(t as *const Option<ShapeRefFn>).add(SHAPE_REF_INDEX) }
    });
}

fn shape_ref_fn() -> Option<ShapeRefFn> {
    SHAPE_REF.get().copied().flatten()
}

/// A dimension as ONNX Runtime reports it: -1 (or any negative) = unknown.
fn dim_from_ort(d: i64) -> Option<usize> {
    usize::try_from(d).ok()
}

/// A value's dims at run time, all known.
fn runtime_shape(dims: &[i64]) -> Result<Vec<usize>> {
    dims.iter()
        .map(|&d| dim_from_ort(d).ok_or_else(|| Error::internal("negative runtime dim")))
        .collect()
}

/// A string attribute's bytes as a String. Every NUL is part of the value (binding then
/// rejects it by name) rather than silently cutting it short; callers remove a C terminator
/// themselves where the API adds one.
pub(crate) fn string_from_buf(buf: Vec<u8>) -> String {
    String::from_utf8_lossy(&buf).into_owned()
}

impl Api {
    // ---- tensor type and shape ------------------------------------------------------------

    /// Element type and dims of a type-and-shape info (not released here).
    pub unsafe fn info_type_dims(
        &self,
        info: *const OrtTensorTypeAndShapeInfo,
    ) -> Result<(ET, Vec<i64>)> {
        let mut et = ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        let mut n = 0usize;
        // SAFETY: `info` is a live type-and-shape info (the module's contract); `et` and `n`
        // are writable locals, and `dims` has room for exactly the `n` dims
        // `GetDimensionsCount` reported for this same `info`.
        unsafe {
            self.check((self.0.GetTensorElementType)(info, &mut et))?;
            self.check((self.0.GetDimensionsCount)(info, &mut n))?;
            let mut dims = vec![0i64; n];
            self.check((self.0.GetDimensions)(info, dims.as_mut_ptr(), n))?;
            Ok((et, dims))
        }
    }

    /// Element type and dims of a type-and-shape info as shape inference sees them: a
    /// negative dim with a `dim_param` name is that symbol, without one it is unknown.
    pub unsafe fn info_spec_dims(
        &self,
        info: *const OrtTensorTypeAndShapeInfo,
    ) -> Result<(ET, Vec<Dim>)> {
        // SAFETY: `info` is a live type-and-shape info (the module's contract).
        let (et, dims) = unsafe { self.info_type_dims(info)? };
        let mut names: Vec<*const c_char> = vec![ptr::null(); dims.len()];
        // SAFETY: as above; `names` has room for exactly the `dims.len()` entries this same
        // `info` reported. The names it fills in belong to `info` and are read (copied into
        // owned Strings) before this function returns.
        let named = unsafe {
            self.check((self.0.GetSymbolicDimensions)(
                info,
                names.as_mut_ptr(),
                names.len(),
            ))
            .is_ok()
        };
        let dims = dims
            .into_iter()
            .zip(names)
            .map(|(d, name)| match dim_from_ort(d) {
                Some(v) => Dim::Known(v),
                // SAFETY: a non-null name from a successful `GetSymbolicDimensions` is a
                // NUL-terminated string owned by `info`, live here (see above).
                None if named => match unsafe { string_from_c(name) } {
                    Some(name) if !name.is_empty() => Dim::sym(&name),
                    _ => Dim::Unknown,
                },
                None => Dim::Unknown,
            })
            .collect();
        Ok((et, dims))
    }

    /// Element type and concrete shape of a tensor value. Per-call hot path: uses
    /// `GetTensorElementTypeAndShapeDataReference` (borrowed dims, nothing allocated by
    /// onnxruntime) when the runtime has it, else the `OrtTensorTypeAndShapeInfo` sequence.
    pub unsafe fn value_type_shape(&self, v: *const OrtValue) -> Result<(ET, Vec<usize>)> {
        if let Some(f) = shape_ref_fn() {
            // SAFETY: `f` is from `shape_ref_fn`; `v` is a live tensor value (the module's
            // contract).
            let (et, dims) = unsafe { self.shape_ref(f, v) }?;
            return Ok((et, runtime_shape(dims)?));
        }
        let mut info: *mut OrtTensorTypeAndShapeInfo = ptr::null_mut();
        // SAFETY: `v` is a live tensor value (the module's contract). `info` is used only after
        // `GetTensorTypeAndShape` succeeded, which makes it a new info owned here; it is
        // released exactly once, after its last use by `info_type_dims`.
        unsafe {
            self.check((self.0.GetTensorTypeAndShape)(v, &mut info))?;
            let r = self.info_type_dims(info);
            (self.0.ReleaseTensorTypeAndShapeInfo)(info);
            let (et, dims) = r?;
            Ok((et, runtime_shape(&dims)?))
        }
    }

    /// Element type and borrowed dims of a tensor value through
    /// `GetTensorElementTypeAndShapeDataReference` (nothing allocated by onnxruntime).
    ///
    /// # Safety
    /// `f` is from [`shape_ref_fn`] (so this runtime's entry: `init_shape_ref` sets it only from
    /// a table of API >= 24), `v` a live tensor value; the dims are used only while it lives.
    unsafe fn shape_ref<'v>(&self, f: ShapeRefFn, v: *const OrtValue) -> Result<(ET, &'v [i64])> {
        let mut et = ET::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        let (mut data, mut n): (*const i64, usize) = (ptr::null(), 0);
        // SAFETY: this function's contract; the out-pointers are writable locals.
        unsafe { self.check(f(v, &mut et, &mut data, &mut n))? };
        // SAFETY: onnxruntime's own shape array of `n` dims, alive as long as `v`.
        Ok((et, unsafe { slice_from_c(data, n) }))
    }

    /// Whether tensor value `v` has element type `et` and dims `shape`.
    pub unsafe fn value_is(&self, v: *const OrtValue, et: ET, shape: &[usize]) -> Result<bool> {
        if let Some(f) = shape_ref_fn() {
            // SAFETY: as in `value_type_shape`.
            let (got, dims) = unsafe { self.shape_ref(f, v) }?;
            return Ok(got == et && dims.iter().copied().eq(shape.iter().map(|&s| s as i64)));
        }
        // SAFETY: `v` is a live tensor value (the module's contract).
        let (got, dims) = unsafe { self.value_type_shape(v) }?;
        Ok(got == et && dims == shape)
    }

    pub unsafe fn tensor_data(&self, v: *const OrtValue) -> Result<*mut u8> {
        // SAFETY: `v` is a live tensor value (the module's contract). The C signature takes
        // `OrtValue*` but only reads the value to return its buffer pointer; whether that
        // buffer may be written is up to the caller (inputs are only read).
        let f = |p| unsafe { (self.0.GetTensorMutableData)(v as *mut OrtValue, p) };
        Ok(self.out(ptr::null_mut(), f)? as *mut u8)
    }

    // ---- kernel context, kernel info, shape-inference context -----------------------------

    /// Run a C API call that fills one out-parameter, starting from `init`.
    pub(crate) fn out<T>(&self, init: T, f: impl FnOnce(*mut T) -> OrtStatusPtr) -> Result<T> {
        let mut v = init;
        self.check(f(&mut v))?;
        Ok(v)
    }

    pub unsafe fn input_count(&self, ctx: *const OrtKernelContext) -> Result<usize> {
        // SAFETY: `ctx` is a live kernel context (the module's contract); `n` a writable local.
        self.out(0, |n| unsafe {
            (self.0.KernelContext_GetInputCount)(ctx, n)
        })
    }
    pub unsafe fn output_count(&self, ctx: *const OrtKernelContext) -> Result<usize> {
        // SAFETY: as in `input_count`.
        self.out(0, |n| unsafe {
            (self.0.KernelContext_GetOutputCount)(ctx, n)
        })
    }
    pub unsafe fn input(&self, ctx: *const OrtKernelContext, i: usize) -> Result<*const OrtValue> {
        // SAFETY: as in `input_count`; `i` is below the context's input count.
        self.out(ptr::null(), |v| unsafe {
            (self.0.KernelContext_GetInput)(ctx, i, v)
        })
    }
    pub unsafe fn output(
        &self,
        ctx: *mut OrtKernelContext,
        i: usize,
        shape: &[usize],
    ) -> Result<*mut OrtValue> {
        let get = self.0.KernelContext_GetOutput;
        with_i64_dims(shape, |d| {
            // SAFETY: `ctx` is a live kernel context and `i` below its output count (the
            // module's contract); `d` holds `d.len()` dims; `v` is a writable local.
            self.out(ptr::null_mut(), |v| unsafe {
                get(ctx, i, d.as_ptr(), d.len(), v)
            })
        })
    }
    pub unsafe fn info_input_count(&self, info: *const OrtKernelInfo) -> Result<usize> {
        // SAFETY: `info` is a live kernel info (the module's contract); `n` a writable local.
        self.out(0, |n| unsafe { (self.0.KernelInfo_GetInputCount)(info, n) })
    }
    pub unsafe fn sic_input_count(&self, ctx: *const OrtShapeInferContext) -> Result<usize> {
        // SAFETY: `ctx` is a live shape-inference context (the module's contract).
        self.out(0, |n| unsafe {
            (self.0.ShapeInferContext_GetInputCount)(ctx, n)
        })
    }

    /// A variable-size attribute: asks `get` for the size first, then fills a buffer.
    pub(crate) fn read_array<T: Default + Clone>(
        &self,
        get: impl Fn(*mut T, &mut usize) -> OrtStatusPtr,
    ) -> Option<Vec<T>> {
        let mut size = 0usize;
        self.check(get(ptr::null_mut(), &mut size)).ok()?;
        let mut v = vec![T::default(); size.max(1)];
        self.check(get(v.as_mut_ptr(), &mut size)).ok()?;
        v.truncate(size);
        Some(v)
    }

    /// Declared element type and dims (None = unknown) of node input `i`; `None` when the input
    /// is absent or has no tensor type.
    pub unsafe fn info_input_spec(
        &self,
        info: *const OrtKernelInfo,
        i: usize,
    ) -> Option<(ET, Vec<Dim>)> {
        let mut ti: *mut ort_sys::OrtTypeInfo = ptr::null_mut();
        // SAFETY: `info` is a live kernel info and `i` below its input count (the module's
        // contract). `ti` is used only after `KernelInfo_GetInputTypeInfo` succeeded with a
        // non-null type info owned here; `tinfo` points into `ti` (not owned) and is used only
        // before `ti` is released, exactly once.
        unsafe {
            self.check((self.0.KernelInfo_GetInputTypeInfo)(info, i, &mut ti))
                .ok()?;
            if ti.is_null() {
                return None;
            }
            let mut tinfo: *const OrtTensorTypeAndShapeInfo = ptr::null();
            let r = self
                .check((self.0.CastTypeInfoToTensorInfo)(ti, &mut tinfo))
                .ok()
                .filter(|_| !tinfo.is_null())
                .and_then(|_| self.info_spec_dims(tinfo).ok());
            (self.0.ReleaseTypeInfo)(ti);
            r
        }
    }

    // ---- shape inference ------------------------------------------------------------------

    /// Input `i`'s element type and dims (the info is owned by the context).
    pub unsafe fn sic_input(
        &self,
        ctx: *const OrtShapeInferContext,
        i: usize,
    ) -> Result<(ET, Vec<Dim>)> {
        let mut info: *mut OrtTensorTypeAndShapeInfo = ptr::null_mut();
        // SAFETY: `ctx` is a live shape-inference context and `i` below its input count (the
        // module's contract); the info it returns belongs to the context (so is not released
        // here) and is read only after the call succeeded with a non-null pointer.
        unsafe {
            self.check((self.0.ShapeInferContext_GetInputTypeShape)(
                ctx, i, &mut info,
            ))?;
            if info.is_null() {
                return Err(Error::internal("no type info"));
            }
            self.info_spec_dims(info)
        }
    }

    /// The node's attribute `name`; `None` if it has none.
    pub unsafe fn sic_attr(
        &self,
        ctx: *const OrtShapeInferContext,
        name: &CStr,
    ) -> Option<*const OrtOpAttr> {
        // SAFETY: `ctx` is a live shape-inference context (the module's contract); `name` is
        // NUL-terminated; `a` is a writable local.
        let get = |a| unsafe { (self.0.ShapeInferContext_GetAttribute)(ctx, name.as_ptr(), a) };
        self.out(ptr::null(), get).ok().filter(|a| !a.is_null())
    }

    /// Read an attribute as `ty`; `None` if it does not hold that type.
    pub unsafe fn read_attr_scalar(
        &self,
        a: *const OrtOpAttr,
        ty: OrtOpAttrType,
    ) -> Option<[u8; 8]> {
        let mut buf = [0u8; 8];
        let mut out = 0usize;
        // SAFETY: `a` is a live attribute (the module's contract); `buf` has the `buf.len()`
        // bytes passed as its size, so `ReadOpAttr` writes at most that many (it fails rather
        // than overflow); `out` is a writable local.
        let st = unsafe {
            (self.0.ReadOpAttr)(a, ty, buf.as_mut_ptr() as *mut c_void, buf.len(), &mut out)
        };
        self.check(st).ok().map(|_| buf)
    }

    /// Read a variable-size attribute (string / list) as raw bytes.
    pub unsafe fn read_attr_bytes(
        &self,
        a: *const OrtOpAttr,
        ty: OrtOpAttrType,
    ) -> Option<Vec<u8>> {
        let mut out = 0usize;
        // First call with no room reports the size (and an error status we drop).
        // SAFETY: `a` is a live attribute (the module's contract); with a null buffer of size
        // 0 `ReadOpAttr` writes only `out`, a writable local.
        let st = unsafe { (self.0.ReadOpAttr)(a, ty, ptr::null_mut(), 0, &mut out) };
        self.release(st);
        let mut buf = vec![0u8; out.max(1)];
        // SAFETY: as in `read_attr_scalar`: `buf` has the `buf.len()` bytes passed as its size.
        let st = unsafe {
            (self.0.ReadOpAttr)(a, ty, buf.as_mut_ptr() as *mut c_void, buf.len(), &mut out)
        };
        self.check(st).ok()?;
        buf.truncate(out);
        Some(buf)
    }

    /// Tell ONNX Runtime output `i`'s element type and dims (unknown dims get a symbolic name).
    pub unsafe fn sic_set_output(
        &self,
        ctx: *const OrtShapeInferContext,
        i: usize,
        et: ET,
        dims: &[Dim],
        sym_prefix: &str,
    ) -> Result<()> {
        let mut info: *mut OrtTensorTypeAndShapeInfo = ptr::null_mut();
        // SAFETY: `ctx` is a live shape-inference context and `i` below the op's output count
        // (the module's contract). `info` is used only after `CreateTensorTypeAndShapeInfo`
        // succeeded, is owned here and released exactly once, after its last use. `vals`,
        // `names` and `ptrs` outlive the calls that read them (onnxruntime copies dims and
        // names) and each has `dims.len()` entries, the count passed.
        unsafe {
            self.check((self.0.CreateTensorTypeAndShapeInfo)(&mut info))?;
            let r = (|| {
                self.check((self.0.SetTensorElementType)(info, et))?;
                let vals: Vec<i64> = dims
                    .iter()
                    .map(|d| d.known().map_or(-1, |v| v as i64))
                    .collect();
                self.check((self.0.SetDimensions)(info, vals.as_ptr(), vals.len()))?;
                // A symbolic dim keeps its expression as its name (`N`, `N + 1`), so ONNX
                // Runtime sees equal dims as equal; an unknown one gets a fresh name.
                let names: Vec<CString> = dims
                    .iter()
                    .enumerate()
                    .map(|(j, d)| match d {
                        Dim::Known(_) => CString::default(),
                        Dim::Sym(_) => CString::new(d.to_string()).unwrap_or_default(),
                        Dim::Unknown => {
                            CString::new(format!("{sym_prefix}_d{j}")).unwrap_or_default()
                        }
                    })
                    .collect();
                let mut ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
                self.check((self.0.SetSymbolicDimensions)(
                    info,
                    ptrs.as_mut_ptr(),
                    ptrs.len(),
                ))?;
                self.check((self.0.ShapeInferContext_SetOutputTypeShape)(ctx, i, info))
            })();
            (self.0.ReleaseTensorTypeAndShapeInfo)(info);
            r
        }
    }
}
