//! The one call path from framework tensors to kernels. Every adapter (and the Python core)
//! runs an op the same way:
//!
//! 1. decode attributes from the framework's source and bind them to the schema, once per
//!    distinct attribute set ([`CallSites`]) or once per kernel instance ([`CallSite`]);
//! 2. build input views ([`TensorRef`]) of the framework's tensors;
//! 3. [`run`]: infer output specs (cached per call site), let the framework allocate the
//!    outputs through its [`OutputAllocator`], run the kernel on the framework's
//!    [`ThreadPool`], with data-dependent outputs allocated by the kernel once it knows them,
//!    and every panic caught;
//! 4. report an [`Error`] through the framework's error type ([`boundary`]).
//!
//! What is framework-specific is only behind those traits: the allocator, the pool, the
//! attribute source and the error sink.

use crate::op::{InferCache, KernelCtx, OutputAllocator};
use crate::schema::ArgType;
use crate::{
    AttrValue, Attrs, DType, Error, OpDef, OwnedTensor, Result, TensorMut, TensorRef, ThreadPool,
};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

/// A small most-recently-added cache: at most `cap` items, the oldest dropped first. A
/// contended cache is bypassed rather than waited for (a miss costs only recomputation), and
/// items are only ever pushed whole, so a poisoned lock still guards consistent data.
pub struct Bounded<T> {
    cap: usize,
    items: Mutex<Vec<T>>,
}

impl<T> Bounded<T> {
    pub const fn new(cap: usize) -> Self {
        Bounded {
            cap,
            items: Mutex::new(Vec::new()),
        }
    }
    fn lock(&self) -> Option<MutexGuard<'_, Vec<T>>> {
        match self.items.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
    /// The first `f(item)` that is `Some`.
    pub fn find_map<R>(&self, f: impl FnMut(&T) -> Option<R>) -> Option<R> {
        self.lock()?.iter().find_map(f)
    }
    /// Remember `item()` (not even built when the cache is contended or has no room at all).
    pub fn insert_with(&self, item: impl FnOnce() -> T) {
        if self.cap == 0 {
            return;
        }
        if let Some(mut items) = self.lock() {
            if items.len() >= self.cap {
                items.remove(0);
            }
            items.push(item());
        }
    }
}

/// Attributes bound once, and the output specs inferred under them for recent input shapes.
/// Kept per kernel instance (ONNX Runtime, TensorFlow) or per distinct attribute set
/// ([`CallSites`]: torch, XLA).
pub struct CallSite {
    pub attrs: Attrs,
    pub infer: InferCache,
    /// The kernel's own forms of inputs constant at this site (ONNX Runtime's constant
    /// initializers), by tensor input ([`crate::op::Prepacked`]).
    pub prepacked: Vec<(usize, crate::op::Prepacked)>,
}

impl CallSite {
    pub fn new(attrs: Attrs) -> Self {
        CallSite {
            attrs,
            infer: InferCache::new(),
            prepacked: Vec::new(),
        }
    }
    /// A site for a single call: nothing is cached.
    pub fn once(attrs: Attrs) -> Self {
        CallSite {
            attrs,
            infer: InferCache::disabled(),
            prepacked: Vec::new(),
        }
    }
}

/// How many attribute sets [`CallSites`] remembers per op.
pub const CALL_SITES: usize = 32;

/// The call sites of one op, keyed by an adapter-chosen byte encoding of the attributes as
/// the framework passed them (so a repeated call neither decodes nor binds them again).
pub struct CallSites {
    sites: Bounded<(Box<[u8]>, Arc<CallSite>)>,
    /// The site of the empty key (no attribute given: an op without attributes, or every
    /// default), found without locking or comparing.
    defaults: OnceLock<Arc<CallSite>>,
}

