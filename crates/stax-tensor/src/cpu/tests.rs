//! The CPU backend's own tests: what it reports, uploads, downloads and copies, empty
//! tensors, the im2col workspace bound and the headroom rule's column buffers, pointwise convs
//! and a capped memory.

use super::testing::{backend, tensor};
use super::*;
use crate::ops;
use crate::{Category, Conv2dGeometry, DType, Tensor};

#[test]
fn reports_host_device_and_precision() {
    let opts = BackendOptions {
        precision: Precision::Highest,
        ..Default::default()
    };
    let be = CpuBackend::new(&opts).unwrap();
    assert_eq!(be.device(), Device::Cpu);
    assert_eq!(be.precision(), Precision::Highest);
    assert_eq!(be.driver_memory().unwrap(), None);
    be.synchronize().unwrap();
}

#[test]
fn upload_download_round_trip_and_lengths() {
    let be = backend();
    let mut t = Tensor::empty(&be, [2, 3], DType::U32, Category::Other).unwrap();
    let src: Vec<u8> = (0..24).collect();
    ops::upload(&src, &mut t).unwrap();
    let mut back = vec![0u8; 24];
    ops::download(&t, &mut back).unwrap();
    assert_eq!(back, src);
    let e = ops::upload(&src[..20], &mut t).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::HostLength {
                expected: 24,
                got: 20,
                ..
            }
        ),
        "{e}"
    );
    let e = ops::download(&t, &mut [0u8; 28]).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::HostLength {
                expected: 24,
                got: 28,
                ..
            }
        ),
        "{e}"
    );
    let _view = t.clone();
    assert!(matches!(
        ops::upload(&src, &mut t),
        Err(TensorError::Aliased { op: "upload", .. })
    ));
}

