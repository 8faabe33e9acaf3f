//! The floating-point environment kernels compute in.
//!
//! SPEC.md §2 promises the same bits in every framework, subnormal inputs and results
//! included, whatever floating-point mode the calling thread is in. Frameworks do not agree on
//! that mode: TensorFlow and XLA run kernels on threads with flush-to-zero (FTZ: a subnormal
//! result is written as 0) and denormals-are-zero (DAZ: a subnormal input is read as 0) set,
//! torch, ONNX Runtime and NumPy on threads with both off. So kernels compute in one fixed
//! environment — the IEEE default: FTZ and DAZ off, round to nearest, every exception masked —
//! and the caller's environment is put back afterwards.
//!
//! [`KernelFpEnv`] is the guard that does it. [`call::run`](crate::call::run) holds one around
//! the whole call, and [`parallel_for`](crate::parallel_for) / [`run_tasks`](crate::run_tasks)
//! hold one around each task given to a pool, since a task may run on a framework's worker
//! thread whose mode the call's guard does not reach.
//!
//! On x86-64 the environment is the SSE control/status register MXCSR (`stmxcsr` / `ldmxcsr`;
//! Rust computes `f32` / `f64` with SSE there, never x87). When the control bits are already the
//! default (the common case: torch, ONNX Runtime, NumPy) the guard costs one `stmxcsr`, a
//! compare and a branch. On other architectures the guard does nothing: kernels compute in
//! whatever mode the thread is in (on AArch64 the FZ bit of FPCR is left as the caller set
//! it).

/// MXCSR bit 15, flush-to-zero: subnormal results are written as zero.
pub const MXCSR_FTZ: u32 = 1 << 15;
/// MXCSR bit 6, denormals-are-zero: subnormal inputs are read as zero.
pub const MXCSR_DAZ: u32 = 1 << 6;
/// The control bits of MXCSR (6..=15: DAZ, the six exception masks, rounding control, FTZ);
/// bits 0..=5 are the sticky exception flags, left to accumulate as after any function call.
pub const MXCSR_CONTROL: u32 = 0xFFC0;
/// The control bits kernels compute under: the power-on default (every exception masked,
/// round to nearest, FTZ and DAZ off).
pub const MXCSR_KERNEL: u32 = 0x1F80;

/// Holds the kernel floating-point environment on this thread while alive; the caller's
/// control bits are restored when it drops, on return or on unwinding from a panic. Not
/// `Send`: it must be dropped on the thread that made it.
#[must_use = "the environment is restored when the guard drops"]
pub struct KernelFpEnv {
    /// The caller's MXCSR when it differed from the kernel environment; `None`: nothing to
    /// restore.
    #[cfg(target_arch = "x86_64")]
    saved: Option<u32>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl KernelFpEnv {
    /// Enter the kernel environment on this thread (a no-op if it is already in it).
    #[inline]
    pub fn enter() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let csr = x86::read();
            if csr & MXCSR_CONTROL == MXCSR_KERNEL {
                return Self {
                    saved: None,
                    _not_send: std::marker::PhantomData,
                };
            }
            x86::write((csr & !MXCSR_CONTROL) | MXCSR_KERNEL);
            Self {
                saved: Some(csr),
                _not_send: std::marker::PhantomData,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self {
                _not_send: std::marker::PhantomData,
            }
        }
    }
}

impl Drop for KernelFpEnv {
    #[inline]
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if let Some(saved) = self.saved {
            // the caller's control bits; the exception flags the kernel raised stay raised
            x86::write((x86::read() & !MXCSR_CONTROL) | (saved & MXCSR_CONTROL));
        }
    }
}

/// Run `f` in the kernel floating-point environment, restoring the caller's afterwards.
#[inline]
pub fn with_kernel_env<R>(f: impl FnOnce() -> R) -> R {
    let _env = KernelFpEnv::enter();
    f()
}

/// This thread's MXCSR (x86-64), for tests and diagnostics; `None` elsewhere.
pub fn mxcsr() -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        Some(x86::read())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    #[inline(always)]
    pub(super) fn read() -> u32 {
        let mut csr: u32 = 0;
        // SAFETY: `stmxcsr` stores the 4-byte MXCSR to the address given, here a live, aligned,
        // writable local u32; SSE is part of the x86-64 baseline, so the instruction exists.
        // It touches no stack and no flags.
        unsafe {
            asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        csr
    }

    #[inline(always)]
    pub(super) fn write(csr: u32) {
        // SAFETY: `ldmxcsr` loads MXCSR from the address given, here a live, aligned local u32.
        // Every caller passes a value read by `stmxcsr` with only bits 0..=15 changed, so the
        // reserved bits stay as the CPU reported them (a set reserved bit would fault). Neither
        // `nomem` nor `readonly`: the compiler must not move memory accesses (the kernel's
        // loads and stores, hence the arithmetic between them) across the mode switch.
        unsafe {
            asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
        }
    }
}