impl Default for CallSites {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    /// Scratch space for call-site keys, so a cache hit does not allocate.
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl CallSites {
    pub const fn new() -> Self {
        CallSites {
            sites: Bounded::new(CALL_SITES),
            defaults: OnceLock::new(),
        }
    }
    /// The site whose key `key` writes; on a miss `bind` decodes and binds the attributes.
    /// `key` returns false when the attributes cannot be keyed (they are then bound every
    /// time, and binding reports what is wrong with them).
    pub fn get_or_bind(
        &self,
        key: impl FnOnce(&mut Vec<u8>) -> bool,
        bind: impl FnOnce() -> Result<Attrs>,
    ) -> Result<Arc<CallSite>> {
        let owned_key = KEY.with(|k| {
            // A re-entrant call (a kernel calling an op) gets a fresh buffer.
            let mut fresh = Vec::new();
            let mut guard = k.try_borrow_mut();
            let buf = match guard.as_mut() {
                Ok(b) => &mut **b,
                Err(_) => &mut fresh,
            };
            buf.clear();
            if !key(buf) {
                return Err(None);
            }
            if buf.is_empty() {
                if let Some(s) = self.defaults.get() {
                    return Err(Some(s.clone()));
                }
            }
            let hit = self
                .sites
                .find_map(|(k, s)| (**k == buf[..]).then(|| s.clone()));
            match hit {
                Some(s) => Err(Some(s)),
                None => Ok(buf.clone().into_boxed_slice()),
            }
        });
        let owned_key = match owned_key {
            Err(Some(site)) => return Ok(site),
            Err(None) => None,
            Ok(k) => Some(k),
        };
        let site = Arc::new(CallSite::new(bind()?));
        match owned_key {
            Some(k) if k.is_empty() => {
                // (A racing thread may have set it first: its site is equivalent.)
                let _ = self.defaults.set(site.clone());
            }
            Some(k) => self.sites.insert_with(|| (k, site.clone())),
            None => {}
        }
        Ok(site)
    }
}

impl AttrValue {
    /// Append an unambiguous encoding of the value (a [`CallSites`] key).
    pub fn write_key(&self, out: &mut Vec<u8>) {
        let words = |out: &mut Vec<u8>, tag: u8, w: &mut dyn Iterator<Item = u64>| {
            out.push(tag);
            let at = out.len();
            out.extend_from_slice(&[0; 8]);
            let mut n = 0u64;
            for x in w {
                out.extend_from_slice(&x.to_ne_bytes());
                n += 1;
            }
            out[at..at + 8].copy_from_slice(&n.to_ne_bytes());
        };
        match self {
            AttrValue::None => out.push(0),
            AttrValue::Int(i) => words(out, 1, &mut std::iter::once(*i as u64)),
            AttrValue::Float(f) => words(out, 2, &mut std::iter::once(f.to_bits())),
            AttrValue::Bool(b) => words(out, 3, &mut std::iter::once(*b as u64)),
            AttrValue::Str(s) => {
                words(out, 4, &mut std::iter::once(s.len() as u64));
                out.extend_from_slice(s.as_bytes());
            }
            AttrValue::IntList(v) => words(out, 5, &mut v.iter().map(|&i| i as u64)),
            AttrValue::FloatList(v) => words(out, 6, &mut v.iter().map(|f| f.to_bits())),
        }
    }
}

/// A framework's attributes looked up by name (TensorFlow node attributes, ONNX node
/// attributes). Frameworks that pass attributes as a list (torch's stack, XLA's call frame,
/// Python keywords) bind that list with [`OpDef::bind_attrs`] instead, which also rejects
/// unknown names.
pub trait AttrSource {
    /// The value given for attribute `name`, declared `ty` by the schema; `None` when the call
    /// leaves it out (the default applies). A value of another type may be returned: binding
    /// then reports the mismatch by name.
    fn get(&mut self, name: &str, ty: &ArgType) -> Result<Option<AttrValue>>;
}

impl OpDef {
    /// Read every schema attribute from `src` and bind them.
    pub fn decode_attrs(&self, src: &mut dyn AttrSource) -> Result<Attrs> {
        let mut given = Vec::new();
        for a in self.schema.attr_args() {
            if let Some(v) = src.get(&a.name, &a.ty).map_err(|e| e.in_op(self))? {
                given.push((a.name.as_str(), v));
            }
        }
        self.bind_attrs(given)
    }
}

/// What one call does with its outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Allocate the outputs and run the kernel.
    Compute,
    /// Only allocate outputs of the inferred shapes (torch Meta / FakeTensor). Refused for
    /// ops with a data-dependent output shape.
    ShapesOnly,
}

/// Tracks which outputs a data-dependent kernel allocated through the host's allocator.
struct Tracked<'h, 't> {
    host: &'h mut dyn OutputAllocator<'t>,
    done: Vec<bool>,
}

impl<'t> OutputAllocator<'t> for Tracked<'_, 't> {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'t>> {
        match self.done.get_mut(index) {
            Some(d) if !*d => *d = true,
            _ => {
                return Err(Error::internal(format!(
                    "output {index} allocated twice or out of range"
                )))
            }
        }
        // Inference checked every known output size; a data-dependent shape is known only now.
        crate::tensor::checked_byte_size(shape, dtype.size())
            .map_err(|e| Error::invalid(format!("output {index}: {}", e.message)))?;
        self.host.allocate(index, dtype, shape)
    }
}

/// Run `op` on `inputs` with the attributes of `site`: validate and infer (through the site's
/// cache), allocate every output through `outputs` (the framework's memory), then compute on
/// `pool`. Data-dependent ops allocate their outputs from inside the kernel through the same
/// allocator. Errors name the op; a panic anywhere becomes an internal error; on error the
/// kernel has not run, or its outputs must be discarded by the caller.
pub fn run<'t>(
    op: &'t OpDef,
    inputs: &[Option<TensorRef<'t>>],
    site: &'t CallSite,
    outputs: &mut dyn OutputAllocator<'t>,
    pool: &'t dyn ThreadPool,
    phase: Phase,
) -> Result<()> {
    run_with_epilogue(op, inputs, site, outputs, pool, phase, &[])
}

