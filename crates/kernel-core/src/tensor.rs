//! Tensor views: dtype + shape + strides (in elements) + pointer. Views never own data; the
//! framework (or [`OwnedTensor`], for tests and the Python core) does.

use crate::{DType, Element, Error, Result};
use std::borrow::Cow;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Row-major (C order) strides, in elements, for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= d.max(1) as isize;
    }
    strides
}

/// Number of elements of `shape` (1 for rank 0).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Number of elements of `shape`, or `None` when the product overflows `usize`. A zero dim
/// makes the count 0 whatever the other dims are.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The largest tensor polyop accepts, in bytes: `isize::MAX`, the most a Rust allocation (and
/// an element offset in a strided view) can address.
pub const MAX_TENSOR_BYTES: usize = isize::MAX as usize;

/// Element count and byte size of a dense tensor of `shape` with `elem_size`-byte elements,
/// both overflow-checked: errors (InvalidArgument, without an op name; callers add it) when
/// the element count overflows or the byte size exceeds [`MAX_TENSOR_BYTES`].
pub fn checked_byte_size(shape: &[usize], elem_size: usize) -> Result<(usize, usize)> {
    let too_large = |what: String| {
        Error::invalid(format!(
            "shape {shape:?} is too large: {what} (at most {MAX_TENSOR_BYTES} bytes)"
        ))
    };
    let n = checked_numel(shape)
        .ok_or_else(|| too_large("its element count overflows a 64-bit integer".into()))?;
    match n.checked_mul(elem_size) {
        Some(b) if b <= MAX_TENSOR_BYTES => Ok((n, b)),
        _ => Err(too_large(format!("{n} elements of {elem_size} bytes"))),
    }
}

/// True when `strides` describe a dense row-major layout of `shape`. Dims of size 1 may carry
/// any stride, and an empty tensor is always contiguous.
pub fn is_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    if numel(shape) == 0 {
        return true;
    }
    let mut expected = 1isize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected *= d as isize;
    }
    true
}

/// Python-style axis: `-1` is the last. Errors when out of range for `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    // A rank-0 tensor behaves as rank 1 for axis arguments, as in NumPy/PyTorch reductions.
    let r_eff = r.max(1);
    if axis < -r_eff || axis >= r_eff {
        return Err(Error::invalid(format!(
            "axis {axis} is out of range for a tensor of rank {rank} (expected {} to {})",
            -r_eff,
            r_eff - 1
        )));
    }
    Ok(if axis < 0 {
        (axis + r_eff) as usize
    } else {
        axis as usize
    })
}

/// NumPy broadcasting of two concrete shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0usize; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::invalid(format!(
                "shapes {a:?} and {b:?} cannot be broadcast together (dim {da} vs {db})"
            )));
        };
    }
    Ok(out)
}

/// Strides that read a tensor of `shape`/`strides` as if it had the (broadcast) `out_shape`:
/// broadcast dims get stride 0.
pub fn broadcast_strides(shape: &[usize], strides: &[isize], out_shape: &[usize]) -> Vec<isize> {
    let off = out_shape.len() - shape.len();
    let mut out = vec![0isize; out_shape.len()];
    for i in 0..shape.len() {
        out[off + i] = if shape[i] == 1 && out_shape[off + i] != 1 {
            0
        } else {
            strides[i]
        };
    }
    out
}