#[test]
fn copy_and_duplicate() {
    let be = backend();
    let src = tensor(&be, &[1.0, 2.0, 3.0, 4.0], [2, 2]);
    let mut dst = tensor(&be, &[0.0; 4], [2, 2]);
    ops::copy(&src, &mut dst).unwrap();
    assert_eq!(dst.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    let dup = src.duplicate().unwrap();
    assert!(!dup.same_buffer(&src));
    assert_eq!(dup.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    let mut wrong = tensor(&be, &[0.0; 4], [4]);
    assert!(matches!(
        ops::copy(&src, &mut wrong),
        Err(TensorError::Shape { .. })
    ));
    let mut words = Tensor::empty(&be, [2, 2], DType::U32, Category::Other).unwrap();
    assert!(matches!(
        ops::copy(&src, &mut words),
        Err(TensorError::DType { .. })
    ));
    let _view = dst.clone();
    assert!(matches!(
        ops::copy(&src, &mut dst),
        Err(TensorError::Aliased { op: "copy", .. })
    ));
}

#[test]
fn empty_tensors_are_fine() {
    let be = backend();
    let mut t = Tensor::empty(&be, [0, 4], DType::F32, Category::Other).unwrap();
    ops::upload(&[], &mut t).unwrap();
    ops::fill(&mut t, 1.0).unwrap();
    assert_eq!(t.to_vec().unwrap(), Vec::<f32>::new());
}

/// 2 images of 5x5x3 into 4 channels by a 3x3 kernel, SAME: 50 output pixels with
/// 27-float patches (108 bytes a row).
fn five_by_five() -> Conv2dGeometry {
    Conv2dGeometry::new(
        &[2, 5, 5, 3].into(),
        &[3, 3, 3, 4].into(),
        (1, 1),
        crate::Padding::Same,
    )
    .unwrap()
}

/// A 4x4x4 f32 matmul: no workspace on the CPU.
fn small_matmul() -> OpDesc {
    OpDesc::Matmul {
        m: 4,
        n: 4,
        k: 4,
        dtype: DType::F32,
        b_dtype: DType::F32,
        transpose_a: false,
        transpose_b: false,
        accumulate: false,
    }
}

#[test]
fn workspace_is_bounded_and_freed_after_conv() {
    // 50 output pixels with 27-float patches: a whole-batch im2col would take 5400 bytes;
    // a 1 KiB bound gives chunks of 9 rows (972 bytes).
    let be = super::testing::backend_with_workspace(1024);
    let g = five_by_five();
    let x = tensor(&be, &[0.5; 150], [2, 5, 5, 3]);
    let w = tensor(&be, &[0.25; 108], [3, 3, 3, 4]);
    let b = tensor(&be, &[0.0; 4], [4]);
    let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Activation).unwrap();
    ops::conv2d(&x, &w, &b, &g, &mut y, Default::default()).unwrap();
    let mut dx = Tensor::empty(&be, g.input_shape(), DType::F32, Category::Other).unwrap();
    ops::conv2d_bwd_data(&y, &w, &g, &mut dx).unwrap();
    let stats = be.allocator().stats();
    let ws = Category::Workspace.index();
    assert_eq!(
        stats.by_category[ws].live, 0,
        "workspace still live after the convs"
    );
    let peak = stats.peak_by_category[ws];
    assert!(peak > 0 && peak <= 2048, "workspace peak {peak} bytes");
    // the planner's query says exactly what each pass allocated: 9 rows of 27 floats
    for pass in [
        crate::ConvPass::Forward,
        crate::ConvPass::BackwardData,
        crate::ConvPass::BackwardFilter,
    ] {
        let q = OpDesc::Conv {
            geometry: g,
            pass,
            dtype: DType::F32,
            bias: true,
        };
        assert_eq!(be.workspace_bytes(&q).unwrap(), 9 * 27 * 4);
    }
    assert_eq!(stats.by_category[ws].peak, 9 * 27 * 4);
    let mm = small_matmul();
    assert_eq!(be.workspace_bytes(&mm).unwrap(), 0);
}

#[test]
fn allotted_headroom_grows_column_buffers_within_the_cap() {
    // 50 output pixels with 27-float patches (108 bytes a row); a 1 KiB bound: 9 rows
    let open = |cap| CpuBackend {
        workspace_bytes: 1024,
        workspace_cap: cap,
        ..Arc::into_inner(CpuBackend::new(&BackendOptions::default()).unwrap()).unwrap()
    };
    let g = five_by_five();
    let conv = |pass, bias| OpDesc::Conv {
        geometry: g,
        pass,
        dtype: DType::F32,
        bias,
    };
    let (fwd, fwd_plain) = (
        conv(ConvPass::Forward, true),
        conv(ConvPass::Forward, false),
    );
    let (bwd_filter, bwd_data) = (
        conv(ConvPass::BackwardFilter, true),
        conv(ConvPass::BackwardData, false),
    );
    let mm = small_matmul();
    let be = open(usize::MAX);
    // the forward pass takes its two ops' least headroom (300: 972 + 300 bytes hold 11
    // rows); 10 more bytes are no row for the filter gradient; a matmul has no columns
    let headroom = [(fwd, 500), (fwd_plain, 300), (bwd_filter, 10), (mm, 1000)];
    assert_eq!(be.allot_workspace(&headroom).unwrap(), 2);
    let bytes = |op| be.workspace_bytes(&op).unwrap();
    assert_eq!([bytes(fwd), bytes(fwd_plain)], [11 * 108; 2]);
    assert_eq!([bytes(bwd_filter), bytes(bwd_data)], [9 * 108; 2]);
    // never shrinks; at most every pixel
    assert_eq!(be.allot_workspace(&[(fwd, 0)]).unwrap(), 0);
    assert_eq!(bytes(fwd), 11 * 108);
    assert_eq!(be.allot_workspace(&[(fwd, 1 << 30)]).unwrap(), 1);
    assert_eq!(bytes(fwd), 50 * 108);
    // the pass allocates what its schedule says, and computes the same
    let be: Arc<dyn Backend> = Arc::new(be);
    let x = tensor(
        &be,
        &(0..150).map(|i| i as f32 / 150.0).collect::<Vec<_>>(),
        [2, 5, 5, 3],
    );
    let w = tensor(
        &be,
        &(0..108).map(|i| 0.5 - i as f32 / 108.0).collect::<Vec<_>>(),
        [3, 3, 3, 4],
    );
    let b = tensor(&be, &[0.0; 4], [4]);
    let run = |be: &Arc<dyn Backend>| {
        let (x, w, b) = (x.to(be).unwrap(), w.to(be).unwrap(), b.to(be).unwrap());
        let mut y = Tensor::empty(be, g.output_shape(), DType::F32, Category::Other).unwrap();
        ops::conv2d(&x, &w, &b, &g, &mut y, Default::default()).unwrap();
        let ws = be.allocator().stats().by_category[Category::Workspace.index()].peak;
        (y.to_vec().unwrap(), ws)
    };
    let (wide, ws) = run(&be);
    assert_eq!(ws, 50 * 108);
    let (narrow, ws) = run(&super::testing::backend_with_workspace(1024));
    assert_eq!(ws, 9 * 108);
    for (a, b) in wide.iter().zip(&narrow) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
    }
    // an explicit limit caps the allowance: 1,100 bytes hold 10 rows
    let capped = open(1100);
    assert_eq!(capped.allot_workspace(&[(fwd, 500)]).unwrap(), 1);
    assert_eq!(capped.workspace_bytes(&fwd).unwrap(), 10 * 108);
    // revoked: back to the backend's bound, the forward pass with and without a bias, still
    // claimed; an op given no room is claimed too, one never given any is not
    assert!(capped.workspace_allotted(&fwd_plain) && !capped.workspace_allotted(&bwd_data));
    capped.revoke_workspace(&[fwd_plain, mm, bwd_data]).unwrap();
    assert_eq!(capped.workspace_bytes(&fwd).unwrap(), 9 * 108);
    assert!(capped.workspace_allotted(&fwd) && !capped.workspace_allotted(&bwd_data));
    assert_eq!(capped.allot_workspace(&[(bwd_data, 0)]).unwrap(), 0);
    assert!(capped.workspace_allotted(&bwd_data));
    // a bad op fails before anything changes (no overflow panic on huge fields)
    let mut huge = g;
    huge.n = usize::MAX / 2;
    let bad = OpDesc::Conv {
        geometry: huge,
        pass: ConvPass::Forward,
        dtype: DType::F32,
        bias: true,
    };
    let r = capped.allot_workspace(&[(fwd, 500), (bad, 1)]);
    assert!(
        matches!(r, Err(TensorError::InvalidArgument { .. })),
        "{r:?}"
    );
    assert_eq!(capped.workspace_bytes(&fwd).unwrap(), 9 * 108);
}

#[test]
fn pointwise_convs_need_no_workspace_and_capacity_caps_memory() {
    let be = CpuBackend::with_capacity(&BackendOptions::default(), 4 << 20).unwrap();
    let g = Conv2dGeometry::new(
        &[2, 5, 5, 3].into(),
        &[1, 1, 3, 4].into(),
        (1, 1),
        crate::Padding::Valid,
    )
    .unwrap();
    let q = OpDesc::Conv {
        geometry: g,
        pass: crate::ConvPass::BackwardFilter,
        dtype: DType::F32,
        bias: true,
    };
    assert_eq!(be.workspace_bytes(&q).unwrap(), 0);
    let be: Arc<dyn Backend> = be;
    let e = Tensor::empty(&be, [2 << 20], DType::F32, Category::Other).unwrap_err();
    assert!(matches!(e, TensorError::Alloc(_)), "{e}");
}