/// [`run`], then the steps of `epilogue` (elementwise ops, [`crate::Epilogue`]) on the output,
/// in place: applied by the kernel block by block when the op [`applies_epilogue`]
/// (`crate::OpFlags::applies_epilogue`), else over the whole output after it. The op must have
/// one f32 output of a static shape, and a binary step's operand its element count (an error
/// before the kernel runs otherwise).
///
/// [`applies_epilogue`]: crate::OpFlags::applies_epilogue
pub fn run_with_epilogue<'t>(
    op: &'t OpDef,
    inputs: &[Option<TensorRef<'t>>],
    site: &'t CallSite,
    outputs: &mut dyn OutputAllocator<'t>,
    pool: &'t dyn ThreadPool,
    phase: Phase,
    epilogue: &[crate::Epilogue<'t>],
) -> Result<()> {
    // Kernels compute with FTZ / DAZ off whatever this thread's mode (SPEC.md §2); the
    // caller's mode is back when this drops, on return or unwinding (see `fpenv`).
    let _fp = crate::fpenv::KernelFpEnv::enter();
    crate::catch_panic(op, || {
        let specs = op.infer_concrete_cached(&site.infer, inputs, &site.attrs)?;
        if !epilogue.is_empty() {
            let elements = match &specs[..] {
                [s] if s.dtype == DType::F32 && !op.flags.data_dependent_shape => {
                    s.shape.as_ref().map(|d| d.iter().product::<usize>())
                }
                _ => None,
            };
            let Some(elements) = elements else {
                return Err(Error::internal(
                    "an epilogue needs one f32 output of a static shape",
                ));
            };
            for e in epilogue {
                if let crate::Epilogue::Binary(_, other, _) = e {
                    if other.len() != elements {
                        return Err(Error::invalid(format!(
                            "an epilogue's operand has {} elements, the output {elements}",
                            other.len()
                        )));
                    }
                }
            }
        }
        if op.flags.data_dependent_shape {
            if phase == Phase::ShapesOnly {
                return Err(Error::unsupported(
                    "data-dependent output shape: the result's size depends on the input \
                     values, so it cannot be computed without data",
                ));
            }
            let mut tracked = Tracked {
                host: outputs,
                done: vec![false; specs.len()],
            };
            {
                let mut none: [TensorMut; 0] = [];
                let mut ctx = KernelCtx::new(op, inputs, &mut none, &site.attrs, pool)
                    .with_allocator(&mut tracked)
                    .with_prepacked(&site.prepacked);
                (op.cpu)(&mut ctx)?;
            }
            return match tracked.done.iter().position(|d| !d) {
                Some(i) => Err(Error::internal(format!(
                    "kernel did not allocate output {i}"
                ))),
                None => Ok(()),
            };
        }
        let mut views: crate::Few<TensorMut<'t>> = crate::Few::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let shape = s.shape.as_deref().ok_or_else(|| {
                Error::internal("shape inference left a dimension unknown for concrete inputs")
            })?;
            // (sizes were overflow-checked by inference)
            views.push(outputs.allocate(i, s.dtype, shape)?);
        }
        if phase == Phase::ShapesOnly {
            return Ok(());
        }
        // Large fresh outputs would spend more time in page faults than in the kernel: advised
        // as huge pages where the allocator accepts it, else, where they are known to be fresh,
        // faulted in by the pool's threads first (`hugepages`).
        let huge = crate::hugepages::advised(outputs.huge_pages());
        for v in &views {
            let (lo, hi) = byte_range(v.ptr(), v.dtype, &v.shape, &v.strides);
            if huge {
                crate::hugepages::advise(lo, hi);
            } else if outputs.always_fresh() {
                crate::hugepages::prefault(lo, hi, pool);
            }
        }
        // An output that shares memory with an input (XLA `input_output_aliases`) would make
        // the kernel read through a shared view of memory it writes: such inputs are copied
        // first, so views never alias.
        let copies: Vec<Option<OwnedTensor>> =
            if !outputs.always_fresh() && inputs.iter().flatten().any(|t| overlaps(t, &views)) {
                inputs
                    .iter()
                    .map(|t| {
                        t.as_ref()
                            .filter(|t| overlaps(t, &views))
                            .map(OwnedTensor::copy_of)
                    })
                    .collect()
            } else {
                Vec::new()
            };
        let unaliased: Vec<Option<TensorRef>>;
        let inputs = if copies.is_empty() {
            inputs
        } else {
            unaliased = inputs
                .iter()
                .zip(&copies)
                .map(|(t, c)| c.as_ref().map(OwnedTensor::view).or_else(|| t.clone()))
                .collect();
            &unaliased
        };
        // (The views' lifetime shortens to that of the copies: moved, as `SmallVec` is
        // invariant in its items.)
        fn shorten<'s, 'l: 's>(v: TensorMut<'l>) -> TensorMut<'s> {
            v
        }
        let mut views: crate::Few<TensorMut> = views.into_iter().map(shorten).collect();
        // An epilogue operand that shared memory with the output would be read through a
        // shared view of memory the kernel writes: refused (no caller makes one).
        for e in epilogue {
            if let crate::Epilogue::Binary(_, other, _) = e {
                let lo = other.as_ptr() as usize;
                let hi = lo + std::mem::size_of_val(*other);
                if views.iter().any(|o| {
                    let (a, b) = byte_range(o.ptr(), o.dtype, &o.shape, &o.strides);
                    lo < b && a < hi
                }) {
                    return Err(Error::internal("an epilogue's operand overlaps the output"));
                }
            }
        }
        let mut ctx = KernelCtx::new(op, inputs, &mut views, &site.attrs, pool)
            .with_epilogue((!epilogue.is_empty()).then_some(epilogue))
            .with_prepacked(&site.prepacked);
        (op.cpu)(&mut ctx)?;
        if ctx.take_epilogue().is_some() {
            for v in views.iter_mut() {
                crate::Epilogue::apply_all(epilogue, v.as_mut_slice::<f32>()?, 0);
            }
        }
        Ok(())
    })
}

