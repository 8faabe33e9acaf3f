//! A measurement, not a kernel of the library: how fast an f32 convolution runs when its
//! input and output are channels-last (NHWC), the layout question of issue 21 (ONNX Runtime's
//! CPU provider runs convolutions in its blocked NCHWc layout; polyop's `conv2d` is NCHW).
//!
//!     cargo build --release -p polyop-kernels --example nhwc_probe
//!     target/release/examples/nhwc_probe 16 55 64 3 1 1 20    # C H O K stride pad reps
//!     target/release/examples/nhwc_probe peak                  # the tile alone, from L1
//!
//! A direct convolution, one image, one thread, AVX-512: tiles of six output positions of one
//! output row times 64 output channels (24 accumulators), each output one chain of fused
//! multiply-adds from its bias over (input channel, kernel row, kernel column) in order, the
//! order of `conv2d`'s own paths. Each tap's input row is a pointer per position (a zero row
//! where the tap falls in the padding), so nothing is copied or padded. Weights are packed
//! once, `[panel of 64][c][tap][64]` (output channels past `O` zero). Prints the median time
//! of `reps` calls (`COLD=1`: 32 MiB written elsewhere before each) and GFLOP/s of the useful
//! work (`2 * OH * OW * O * C * K * K`); compare with `op_loop conv:C,H,O,K,S,P,1 f32 N prepack`
//! (`conv2d` in NCHW, the same layer).

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Output channels per panel: four AVX-512 vectors.
    const PW: usize = 64;
    /// Output positions per tile.
    const TR: usize = 6;

    /// `out[r * ldo + j] = bias[j] + sum over l < c, t < taps of rows[t][r][l] * w[(l * taps
    /// + t) * PW + j]` for `r < nr`, `j < PW`, optionally through relu.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `rows[t][r]` valid for `c` reads (`t < taps`, `r < TR`),
    /// `w` for `c * taps * PW`, `bias` for `PW`, `out` for writes of rows `r < nr <= TR` of
    /// `PW` values at stride `ldo`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        rows: &[[*const f32; TR]],
        c: usize,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
        ldo: usize,
        nr: usize,
        relu: bool,
    ) {
        let mut acc = [_mm512_setzero_ps(); 4 * TR];
        for r in 0..TR {
            for q in 0..4 {
                // SAFETY: q * 16 + 16 <= PW entries of `bias` (contract).
                acc[r * 4 + q] = unsafe { _mm512_loadu_ps(bias.add(16 * q)) };
            }
        }
        let mut wp = w;
        for l in 0..c {
            for rp in rows {
                // SAFETY: `wp` is one (l, t) entry of PW weights inside `w`; `rp[r] + l` is
                // element l < c of a tap's input row (contract).
                unsafe {
                    let w0 = _mm512_loadu_ps(wp);
                    let w1 = _mm512_loadu_ps(wp.add(16));
                    let w2 = _mm512_loadu_ps(wp.add(32));
                    let w3 = _mm512_loadu_ps(wp.add(48));
                    for r in 0..TR {
                        let a = _mm512_set1_ps(*rp[r].add(l));
                        acc[r * 4] = _mm512_fmadd_ps(a, w0, acc[r * 4]);
                        acc[r * 4 + 1] = _mm512_fmadd_ps(a, w1, acc[r * 4 + 1]);
                        acc[r * 4 + 2] = _mm512_fmadd_ps(a, w2, acc[r * 4 + 2]);
                        acc[r * 4 + 3] = _mm512_fmadd_ps(a, w3, acc[r * 4 + 3]);
                    }
                    wp = wp.add(PW);
                }
            }
        }
        let zero = _mm512_setzero_ps();
        for r in 0..TR {
            // (a constant bound: the accumulators stay in registers)
            if r >= nr {
                break;
            }
            for q in 0..4 {
                let v = if relu {
                    _mm512_max_ps(zero, acc[r * 4 + q])
                } else {
                    acc[r * 4 + q]
                };
                // SAFETY: row r < nr of `out`, PW values (contract).
                unsafe { _mm512_storeu_ps(out.add(r * ldo + 16 * q), v) };
            }
        }
    }

    #[derive(Clone, Copy)]
    struct Layer {
        c: usize,
        h: usize,
        o: usize,
        k: usize,
        s: usize,
        p: usize,
    }

    impl Layer {
        fn out_len(&self) -> usize {
            (self.h + 2 * self.p - self.k) / self.s + 1
        }
        /// Output channels rounded up to whole panels.
        fn o_pad(&self) -> usize {
            self.o.div_ceil(PW) * PW
        }
    }

    /// `[O, C, K, K]` weights as `[panel][c][tap][PW]`.
    fn pack(l: &Layer, w: &[f32]) -> Vec<f32> {
        let taps = l.k * l.k;
        let mut p = vec![0f32; l.o_pad() * l.c * taps];
        for o in 0..l.o {
            for ci in 0..l.c {
                for t in 0..taps {
                    p[((o / PW * l.c + ci) * taps + t) * PW + o % PW] =
                        w[(o * l.c + ci) * taps + t];
                }
            }
        }
        p
    }

    /// The layer over NHWC `x` into `out` (`[OH, OW, o_pad]`).
    fn run(l: &Layer, x: &[f32], wp: &[f32], bias: &[f32], out: &mut [f32], zero: &[f32]) {
        let (n, taps, op) = (l.out_len(), l.k * l.k, l.o_pad());
        assert!(x.len() >= l.h * l.h * l.c && zero.len() >= l.c && out.len() >= n * n * op);
        assert!(wp.len() >= op * l.c * taps && bias.len() >= op);
        let mut rows = vec![[zero.as_ptr(); TR]; taps];
        for panel in 0..op / PW {
            let w = &wp[panel * l.c * taps * PW..];
            for y in 0..n {
                let mut x0 = 0;
                while x0 < n {
                    let nr = TR.min(n - x0);
                    for (t, tap) in rows.iter_mut().enumerate() {
                        let iy = (y * l.s + t / l.k).checked_sub(l.p).filter(|&i| i < l.h);
                        for (r, ptr) in tap.iter_mut().enumerate() {
                            let ix = ((x0 + r.min(nr - 1)) * l.s + t % l.k)
                                .checked_sub(l.p)
                                .filter(|&i| i < l.h);
                            *ptr = match (iy, ix) {
                                (Some(iy), Some(ix)) => x[(iy * l.h + ix) * l.c..].as_ptr(),
                                _ => zero.as_ptr(),
                            };
                        }
                    }
                    let at = (y * n + x0) * op + panel * PW;
                    assert!(at + (nr - 1) * op + PW <= out.len());
                    // SAFETY: checked at run time: AVX-512F (`main`); each row pointer is an
                    // input pixel's `c` channels or the zero row of `c`; `w` holds the panel's
                    // `c * taps * PW` weights and `bias[panel * PW..]` PW values (asserts
                    // above); the output rows are inside `out` (assert).
                    unsafe {
                        tile(
                            &rows,
                            l.c,
                            w.as_ptr(),
                            bias[panel * PW..].as_ptr(),
                            out[at..].as_mut_ptr(),
                            op,
                            nr,
                            true,
                        )
                    };
                    x0 += nr;
                }
            }
        }
    }

    fn peak() {
        let (c, x) = (64, vec![0.5f32; TR * 64]);
        let (w, b, mut o) = (vec![0.25f32; c * PW], vec![0f32; PW], vec![0f32; TR * PW]);
        let rows = [std::array::from_fn(|r| x[r * 64..].as_ptr())];
        let reps = 100_000;
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: AVX-512F checked in `main`; six rows of 64, 64 x PW weights, PW bias,
            // six output rows of PW.
            unsafe {
                tile(
                    &rows,
                    c,
                    w.as_ptr(),
                    b.as_ptr(),
                    o.as_mut_ptr(),
                    PW,
                    TR,
                    false,
                )
            };
            std::hint::black_box(&mut o);
        }
        let flops = 2.0 * (TR * c * PW * reps) as f64;
        println!(
            "tile from L1: {:.1} GFLOP/s",
            flops / t.elapsed().as_secs_f64() / 1e9
        );
    }

    pub fn main() {
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("nhwc_probe needs AVX-512F");
            return;
        }
        let a: Vec<String> = std::env::args().skip(1).collect();
        if a.first().map(String::as_str) == Some("peak") {
            return peak();
        }
        let v: Vec<usize> = a
            .iter()
            .map(|s| s.parse().expect("C H O K S P reps"))
            .collect();
        let [c, h, o, k, s, p, reps] = v[..] else {
            panic!("usage: nhwc_probe C H O K stride pad reps | peak");
        };
        let l = Layer { c, h, o, k, s, p };
        let n = l.out_len();
        let x: Vec<f32> = (0..h * h * c)
            .map(|i| (i * 7919 % 1000) as f32 / 1e3 - 0.5)
            .collect();
        let w: Vec<f32> = (0..o * c * k * k)
            .map(|i| (i * 104_729 % 1000) as f32 / 1e3 - 0.5)
            .collect();
        let (wp, bias, zero) = (pack(&l, &w), vec![0.1f32; l.o_pad()], vec![0f32; c]);
        let mut out = vec![0f32; n * n * l.o_pad()];
        let (cold, mut flush) = (std::env::var_os("COLD").is_some(), vec![0u8; 32 << 20]);
        let mut times = Vec::with_capacity(reps.max(1));
        for i in 0..reps.max(1) {
            if cold {
                flush
                    .iter_mut()
                    .step_by(64)
                    .for_each(|b| *b = b.wrapping_add(i as u8));
            }
            let t = Instant::now();
            run(&l, &x, &wp, &bias, &mut out, &zero);
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        let flops = 2.0 * (n * n * o * c * k * k) as f64;
        println!(
            "nhwc {c},{h},{o},{k},{s},{p}: median {med:.0} us ({:.1} GFLOP/s), best {:.0} us",
            flops / med / 1e3,
            times[0]
        );
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    probe::main();
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("nhwc_probe is x86-64 only");
}
