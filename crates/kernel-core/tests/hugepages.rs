//! `call::run` advises a large output as huge pages before the kernel writes it
//! (`kernel_core::hugepages`), and leaves its values to the kernel.

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

#[test]
#[cfg(target_os = "linux")]
fn a_large_output_is_advised_before_the_kernel_writes_it() {
    let op = OpDef::builder("ones_like(Tensor x) -> Tensor")
        .infer(same_infer)
        .cpu(ones_cpu)
        .build()
        .unwrap();
    let n = 4 << 20; // 16 MiB of f32: fresh memory from glibc's own mmap
    let x = vec![0.0f32; n];
    let mut out = vec![0.0f32; n];
    let addr = out.as_ptr() as usize;
    let (page, _) = hugepages::advisable(addr, addr + 4 * n).unwrap();
    let mode = hugepages::system_mode();
    let always = mode.as_deref() == Some("always");
    assert_eq!(thp_eligible(page), Some(always), "THP mode {mode:?}");
    let xv = TensorRef::from_slice(&x, &[n]).unwrap();
    // SAFETY: `out` outlives the call and is `n` f32s, the shape given.
    let mut alloc = unsafe {
        Preallocated::new(
            &op,
            vec![(DType::F32, vec![n], out.as_mut_ptr() as *mut u8)],
        )
    }
    .unwrap();
    let site = CallSite::once(Attrs::default());
    call::run(
        &op,
        &[Some(xv)],
        &site,
        &mut alloc,
        &SerialPool,
        Phase::Compute,
    )
    .unwrap();
    assert!(out.iter().all(|&v| v == 1.0));
    // Under THP mode `madvise` (this project's machines) the output's mapping is now eligible;
    // elsewhere the advice is not given and the mapping stays as it was.
    let madvise = mode.as_deref() == Some("madvise");
    assert_eq!(
        thp_eligible(page),
        Some(always || madvise),
        "THP mode {mode:?}"
    );
}
