//! Transparent huge pages for large outputs.
//!
//! A framework's allocation of many megabytes is usually fresh anonymous memory (glibc serves
//! it with `mmap`, and PyTorch's and XLA's CPU allocators do not cache it), so the kernel's
//! first write faults in every 4 KiB page. On the machine this was first measured on a fault
//! cost far more than the arithmetic it interrupts: filling a fresh 64 MiB torch tensor took
//! about 23 ms (7.5 ms under `THP_MEM_ALLOC_ENABLE=1`), and `F.gelu` on 16M floats 30 ms, against
//! 7.4 ms into a preallocated `out=`. Advising the output's 2 MiB-aligned interior as huge pages
//! (`madvise(MADV_HUGEPAGE)`, what PyTorch does for its own tensors under
//! `THP_MEM_ALLOC_ENABLE=1`) makes those faults 512 times fewer.
//!
//! The advice changes how the kernel backs the memory, never a value in it; pages already
//! present stay as they are (an arena's reused memory only pays the system call). It is given
//! only when the system's THP mode is `madvise` (under `always` it is redundant, under `never`
//! ignored), and only for outputs whose allocator accepts it
//! ([`OutputAllocator::huge_pages`](crate::OutputAllocator::huge_pages)): torch's declines in a
//! virtual machine that reports free pages to its host ([`reports_free_pages`]), where its
//! threads' first writes to fresh huge pages stalled for runs of calls (docs/architecture.md,
//! "Large outputs: huge pages"). `POLYOP_HUGE_PAGES=0` turns the advice off everywhere,
//! `POLYOP_HUGE_PAGES=1` gives it to every output, whatever its allocator says.
//!
//! A large output that gets no advice but is known to be fresh memory (torch's,
//! `OutputAllocator::always_fresh`) is faulted in before the kernel runs instead
//! ([`prefault`]): each of the pool's threads populates its share of the 4 KiB pages in one
//! system call, which costs less than the same faults taken one at a time as the kernel writes.

/// Size of one transparent huge page on x86-64 and aarch64 (4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// Outputs smaller than this are not advised: they hold at most one whole huge page and the
/// system call would cost more than it saves.
pub const MIN_ADVISED_BYTES: usize = 4 << 20;

/// `POLYOP_HUGE_PAGES` and the THP mode as one setting (read once): `Some(false)` never advise,
/// `Some(true)` advise every output, `None` advise the outputs whose allocator accepts it.
fn setting() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        decide(
            std::env::var("POLYOP_HUGE_PAGES").ok().as_deref(),
            system_mode().as_deref(),
        )
    })
}

/// The setting for `POLYOP_HUGE_PAGES` (`var`) under THP mode `mode` (see [`setting`]): the
/// advice changes something only under `madvise`; there `0` turns it off and `1` on for every
/// output.
pub fn decide(var: Option<&str>, mode: Option<&str>) -> Option<bool> {
    if mode != Some("madvise") {
        return Some(false);
    }
    match var.map(str::trim) {
        Some("0") => Some(false),
        Some("1") => Some(true),
        _ => None,
    }
}

/// Whether an output whose allocator says `accepts` ([`crate::OutputAllocator::huge_pages`])
/// is advised in this process.
pub fn advised(accepts: bool) -> bool {
    setting().unwrap_or(accepts)
}

/// Whether this system is a virtual machine whose balloon device reports free pages to the
/// host (`VIRTIO_BALLOON_F_REPORTING`, feature bit 5, in a bound virtio balloon's `features`,
/// which sysfs prints as one `0`/`1` character per bit from bit 0). Linux reports free blocks
/// of its page-reporting order (2 MiB by default) and larger: the huge pages. Read once.
pub fn reports_free_pages() -> bool {
    static REPORTS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REPORTS.get_or_init(|| {
        let Ok(devices) = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon") else {
            return false;
        };
        devices.flatten().any(|d| {
            std::fs::read_to_string(d.path().join("features"))
                .is_ok_and(|f| feature_bit(&f, VIRTIO_BALLOON_F_REPORTING))
        })
    })
}

/// The virtio balloon's free page reporting feature bit.
const VIRTIO_BALLOON_F_REPORTING: usize = 5;

