//! Kernels called directly, with a `KernelCtx` that no shape inference has seen: tensors of
//! the wrong shape are an error, never an out-of-bounds access (the kernels' raw-pointer loops
//! check the shapes they rely on).

use kernel_core::{
    AttrValue, DType, KernelCtx, OutputAllocator, OwnedTensor, Result, SerialPool, TensorMut,
};

fn t(shape: &[usize]) -> OwnedTensor {
    let n: usize = shape.iter().product();
    OwnedTensor::from_vec((0..n).map(|i| i as f32 - 3.0).collect::<Vec<f32>>(), shape).unwrap()
}

/// Run `op` straight through `OpDef::compute` with the given inputs and outputs; the error
/// message, if any. Outputs must be left as they were on error (they are checked by callers).
fn direct(
    op: &str,
    inputs: &[Option<&OwnedTensor>],
    outputs: &mut [OwnedTensor],
    attrs: &[(&str, AttrValue)],
) -> Option<String> {
    let op = polyop_kernels::registry().lookup(op).unwrap();
    let attrs = op
        .bind_attrs(attrs.iter().map(|(n, v)| (*n, v.clone())))
        .unwrap();
    let ins: Vec<_> = inputs.iter().map(|t| t.map(|t| t.view())).collect();
    let mut outs: Vec<TensorMut> = outputs.iter_mut().map(|o| o.view_mut()).collect();
    let mut ctx = KernelCtx::new(op, &ins, &mut outs, &attrs, &SerialPool);
    op.compute(&mut ctx).err().map(|e| e.to_string())
}

fn refused(msg: Option<String>, what: &str) {
    let msg = msg.expect("a wrong shape must be refused");
    assert!(msg.contains(what), "{msg}");
}

#[test]
fn softmax_refuses_an_output_of_another_shape() {
    let x = t(&[4, 8]);
    refused(
        direct("softmax", &[Some(&x)], &mut [t(&[4, 2])], &[]),
        "softmax output",
    );
    let y = t(&[4, 8]);
    refused(
        direct(
            "softmax_backward",
            &[Some(&t(&[4, 2])), Some(&y)],
            &mut [t(&[4, 8])],
            &[],
        ),
        "softmax_backward grad",
    );
    assert_eq!(direct("softmax", &[Some(&x)], &mut [t(&[4, 8])], &[]), None);
}

#[test]
fn topk_refuses_outputs_and_gradients_of_other_shapes() {
    let x = t(&[3, 10]);
    let k = [("k", AttrValue::Int(4))];
    let ind = || OwnedTensor::zeros(DType::I64, &[3, 4]);
    assert_eq!(
        direct("topk", &[Some(&x)], &mut [t(&[3, 4]), ind()], &k),
        None
    );
    refused(
        direct("topk", &[Some(&x)], &mut [t(&[3, 2]), ind()], &k),
        "topk values",
    );
    refused(
        direct(
            "topk",
            &[Some(&x)],
            &mut [t(&[3, 4]), OwnedTensor::zeros(DType::I64, &[3, 1])],
            &k,
        ),
        "topk indices",
    );
    let g = t(&[3, 4]);
    let k_axis = [("axis", AttrValue::Int(-1))];
    let short_ind = OwnedTensor::zeros(DType::I64, &[3, 1]);
    refused(
        direct(
            "topk_backward",
            &[Some(&g), Some(&x), Some(&short_ind)],
            &mut [t(&[3, 10])],
            &k_axis,
        ),
        "topk_backward indices",
    );
    let (g_wide, ind_wide) = (t(&[3, 12]), OwnedTensor::zeros(DType::I64, &[3, 12]));
    refused(
        direct(
            "topk_backward",
            &[Some(&g_wide), Some(&x), Some(&ind_wide)],
            &mut [t(&[3, 10])],
            &k_axis,
        ),
        "not a topk result",
    );
    refused(
        direct(
            "topk_backward",
            &[Some(&g), Some(&x), Some(&ind())],
            &mut [t(&[3, 5])],
            &k_axis,
        ),
        "topk_backward output",
    );
}