/// Visit the element offsets (in elements) of a strided layout in row-major order, one
/// innermost row at a time: `f(base_offset, inner_len, inner_stride)`. Kernels use this so
/// the innermost loop is a plain strided loop the compiler can vectorise.
pub fn for_each_row(shape: &[usize], strides: &[isize], mut f: impl FnMut(isize, usize, isize)) {
    if numel(shape) == 0 {
        return;
    }
    if shape.is_empty() {
        f(0, 1, 1);
        return;
    }
    let rank = shape.len();
    let inner = shape[rank - 1];
    let inner_stride = strides[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    let mut base = 0isize;
    loop {
        f(base, inner, inner_stride);
        // advance the odometer over the outer dims
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            base += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            base -= strides[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// An immutable strided view.
#[derive(Clone, Debug)]
pub struct TensorRef<'a> {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Strides in elements (not bytes); may be zero or negative.
    pub strides: Vec<isize>,
    ptr: *const u8,
    _life: PhantomData<&'a [u8]>,
}

// SAFETY: a `TensorRef` only ever reads its elements, which `from_raw`'s contract keeps valid
// and unwritten for `'a` (every `Element` type is `Send + Sync`), so sending it to another
// thread is like sending a `&'a [T]`.
unsafe impl Send for TensorRef<'_> {}
// SAFETY: as for `Send`: shared access only reads, like `&[T]` with `T: Sync`.
unsafe impl Sync for TensorRef<'_> {}

impl<'a> TensorRef<'a> {
    /// # Safety
    /// `shape` and `strides` must have the same length. `ptr` must point to memory valid for
    /// reads, for `'a`, at every offset the shape and strides reach, aligned for `dtype`, each
    /// element a valid value of `dtype` (for `Bool`: the byte 0 or 1), and not written through
    /// any other pointer during `'a` except through the output of an in-place call that
    /// aliases it with the same layout (kernels read such an input only through its raw
    /// pointer, see `polyop_kernels::common::zip_map`). `ptr` may be null or dangling if the
    /// view is empty.
    pub unsafe fn from_raw(
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<isize>,
        ptr: *const u8,
    ) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        TensorRef {
            dtype,
            shape,
            strides,
            ptr,
            _life: PhantomData,
        }
    }

    /// A dense row-major view (what most frameworks hand a kernel): [`TensorRef::from_raw`]
    /// with the contiguous strides of `shape`.
    ///
    /// # Safety
    /// As for [`TensorRef::from_raw`] with those strides.
    pub unsafe fn from_raw_contiguous(dtype: DType, shape: Vec<usize>, ptr: *const u8) -> Self {
        let strides = contiguous_strides(&shape);
        // SAFETY: this function's contract.
        unsafe { Self::from_raw(dtype, shape, strides, ptr) }
    }

    /// A contiguous view of a typed slice.
    pub fn from_slice<T: Element>(data: &'a [T], shape: &[usize]) -> Result<Self> {
        if numel(shape) != data.len() {
            return Err(Error::invalid(format!(
                "shape {shape:?} needs {} elements, got {}",
                numel(shape),
                data.len()
            )));
        }
        Ok(TensorRef {
            dtype: T::DTYPE,
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            ptr: data.as_ptr() as *const u8,
            _life: PhantomData,
        })
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }
    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }
    pub fn spec(&self) -> crate::TensorSpec {
        crate::TensorSpec::new(self.dtype, &self.shape)
    }

    fn check_dtype<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::internal(format!(
                "kernel read a {} tensor as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        Ok(())
    }

    /// The data as a slice, when the view is contiguous.
    pub fn as_slice<T: Element>(&self) -> Result<Option<&'a [T]>> {
        self.check_dtype::<T>()?;
        if !self.is_contiguous() {
            return Ok(None);
        }
        let n = self.numel();
        if n == 0 {
            return Ok(Some(&[]));
        }
        // SAFETY: `T` is the storage type of `self.dtype` (checked above; `Element` is sealed,
        // so `T` has the dtype's size, alignment and valid values). A contiguous view of `n > 0`
        // elements reaches exactly offsets `0..n` from `ptr`, which `from_raw`'s contract (or
        // `from_slice`'s borrow) makes valid, aligned and unwritten for `'a`. This assumes the
        // public `shape`/`strides`/`dtype` fields were not changed to describe more memory
        // than the view was made for (see the note on [`TensorRef::restrided`]).
        Ok(Some(unsafe {
            std::slice::from_raw_parts(self.ptr as *const T, n)
        }))
    }

    /// The data in row-major order: borrowed when contiguous, else copied once.
    pub fn contiguous<T: Element>(&self) -> Result<Cow<'a, [T]>> {
        if let Some(s) = self.as_slice::<T>()? {
            return Ok(Cow::Borrowed(s));
        }
        let mut out = Vec::with_capacity(self.numel());
        let p = self.ptr as *const T;
        for_each_row(&self.shape, &self.strides, |base, len, stride| {
            for i in 0..len as isize {
                // SAFETY: `for_each_row` yields offsets the view's shape and strides reach,
                // which `from_raw` makes valid reads of `T` (the dtype, checked in `as_slice`
                // above); same caveat on the public fields as in `as_slice`.
                out.push(unsafe { *p.offset(base + i * stride) });
            }
        });
        Ok(Cow::Owned(out))
    }

    /// Read one element at a multi-index (slow; for tests and scalars).
    pub fn get<T: Element>(&self, index: &[usize]) -> Result<T> {
        self.check_dtype::<T>()?;
        if index.len() != self.rank() || index.iter().zip(&self.shape).any(|(i, d)| i >= d) {
            return Err(Error::invalid(format!(
                "index {index:?} out of bounds for {:?}",
                self.shape
            )));
        }
        let off: isize = index
            .iter()
            .zip(&self.strides)
            .map(|(&i, &s)| i as isize * s)
            .sum();
        // SAFETY: the dtype is `T`'s (checked) and every index is below its dim (checked), so
        // `off` is an offset the shape and strides reach: a valid read per `from_raw`. Same
        // caveat on the public fields as in `as_slice`.
        Ok(unsafe { *(self.ptr as *const T).offset(off) })
    }

    /// The same data read with the given shape and strides (e.g. broadcast strides).
    ///
    /// Soundness note: the caller must keep every offset the new shape and strides reach among
    /// those the original view reaches (as broadcast strides do); the safe readers above trust
    /// the view's shape and strides. This function, like writing the public fields, is safe
    /// today although breaking that is undefined behaviour: a known gap (issue 12, item 5).
    pub fn restrided(&self, shape: Vec<usize>, strides: Vec<isize>) -> TensorRef<'a> {
        TensorRef {
            dtype: self.dtype,
            shape,
            strides,
            ptr: self.ptr,
            _life: PhantomData,
        }
    }
}

