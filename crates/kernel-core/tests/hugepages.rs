//! `call::run` advises a large output as huge pages before the kernel writes it
//! (`kernel_core::hugepages`) when its allocator accepts the advice, or else faults a fresh one
//! in first, and leaves its values to the kernel.

use kernel_core::call::{self, Preallocated};
use kernel_core::hugepages::{self, thp_eligible};
use kernel_core::op::KernelCtx;
use kernel_core::*;

fn ones_cpu(ctx: &mut KernelCtx) -> Result<()> {
    ctx.outputs[0].as_mut_slice::<f32>()?.fill(1.0);
    Ok(())
}

fn same_infer(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
    Ok(vec![ctx.dims(0).map(<[Dim]>::to_vec)])
}

/// `Preallocated`, accepting the advice or not, and saying its memory is fresh or not, as told.
struct Allocator<'t> {
    inner: Preallocated<'t>,
    accepts: bool,
    fresh: bool,
}

impl<'t> OutputAllocator<'t> for Allocator<'t> {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'t>> {
        self.inner.allocate(index, dtype, shape)
    }
    fn huge_pages(&self) -> bool {
        self.accepts
    }
    fn always_fresh(&self) -> bool {
        self.fresh
    }
}

/// `call::run` of `op` (one input, one output of the input's shape) on zeros, writing `out`
/// through an allocator that accepts the huge-page advice or not and says its memory is fresh
/// or not.
fn run_into(op: &OpDef, out: &mut [f32], accepts: bool, fresh: bool, pool: &dyn ThreadPool) {
    let n = out.len();
    let x = vec![0.0f32; n];
    let xv = TensorRef::from_slice(&x, &[n]).unwrap();
    // SAFETY: `out` outlives the call and is `n` f32s, the shape given.
    let inner =
        unsafe { Preallocated::new(op, vec![(DType::F32, vec![n], out.as_mut_ptr() as *mut u8)]) }
            .unwrap();
    let mut alloc = Allocator {
        inner,
        accepts,
        fresh,
    };
    let site = CallSite::once(Attrs::default());
    call::run(op, &[Some(xv)], &site, &mut alloc, pool, Phase::Compute).unwrap();
}

/// Whether `call::run`, writing a fresh 16 MiB output through an allocator that `accepts`
/// the advice (or not), left that output's mapping eligible for huge pages; the output's
/// values checked. `None` when the system says nothing of it.
#[cfg(target_os = "linux")]
fn eligible_after_a_call(accepts: bool) -> Option<bool> {
    let op = OpDef::builder("ones_like(Tensor x) -> Tensor")
        .infer(same_infer)
        .cpu(ones_cpu)
        .build()
        .unwrap();
    let n = 4 << 20; // 16 MiB of f32, a fresh mapping
    let mut map = FreshMap::new(4 * n);
    let out = map.floats();
    let addr = out.as_ptr() as usize;
    let (page, _) = hugepages::advisable(addr, addr + 4 * n).unwrap();
    let always = hugepages::system_mode().as_deref() == Some("always");
    assert_eq!(thp_eligible(page), Some(always), "eligible before the call");
    run_into(&op, out, accepts, false, &SerialPool);
    assert!(out.iter().all(|&v| v == 1.0));
    thp_eligible(page)
}

#[test]
#[cfg(target_os = "linux")]
fn a_large_output_is_advised_before_the_kernel_writes_it_when_its_allocator_accepts() {
    let mode = hugepages::system_mode();
    let always = mode.as_deref() == Some("always");
    // Under THP mode `madvise` (this project's machines) an accepting allocator's output is
    // advised (unless POLYOP_HUGE_PAGES=0) and a declining one's is not (unless
    // POLYOP_HUGE_PAGES=1); elsewhere the advice is never given and the mapping stays as it
    // was.
    for accepts in [true, false] {
        assert_eq!(
            eligible_after_a_call(accepts),
            Some(always || hugepages::advised(accepts)),
            "THP mode {mode:?}, allocator accepts: {accepts}"
        );
    }
    if mode.as_deref() == Some("madvise") && std::env::var_os("POLYOP_HUGE_PAGES").is_none() {
        assert!(hugepages::advised(true) && !hugepages::advised(false));
    }
}

fn untouched_cpu(_ctx: &mut KernelCtx) -> Result<()> {
    Ok(())
}

/// A private anonymous mapping of its own: fresh memory, no page present until touched (a
/// `Vec` of this size may reuse memory glibc kept from an earlier one).
#[cfg(target_os = "linux")]
struct FreshMap(*mut libc::c_void, usize);

#[cfg(target_os = "linux")]
impl FreshMap {
    fn new(len: usize) -> FreshMap {
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        FreshMap(p, len)
    }
    fn floats(&mut self) -> &mut [f32] {
        // SAFETY: the mapping is `self.1` bytes, readable and writable, zero-filled, page
        // aligned (so aligned for f32), and borrowed from `self` mutably.
        unsafe { std::slice::from_raw_parts_mut(self.0 as *mut f32, self.1 / 4) }
    }
}

#[cfg(target_os = "linux")]
impl Drop for FreshMap {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, no longer borrowed.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// The bytes of `buf` resident in memory (`mincore`, page by page).
#[cfg(target_os = "linux")]
fn resident_bytes(buf: &[f32]) -> usize {
    let page = 4096;
    let lo = buf.as_ptr() as usize / page * page;
    let hi = (buf.as_ptr() as usize + 4 * buf.len()).div_ceil(page) * page;
    let mut v = vec![0u8; (hi - lo) / page];
    // SAFETY: `lo..hi` is the whole pages holding `buf`, mapped while it lives; `v` has one
    // entry per page.
    let rc = unsafe { libc::mincore(lo as *mut libc::c_void, hi - lo, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore");
    v.iter().filter(|&&b| b & 1 == 1).count() * page
}

/// The resident bytes of a fresh 16 MiB output after `call::run` of a kernel that writes
/// nothing, through an allocator that accepts the advice or not and says its memory is fresh
/// or not.
#[cfg(target_os = "linux")]
fn resident_after_a_call(accepts: bool, fresh: bool) -> usize {
    let op = OpDef::builder("untouched(Tensor x) -> Tensor")
        .infer(same_infer)
        .cpu(untouched_cpu)
        .build()
        .unwrap();
    let n = 4 << 20; // 16 MiB of f32
    let mut map = FreshMap::new(4 * n);
    let out = map.floats();
    assert!(resident_bytes(out) < 1 << 20, "resident before the call");
    run_into(&op, out, accepts, fresh, &RayonPool);
    let resident = resident_bytes(out);
    assert!(out.iter().all(|&v| v == 0.0), "populating changed a value");
    resident
}

#[test]
#[cfg(target_os = "linux")]
fn a_fresh_output_without_huge_pages_is_faulted_in_before_the_kernel_runs() {
    for (accepts, fresh) in [(false, true), (false, false), (true, true)] {
        let resident = resident_after_a_call(accepts, fresh);
        // only memory known fresh, and not advised as huge pages, is faulted in ahead
        let want = fresh && !hugepages::advised(accepts);
        assert_eq!(
            resident >= 16 << 20,
            want,
            "accepts {accepts}, fresh {fresh}: {resident} bytes resident"
        );
        if !want {
            assert!(resident < 1 << 20, "{resident} bytes resident");
        }
    }
}