/// The bytes a view can reach, as a half-open address range (empty for an empty tensor).
fn byte_range(ptr: *const u8, dtype: DType, shape: &[usize], strides: &[isize]) -> (usize, usize) {
    if shape.contains(&0) {
        return (0, 0);
    }
    let (mut lo, mut hi) = (0isize, 0isize);
    for (&d, &s) in shape.iter().zip(strides) {
        let reach = (d as isize - 1) * s * dtype.size() as isize;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    let base = ptr as isize;
    ((base + lo) as usize, (base + hi) as usize + dtype.size())
}

/// Whether input `t` shares memory with any output (no allocation: this runs on every call).
fn overlaps(t: &TensorRef, outputs: &[TensorMut]) -> bool {
    let (lo, hi) = byte_range(t.ptr(), t.dtype, &t.shape, &t.strides);
    outputs.iter().any(|o| {
        let (a, b) = byte_range(o.ptr(), o.dtype, &o.shape, &o.strides);
        lo < b && a < hi
    })
}

/// Run `f` at an FFI boundary: a polyop error or a panic becomes `sink(error)` (the
/// framework's error value), success `ok`. No panic unwinds past this.
pub fn boundary<R, O: crate::OpRef + Copy>(
    op: O,
    ok: R,
    f: impl FnOnce() -> Result<()>,
    sink: impl FnOnce(Error) -> R,
) -> R {
    match crate::catch_panic(op, f) {
        Ok(()) => ok,
        Err(e) => sink(e.in_op(op)),
    }
}

/// Outputs the caller allocated before the call (XLA's results, `polyop_run`'s buffers), as
/// `(dtype, shape, data)` per output: each must be exactly what inference gives.
pub struct Preallocated<'t> {
    op: &'t OpDef,
    buffers: Vec<Option<(DType, Vec<usize>, *mut u8)>>,
}

impl<'t> Preallocated<'t> {
    /// # Safety
    /// Each `data` must be valid for writes of its dtype and shape, exclusively, for `'t`.
    pub unsafe fn new(op: &'t OpDef, buffers: Vec<(DType, Vec<usize>, *mut u8)>) -> Result<Self> {
        if buffers.len() != op.num_outputs() {
            return Err(Error::invalid(format!(
                "expected {} result(s), the call declares {}",
                op.num_outputs(),
                buffers.len()
            )));
        }
        Ok(Preallocated {
            op,
            buffers: buffers.into_iter().map(Some).collect(),
        })
    }
}

impl<'t> OutputAllocator<'t> for Preallocated<'t> {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'t>> {
        let (d, s, data) = self
            .buffers
            .get_mut(index)
            .and_then(Option::take)
            .ok_or_else(|| Error::internal(format!("no output {index}")))?;
        if d != dtype || s != shape {
            return Err(Error::invalid(format!(
                "result `{}` was declared as {d}{s:?} but the op produces {dtype}{shape:?} \
                 (declare result shapes with polyop.infer)",
                self.op.schema.output_name(index)
            )));
        }
        // SAFETY: the caller of `new` vouched for the buffer; it is handed out once.
        Ok(unsafe { TensorMut::from_raw_contiguous(dtype, shape, data) })
    }
}