/// A mutable view. Outputs handed to kernels are always contiguous.
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    ptr: *mut u8,
    _life: PhantomData<&'a mut [u8]>,
}

// SAFETY: a `TensorMut` is the exclusive handle of its elements for `'a` (`from_raw`'s
// contract, or `from_slice`'s `&'a mut` borrow), like `&'a mut [T]`, which is `Send` because
// every `Element` type is. It is deliberately not `Sync`.
unsafe impl Send for TensorMut<'_> {}

impl<'a> TensorMut<'a> {
    /// # Safety
    /// `shape` and `strides` must have the same length. `ptr` must be valid for reads and
    /// writes, exclusively for `'a`, at every offset the shape and strides reach, aligned for
    /// `dtype`; may be null or dangling if empty. The elements may be uninitialised (frameworks
    /// allocate outputs with `empty`): kernels write every element before reading it. The one
    /// exception to exclusivity: an input of the same in-place call may alias it with the same
    /// layout (see [`TensorRef::from_raw`]).
    pub unsafe fn from_raw(
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<isize>,
        ptr: *mut u8,
    ) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        TensorMut {
            dtype,
            shape,
            strides,
            ptr,
            _life: PhantomData,
        }
    }

    /// # Safety
    /// As [`TensorMut::from_raw`], for a dense row-major buffer of `shape`.
    pub unsafe fn from_raw_contiguous(dtype: DType, shape: &[usize], ptr: *mut u8) -> Self {
        TensorMut {
            dtype,
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            ptr,
            _life: PhantomData,
        }
    }

    pub fn from_slice<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        if numel(shape) != data.len() {
            return Err(Error::invalid(format!(
                "shape {shape:?} needs {} elements, got {}",
                numel(shape),
                data.len()
            )));
        }
        Ok(TensorMut {
            dtype: T::DTYPE,
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            ptr: data.as_mut_ptr() as *mut u8,
            _life: PhantomData,
        })
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }

    /// The whole buffer as a mutable slice. Errors on a dtype mismatch or a strided output.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::internal(format!(
                "kernel wrote a {} tensor as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        if !self.is_contiguous() {
            return Err(Error::internal("kernel outputs must be contiguous"));
        }
        let n = self.numel();
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: `T` is the dtype's storage type (checked; `Element` is sealed) and the view is
        // contiguous with `n > 0` elements, so it covers offsets `0..n`, which `from_raw`'s
        // contract (or `from_slice`'s borrow) makes valid, aligned and exclusive for `'a`; the
        // slice borrows `self` mutably, so no second one can exist. The elements may still be
        // uninitialised (see `from_raw`): callers write before they read, and this relies on a
        // `&mut [T]` to uninitialised integers or floats not being undefined behaviour by
        // itself (true in practice, not yet settled by the language). Same caveat on the
        // public fields as in [`TensorRef::as_slice`].
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, n) })
    }

    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            ptr: self.ptr,
            _life: PhantomData,
        }
    }
}