/// Whether bit `bit` is set in a virtio device's sysfs `features` string.
fn feature_bit(features: &str, bit: usize) -> bool {
    features.trim().as_bytes().get(bit) == Some(&b'1')
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

/// Advise the whole huge pages inside `lo..hi` as huge pages (when the range is large enough,
/// [`advisable`]). Failures are ignored: the advice is only a hint (memory that is not
/// anonymous, such as a file mapping, refuses it and stays as it was).
pub fn advise(lo: usize, hi: usize) {
    #[cfg(target_os = "linux")]
    if let Some((start, len)) = advisable(lo, hi) {
        // SAFETY: madvise with MADV_HUGEPAGE reads and writes no memory; it only sets a flag
        // on the mappings covering whole pages of the range, which the caller names as
        // memory it owns (an output buffer the framework allocated for this call). An
        // unmapped or unsuitable range makes it return an error, which is harmless and
        // ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (lo, hi);
}

/// Fault in the whole 4 KiB pages inside `lo..hi` (the bytes of a fresh output about to be
/// written), when the range is at least [`MIN_ADVISED_BYTES`]: the range in equal shares, one
/// per thread of `pool`, each populated by one task in one `madvise(MADV_POPULATE_WRITE)`.
/// Populating writes zeros to pages not yet present and nothing to pages present, so no value
/// the caller can see changes (the output is about to be overwritten). Where the system lacks
/// `MADV_POPULATE_WRITE` (Linux before 5.14) the call fails and the kernel's writes fault the
/// pages in as before. Measured on a virtual machine that reports free pages (two threads,
/// 16M float32, torch's output): polyop's `gelu` 18.4 -> 14.5-15.0 ms a call.
pub fn prefault(lo: usize, hi: usize, pool: &dyn crate::ThreadPool) {
    #[cfg(target_os = "linux")]
    if hi.saturating_sub(lo) >= MIN_ADVISED_BYTES {
        const PAGE: usize = 4096;
        let (first, pages) = (lo.div_ceil(PAGE), hi / PAGE - lo.div_ceil(PAGE));
        let shares = pool.num_threads().clamp(1, pages);
        crate::parallel::run_tasks(pool, shares, |i| {
            let a = (first + pages * i / shares) * PAGE;
            let b = (first + pages * (i + 1) / shares) * PAGE;
            // SAFETY: MADV_POPULATE_WRITE faults in, writable, the pages of `a..b`, whole
            // pages inside `lo..hi`, which the caller names as a fresh output it owns and is
            // about to overwrite; it writes zeros only to pages not yet present and changes no
            // mapping. A failure (an old kernel, a mapping that refuses it) is ignored: the
            // kernel's own writes then fault the pages in.
            unsafe {
                libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_POPULATE_WRITE);
            }
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (lo, hi, pool);
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
    fn advice_only_under_madvise_where_the_variable_or_the_allocator_asks() {
        // the default under madvise: what the allocator says
        assert_eq!(decide(None, Some("madvise")), None);
        assert_eq!(decide(Some("yes"), Some("madvise")), None);
        // the variable decides for every output
        assert_eq!(decide(Some("1"), Some("madvise")), Some(true));
        assert_eq!(decide(Some(" 1\n"), Some("madvise")), Some(true));
        assert_eq!(decide(Some("0"), Some("madvise")), Some(false));
        // other modes: never (redundant under always, ignored under never)
        for mode in [Some("always"), Some("never"), None] {
            assert_eq!(decide(Some("1"), mode), Some(false));
            assert_eq!(decide(None, mode), Some(false));
        }
    }

    #[test]
    fn the_reporting_bit_is_read_from_sysfs_s_bit_string() {
        let bits = "0110010100000000000000000000000010000000\n";
        assert!(feature_bit(bits, VIRTIO_BALLOON_F_REPORTING));
        assert!(!feature_bit(bits, 3));
        assert!(feature_bit(bits, 32));
        assert!(!feature_bit("0110000", VIRTIO_BALLOON_F_REPORTING));
        assert!(!feature_bit("011", VIRTIO_BALLOON_F_REPORTING));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_fresh_large_buffer_becomes_eligible_for_huge_pages() {
        // 16 MiB: glibc serves it with its own mmap, as frameworks' large tensors are.
        let buf = vec![0u8; 16 << 20];
        let (lo, hi) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
        let (start, _) = advisable(lo, hi).unwrap();
        if system_mode().as_deref() != Some("madvise") {
            // (redundant under always, ignored under never)
            assert!(
                !advised(true),
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
        advise(lo, hi);
        assert_eq!(
            thp_eligible(start),
            Some(true),
            "the advice did not reach the mapping"
        );
        drop(buf);
    }
}
