//! Transparent huge pages for large outputs.
//!
//! A framework's allocation of many megabytes is usually fresh anonymous memory (glibc serves
//! it with `mmap`, and PyTorch's and XLA's CPU allocators do not cache it), so the kernel's
//! first write faults in every 4 KiB page. On this project's machine a fault costs far more
//! than the arithmetic it interrupts: filling a fresh 64 MiB torch tensor takes about 23 ms
//! (7.5 ms under `THP_MEM_ALLOC_ENABLE=1`), and `F.gelu` on 16M floats takes 30 ms, against
//! 7.4 ms into a preallocated `out=`. Advising the output's 2 MiB-aligned interior as huge pages
//! (`madvise(MADV_HUGEPAGE)`, what PyTorch does for its own tensors under
//! `THP_MEM_ALLOC_ENABLE=1`) makes those faults 512 times fewer.
//!
//! The advice changes how the kernel backs the memory, never a value in it; pages already
//! present stay as they are (an arena's reused memory only pays the system call). It is given
//! only when the system's THP mode is `madvise` (under `always` it is redundant, under `never`
//! ignored) and can be turned off with `POLYOP_HUGE_PAGES=0`: under the `madvise` defrag
//! setting a fault in advised memory may compact memory to find a huge page.

/// Size of one transparent huge page on x86-64 and aarch64 (4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// Outputs smaller than this are not advised: they hold at most one whole huge page and the
/// system call would cost more than it saves.
pub const MIN_ADVISED_BYTES: usize = 4 << 20;

/// Whether outputs are advised in this process (read once: the sysfs file and the variable).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let opted_out = std::env::var("POLYOP_HUGE_PAGES").is_ok_and(|v| v.trim() == "0");
        !opted_out && system_mode().as_deref() == Some("madvise")
    })
}

/// The system's THP mode (the bracketed word of `enabled`), if it has THP at all.
pub fn system_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = s.find('[')? + 1;
    let end = start + s[start..].find(']')?;
    Some(s[start..end].to_string())
}

/// The whole huge pages inside the byte range `lo..hi`, as `(start, len)`; `None` when the
/// range is smaller than [`MIN_ADVISED_BYTES`].
pub fn advisable(lo: usize, hi: usize) -> Option<(usize, usize)> {
    if hi.saturating_sub(lo) < MIN_ADVISED_BYTES {
        return None;
    }
    let start = lo.checked_next_multiple_of(HUGE_PAGE)?;
    let end = hi / HUGE_PAGE * HUGE_PAGE;
    (end > start).then(|| (start, end - start))
}

/// Advise the whole huge pages inside `lo..hi` (the bytes of an output about to be written)
/// as huge pages, when [`enabled`]. Failures are ignored: the advice is only a hint (memory
/// that is not anonymous, such as a file mapping, refuses it and stays as it was).
pub fn advise_output(lo: usize, hi: usize) {
    #[cfg(target_os = "linux")]
    if let Some((start, len)) = advisable(lo, hi) {
        if enabled() {
            // SAFETY: madvise with MADV_HUGEPAGE reads and writes no memory; it only sets a
            // flag on the mappings covering whole pages of the range, which lies inside an
            // output buffer the framework allocated for this call. An unmapped or unsuitable
            // range makes it return an error, which is harmless and ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (lo, hi);
}

/// Whether the mapping holding `addr` may get huge pages, from `/proc/self/smaps` (`None`
/// when no mapping holds it, or the kernel does not say). For tests and diagnostics.
pub fn thp_eligible(addr: usize) -> Option<bool> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = (a..b).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("THPeligible:") {
                return Some(v.trim() == "1");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_huge_pages_inside_a_large_range_are_advised() {
        let mb = 1 << 20;
        // Too small, even when aligned.
        assert_eq!(advisable(0, 4 * mb - 1), None);
        // Unaligned ends are cut to the whole pages inside.
        assert_eq!(
            advisable(HUGE_PAGE + 1, 6 * mb + 5),
            Some((2 * HUGE_PAGE, 2 * mb))
        );
        assert_eq!(advisable(2 * mb, 6 * mb), Some((2 * mb, 4 * mb)));
        // The last huge page of the address space: the start cannot round up past it.
        assert_eq!(advisable(usize::MAX - 3 * mb, usize::MAX), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_fresh_large_buffer_becomes_eligible_for_huge_pages() {
        // 16 MiB: glibc serves it with its own mmap, as frameworks' large tensors are.
        let buf = vec![0u8; 16 << 20];
        let (lo, hi) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
        let (start, _) = advisable(lo, hi).unwrap();
        if system_mode().as_deref() != Some("madvise") {
            assert!(
                !enabled(),
                "advice given under THP mode {:?}",
                system_mode()
            );
            return;
        }
        assert_eq!(
            thp_eligible(start),
            Some(false),
            "eligible before the advice"
        );
        advise_output(lo, hi);
        assert_eq!(
            thp_eligible(start),
            Some(true),
            "the advice did not reach the mapping"
        );
        drop(buf);
    }
}