/// An owned, contiguous tensor with 8-byte-aligned storage. Used by tests, the Python core
/// and adapters that need scratch space.
#[derive(Clone, Debug)]
pub struct OwnedTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    storage: Vec<u64>,
}

impl OwnedTensor {
    pub fn zeros(dtype: DType, shape: &[usize]) -> Self {
        let bytes = numel(shape) * dtype.size();
        OwnedTensor {
            dtype,
            shape: shape.to_vec(),
            storage: vec![0u64; bytes.div_ceil(8)],
        }
    }
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        if numel(shape) != data.len() {
            return Err(Error::invalid(format!(
                "shape {shape:?} needs {} elements, got {}",
                numel(shape),
                data.len()
            )));
        }
        let mut t = OwnedTensor::zeros(T::DTYPE, shape);
        t.as_mut_slice::<T>()?.copy_from_slice(&data);
        Ok(t)
    }
    /// A contiguous copy of a (possibly strided) view, element by element.
    pub fn copy_of(t: &TensorRef) -> Self {
        let mut out = OwnedTensor::zeros(t.dtype, &t.shape);
        let size = t.dtype.size() as isize;
        let mut dst = out.storage.as_mut_ptr() as *mut u8;
        for_each_row(&t.shape, &t.strides, |base, len, stride| {
            for j in 0..len as isize {
                // SAFETY: `base + j * stride` is the element offset of an index within
                // `t.shape` (for_each_row), readable by the view's contract; `dst` walks `out`,
                // which has room for every element of `t`, and the buffers are distinct.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        t.ptr().offset((base + j * stride) * size),
                        dst,
                        size as usize,
                    );
                    dst = dst.add(size as usize);
                }
            }
        });
        out
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn as_bytes(&self) -> &[u8] {
        let n = self.numel() * self.dtype.size();
        // SAFETY: `zeros` sized `storage` to at least `numel * dtype.size()` bytes, all
        // initialised, and `u8` has no alignment or validity requirement. This holds only while
        // the public `shape`/`dtype` fields keep the values the tensor was made with (a known
        // gap: issue 12, item 5).
        unsafe { std::slice::from_raw_parts(self.storage.as_ptr() as *const u8, n) }
    }
    pub fn view(&self) -> TensorRef<'_> {
        // SAFETY: `storage` holds `numel` initialised elements of `dtype` (zeros, or values
        // written through typed slices), is 8-byte aligned (enough for every dtype) and is
        // not written while `&self` is borrowed for the view's lifetime; the strides are the
        // contiguous ones of `shape`. Same caveat on the public fields as in `as_bytes`.
        unsafe {
            TensorRef::from_raw(
                self.dtype,
                self.shape.clone(),
                contiguous_strides(&self.shape),
                self.storage.as_ptr() as *const u8,
            )
        }
    }
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        // SAFETY: as in `view`, and the view borrows `self` mutably, so it is exclusive.
        unsafe {
            TensorMut::from_raw_contiguous(
                self.dtype,
                &self.shape,
                self.storage.as_mut_ptr() as *mut u8,
            )
        }
    }
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::internal(format!(
                "read a {} tensor as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        // SAFETY: `T` is the dtype's storage type (checked; `Element` is sealed), of size at
        // most 8, so the 8-byte aligned `storage`, sized for `numel` elements of the dtype,
        // holds `numel` initialised `T`s (all-zero bytes are a valid value of every dtype; other
        // bytes were written as `T`). Same caveat on the public fields as in `as_bytes`.
        Ok(unsafe { std::slice::from_raw_parts(self.storage.as_ptr() as *const T, self.numel()) })
    }
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::internal(format!(
                "wrote a {} tensor as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        // SAFETY: as in `as_slice`; `&mut self` makes the slice exclusive.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.storage.as_mut_ptr() as *mut T, self.numel())
        })
    }
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.as_slice::<T>()?.to_vec())
    }
}