#[test]
fn rms_norm_refuses_a_short_weight_and_other_shapes() {
    let x = t(&[5, 16]);
    assert_eq!(
        direct(
            "rms_norm",
            &[Some(&x), Some(&t(&[16]))],
            &mut [t(&[5, 16])],
            &[]
        ),
        None
    );
    refused(
        direct(
            "rms_norm",
            &[Some(&x), Some(&t(&[4]))],
            &mut [t(&[5, 16])],
            &[],
        ),
        "weight",
    );
    refused(
        direct("rms_norm", &[Some(&x), None], &mut [t(&[2, 16])], &[]),
        "rms_norm output",
    );
    refused(
        direct(
            "rms_norm_backward",
            &[Some(&t(&[2, 16])), Some(&x), None],
            &mut [t(&[5, 16]), t(&[16])],
            &[],
        ),
        "rms_norm_backward grad",
    );
}

#[test]
fn reduction_refuses_a_target_that_does_not_broadcast() {
    // add_backward sums the gradient into each input's shape
    let g = t(&[4, 3]);
    assert_eq!(
        direct(
            "add_backward",
            &[Some(&g)],
            &mut [t(&[4, 3]), t(&[1, 3])],
            &[]
        ),
        None
    );
    refused(
        direct(
            "add_backward",
            &[Some(&g)],
            &mut [t(&[4, 3]), t(&[4, 5])],
            &[],
        ),
        "does not broadcast",
    );
}

#[test]
fn conv2d_refuses_mismatched_geometry() {
    let x = t(&[1, 2, 5, 5]);
    let w = t(&[3, 2, 3, 3]);
    assert_eq!(
        direct(
            "conv2d",
            &[Some(&x), Some(&w), None],
            &mut [t(&[1, 3, 3, 3])],
            &[]
        ),
        None
    );
    refused(
        direct(
            "conv2d",
            &[Some(&x), Some(&w), None],
            &mut [t(&[1, 3, 3, 4])],
            &[],
        ),
        "output has",
    );
    refused(
        direct(
            "conv2d",
            &[Some(&x), Some(&w), Some(&t(&[7]))],
            &mut [t(&[1, 3, 3, 3])],
            &[],
        ),
        "bias has",
    );
    refused(
        direct(
            "conv2d",
            &[Some(&x), Some(&t(&[3, 1, 3, 3])), None],
            &mut [t(&[1, 3, 3, 3])],
            &[],
        ),
        "channel mismatch",
    );
    refused(
        direct(
            "conv2d",
            &[Some(&x), Some(&t(&[3, 2, 9, 3])), None],
            &mut [t(&[1, 3, 1, 3])],
            &[],
        ),
        "kernel larger",
    );
    let outs = || [t(&[1, 2, 5, 5]), t(&[3, 2, 3, 3]), t(&[3])];
    refused(
        direct(
            "conv2d_backward",
            &[Some(&t(&[1, 3, 2, 2])), Some(&x), Some(&w), None],
            &mut outs(),
            &[],
        ),
        "grad has",
    );
}

/// An allocator that hands out a buffer of a fixed shape, whatever was asked.
struct Liar(OwnedTensor);

impl<'a> OutputAllocator<'a> for Liar {
    fn allocate(&mut self, _: usize, dtype: DType, _: &[usize]) -> Result<TensorMut<'a>> {
        let v = self.0.view_mut();
        // SAFETY: the tensor is a dense, zeroed buffer of `v`'s dtype and shape, owned by the
        // allocator, which outlives the kernel call below (it is only dropped at the end of the
        // test) and is not touched meanwhile.
        Ok(unsafe { TensorMut::from_raw(dtype, v.shape.clone(), v.strides.clone(), v.ptr()) })
    }
}

#[test]
fn nonzero_refuses_an_allocation_of_another_shape() {
    let op = polyop_kernels::registry().lookup("nonzero").unwrap();
    let attrs = op.bind_attrs([]).unwrap();
    let x = OwnedTensor::from_vec(vec![1.0f32; 12], &[3, 4]).unwrap();
    let ins = [Some(x.view())];
    let mut liar = Liar(OwnedTensor::zeros(DType::I64, &[2, 2]));
    let mut none: [TensorMut; 0] = [];
    let mut ctx =
        KernelCtx::new(op, &ins, &mut none, &attrs, &SerialPool).with_allocator(&mut liar);
    let e = op.compute(&mut ctx).unwrap_err().to_string();
    assert!(e.contains("nonzero output"), "{e}");
    assert_eq!(liar.0.as_slice::<i64>().unwrap(), &[0, 0, 0, 0]);
}