/// A raw pointer that may be shared across the tasks of a `parallel_for`, each task writing a
/// disjoint range. The kernel is responsible for the disjointness.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(NonNull<T>);
// SAFETY: a `SharedMut` is only an address; elements are reached only through the `unsafe`
// `slice`, whose contract makes each range one task's at a time. Handing `T`s to other threads
// that way needs `T: Send`.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as for `Send`: `&SharedMut` gives out `&mut [T]` only through `slice`, whose contract
// rules out two tasks touching the same range at once.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(slice: &mut [T]) -> Self {
        SharedMut(NonNull::new(slice.as_mut_ptr()).unwrap_or(NonNull::dangling()))
    }
    /// # Safety
    /// The slice given to [`SharedMut::new`] must still be alive and not otherwise used, and
    /// `start..start+len` must be in bounds of it and not accessed by any other task while the
    /// returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: the caller guarantees the original slice is alive and `start..start+len` is
        // in it (so `add` stays in the allocation; for an empty slice only `0..0`, on which a
        // dangling pointer is fine) and is this task's alone.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr().add(start), len) }
    }
}

/// Call `f` with `shape` as `i64` dims (what framework C APIs take), on the stack for ranks up
/// to 8 (output allocation runs on every call).
pub fn with_i64_dims<R>(shape: &[usize], f: impl FnOnce(&[i64]) -> R) -> R {
    let mut small = [0i64; 8];
    if shape.len() <= small.len() {
        for (d, &s) in small.iter_mut().zip(shape) {
            *d = s as i64;
        }
        f(&small[..shape.len()])
    } else {
        f(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
    }
}

/// [`with_i64_dims`] with the contiguous (row-major) strides of `shape` too, in elements: what
/// a framework's strided allocation takes. Both on the stack for ranks up to 8.
pub fn with_i64_contiguous<R>(shape: &[usize], f: impl FnOnce(&[i64], &[i64]) -> R) -> R {
    with_i64_dims(shape, |sizes| {
        let (mut small, mut heap);
        let strides: &mut [i64] = if sizes.len() <= 8 {
            small = [0i64; 8];
            &mut small[..sizes.len()]
        } else {
            heap = vec![0i64; sizes.len()];
            &mut heap
        };
        let mut acc = 1i64;
        for (s, &d) in strides.iter_mut().zip(sizes).rev() {
            *s = acc;
            acc *= d.max(1);
        }
        f(sizes, strides)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i64_dims_and_contiguous_strides_match_contiguous_strides() {
        for shape in [
            vec![],
            vec![3],
            vec![2, 0, 4],
            vec![2, 3, 4],
            vec![1; 9],
            (1..=10).collect(),
        ] {
            let want: Vec<i64> = contiguous_strides(&shape)
                .iter()
                .map(|&s| s as i64)
                .collect();
            with_i64_contiguous(&shape, |sizes, strides| {
                assert_eq!(sizes, shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
                assert_eq!(strides, want);
            });
        }
    }

    #[test]
    fn raw_contiguous_view_has_row_major_strides() {
        let data = [0f32; 6];
        // SAFETY: `data` holds the 6 f32s of shape [2, 3] and outlives the view.
        let v =
            unsafe { TensorRef::from_raw_contiguous(DType::F32, vec![2, 3], data.as_ptr().cast()) };
        assert_eq!(v.strides, vec![3, 1]);
        assert!(v.is_contiguous());
    }
}
