//! Where the seed step's time goes on CUDA: every backend op of one training step of the
//! seed's model, timed alone with CUDA events (median of `--reps` after warm-up), then the
//! whole step through the `Trainer` (median step time and peak bytes).
//!
//! ```text
//! cargo run --release --example step_profile                 # batch 100, 200x200x3, TF32
//! cargo run --release --example step_profile -- --batch 10 --reps 50
//! ```
//!
//! Inputs are random (never zeros), activations and gradients come from running the ops on
//! them. The `bytes` column is the least device traffic of the op (each input read once,
//! each output written once); `GB/s` is that over the median time. `floor` is the least time
//! the op could take on this GPU: its bytes at the measured copy bandwidth (the "device copy"
//! row) or its FLOPs at the measured GEMM rate in the run's precision (the 8192³ "GEMM rate"
//! row), whichever is longer; `x floor` is the median over it. Without a CUDA device it
//! prints a skip notice and exits 0.

use clap::Parser;
use stax::tensor::backend::DenseDx;
use stax::tensor::cuda::{CudaBackend, DirectConvs};
use stax::tensor::ops::{self, Epilogue};
use stax::tensor::{Activation, AdamHyper, Conv2dGeometry, TensorError};
use stax::train::Trainer;
use stax::{Adam, Backend, BackendOptions, Category, DType, Padding, Precision, Shape, Tensor};
use std::sync::Arc;

/// Time each op of the seed step alone, then the whole step.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Examples per step.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Input height and width.
    #[arg(long, default_value_t = 200)]
    img: usize,
    /// Timed repetitions per op (after 3 warm-up calls).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Timed whole steps (after 3 warm-up steps); 0 skips the whole-step timing.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Precision: tf32 or highest.
    #[arg(long, default_value = "tf32")]
    precision: Precision,
    /// The most workspace one cuDNN pass may use, in MiB (default: the backend's, 256).
    #[arg(long)]
    workspace_mib: Option<usize>,
}

/// One row of the table.
struct Row {
    name: String,
    median_ms: f32,
    min_ms: f32,
    bytes: f64,
    flops: f64,
    in_step: bool,
}

/// The reference row whose bytes over its time are the copy bandwidth of the floors.
const COPY_ROW: &str = "device copy of one activation";
/// The reference row whose FLOPs over its time are the GEMM rate of the floors.
const GEMM_ROW: &str = "GEMM rate: matmul 8192x8192x8192";

/// Fills `n` floats in `[lo, hi)` from a SplitMix64 stream, in parallel chunks.
fn random(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(4, |t| t.get());
    let chunk = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, part) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut state = seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for x in part {
                    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    z ^= z >> 31;
                    let u = (z >> 40) as f32 / (1u64 << 24) as f32;
                    *x = lo + (hi - lo) * u;
                }
            });
        }
    });
    v
}

struct Profiler {
    gpu: Arc<CudaBackend>,
    reps: usize,
    rows: Vec<Row>,
    /// FLOPs of the next row timed ([`Profiler::flops`]); 0 for memory-bound ops.
    next_flops: f64,
}

impl Profiler {
    /// Sets the FLOPs (multiply-adds counted as 2) of the next row timed.
    fn flops(&mut self, flops: f64) -> &mut Self {
        self.next_flops = flops;
        self
    }

    /// Times `f` (3 warm-up calls, then `reps` timed ones) and records a row.
    fn time(
        &mut self,
        name: &str,
        bytes: f64,
        in_step: bool,
        f: &mut dyn FnMut() -> Result<(), TensorError>,
    ) {
        let mut run = || -> Result<(f32, f32), TensorError> {
            for _ in 0..3 {
                f()?;
            }
            self.gpu.synchronize()?;
            let mut t = Vec::with_capacity(self.reps);
            for _ in 0..self.reps {
                t.push(self.gpu.time_ms(f)?);
            }
            t.sort_by(f32::total_cmp);
            Ok((t[t.len() / 2], t[0]))
        };
        let flops = std::mem::take(&mut self.next_flops);
        match run() {
            Ok((median_ms, min_ms)) => {
                println!("  {name:<44} {median_ms:>8.3} ms");
                self.rows.push(Row {
                    name: name.into(),
                    median_ms,
                    min_ms,
                    bytes,
                    flops,
                    in_step,
                });
            }
            Err(e) => println!("  {name:<44} FAILED: {e}"),
        }
    }

    /// A reference row's quantity per second (`per` of it over its median time).
    fn rate(&self, name: &str, per: fn(&Row) -> f64) -> Option<f64> {
        let r = self.rows.iter().find(|r| r.name == name)?;
        Some(per(r) / (r.median_ms as f64 * 1e-3))
    }

    fn print(&self) {
        let bandwidth = self.rate(COPY_ROW, |r| r.bytes);
        let gemm = self.rate(GEMM_ROW, |r| r.flops);
        if let (Some(bw), Some(f)) = (bandwidth, gemm) {
            println!(
                "\nfloors from this run: copy {:.0} GB/s, GEMM {:.1} TFLOP/s",
                bw / 1e9,
                f / 1e12
            );
        }
        println!(
            "{:<46}{:>10}{:>10}{:>14}{:>10}{:>10}{:>9}",
            "op (seed step, per call)", "median ms", "min ms", "bytes", "GB/s", "floor", "x floor"
        );
        let mut sum = 0f32;
        for r in &self.rows {
            let gbs = if r.bytes > 0.0 {
                format!("{:.0}", r.bytes / (r.median_ms as f64 * 1e-3) / 1e9)
            } else {
                "-".into()
            };
            let floor_ms = match (bandwidth, gemm) {
                (Some(bw), Some(f)) if r.bytes + r.flops > 0.0 => {
                    Some((r.bytes / bw).max(r.flops / f) * 1e3)
                }
                _ => None,
            };
            let (floor, times) = floor_ms.map_or(("-".into(), "-".into()), |fl| {
                (
                    format!("{fl:.3}"),
                    format!("{:.1}", r.median_ms as f64 / fl),
                )
            });
            let mark = if r.in_step { "" } else { " (ref)" };
            println!(
                "{:<46}{:>10.3}{:>10.3}{:>14.3e}{:>10}{:>10}{:>9}",
                format!("{}{mark}", r.name),
                r.median_ms,
                r.min_ms,
                r.bytes,
                gbs,
                floor,
                times
            );
            if r.in_step {
                sum += r.median_ms;
            }
        }
        println!("{:<46}{:>10.3}", "sum of the step's ops", sum);
    }
}

fn tensor(be: &Arc<dyn Backend>, shape: &[usize], lo: f32, hi: f32, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_slice(be, &random(n, lo, hi, seed), shape, Category::Other).expect("upload")
}

fn empty(be: &Arc<dyn Backend>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::empty(be, shape, dtype, Category::Other).expect("allocate")
}

/// Times every op of the step alone.
fn ops(p: &mut Profiler, batch: usize, img: usize) -> Result<(), TensorError> {
    let be: Arc<dyn Backend> = p.gpu.clone();
    let (b, h, c) = (batch, img, 64usize);
    let act = (b * h * h * c * 4) as f64;
    let feat = h * h * c;
    let same = Padding::Same;
    let g1 = Conv2dGeometry::new(&[b, h, h, 3].into(), &[3, 3, 3, c].into(), (1, 1), same)?;
    let g2 = Conv2dGeometry::new(&[b, h, h, c].into(), &[3, 3, c, c].into(), (1, 1), same)?;
    let x = tensor(&be, &[b, h, h, 3], -1.0, 1.0, 1);
    let w1 = tensor(&be, &[3, 3, 3, c], -0.3, 0.3, 2);
    let b1 = tensor(&be, &[c], -0.1, 0.1, 3);
    let w2 = tensor(&be, &[3, 3, c, c], -0.05, 0.05, 4);
    let b2 = tensor(&be, &[c], -0.1, 0.1, 5);
    let mut wd = tensor(&be, &[feat, 128], -0.001, 0.001, 6);
    let bd = tensor(&be, &[128], -0.1, 0.1, 7);
    let w3 = tensor(&be, &[128, 2], -0.1, 0.1, 8);
    let b3 = tensor(&be, &[2], -0.1, 0.1, 9);
    let mut labels_host = vec![0f32; b * 2];
    for (i, row) in labels_host.chunks_mut(2).enumerate() {
        row[i % 2] = 1.0;
    }
    let labels = Tensor::from_slice(&be, &labels_host, [b, 2], Category::Other)?;
    let mut y1 = empty(&be, &[b, h, h, c], DType::F32);
    let mut y2 = empty(&be, &[b, h, h, c], DType::F32);
    let words = (b * h * h * c).div_ceil(32);
    let mut m1 = empty(&be, &[words], DType::U32);
    let mut m2 = empty(&be, &[words], DType::U32);
    let mut dw1 = empty(&be, &[3, 3, 3, c], DType::F32);
    let mut dw2 = empty(&be, &[3, 3, c, c], DType::F32);
    let mut db = empty(&be, &[c], DType::F32);
    let mut dwd = empty(&be, &[feat, 128], DType::F32);
    let mut dbd = empty(&be, &[128], DType::F32);
    let mut z = empty(&be, &[b, 128], DType::F32);
    let mut dz = empty(&be, &[b, 128], DType::F32);
    let mut m3 = empty(&be, &[(b * 128).div_ceil(32)], DType::U32);
    let mut logits = empty(&be, &[b, 2], DType::F32);
    let mut dlogits = empty(&be, &[b, 2], DType::F32);
    let mut dw3 = empty(&be, &[128, 2], DType::F32);
    let mut db3 = empty(&be, &[2], DType::F32);
    let mut dy2 = empty(&be, &[b, feat], DType::F32);
    let mut dy1 = empty(&be, &[b, h, h, c], DType::F32);

    // One forward pass first, so every later input holds real values.
    ops::conv2d(&x, &w1, &b1, &g1, &mut y1, Default::default())?;
    ops::unary(Activation::Relu, &mut y1, Some(&mut m1))?;
    ops::conv2d(&y1, &w2, &b2, &g2, &mut y2, Default::default())?;
    ops::unary(Activation::Relu, &mut y2, Some(&mut m2))?;
    let y2f = y2.reshape([b, feat])?;
    ops::matmul(&y2f, &wd, false, false, &mut z)?;
    drop(y2f);
    ops::bias_add(&mut z, &bd)?;
    ops::unary(Activation::Relu, &mut z, Some(&mut m3))?;
    ops::matmul(&z, &w3, false, false, &mut logits)?;
    ops::bias_add(&mut logits, &b3)?;
    ops::softmax_xent(&logits, &labels, &mut dlogits)?;
    ops::matmul(&dlogits, &w3, false, true, &mut dz)?;
    ops::unary_bwd(Activation::Relu, &m3, &mut dz)?;
    ops::matmul(&dz, &wd, false, true, &mut dy2)?;
    be.synchronize()?;

    println!("timing each op alone ({} reps):", p.reps);
    let positions = (b * h * h) as f64;
    let (conv1_f, conv2_f) = (
        2.0 * positions * 27.0 * c as f64,
        2.0 * positions * 576.0 * c as f64,
    );
    let dense_f = 2.0 * b as f64 * feat as f64 * 128.0;
    let in_act = (b * h * h * 3 * 4) as f64;
    let mask = (words * 4) as f64;
    let gpu = p.gpu.clone();
    // Each fused op, then (as references) its parts alone and the same with the epilogues
    // unfused (bias and ReLU as their own passes).
    p.flops(conv1_f).time(
        "conv1 forward + bias + relu1 (fused)",
        in_act + act + mask,
        true,
        &mut || {
            ops::conv2d(
                &x,
                &w1,
                &b1,
                &g1,
                &mut y1,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut m1),
                },
            )
        },
    );
    gpu.set_direct_convs(DirectConvs::All);
    p.flops(conv1_f).time(
        "conv1 forward + bias + relu1, direct kernel (all)",
        in_act + act + mask,
        false,
        &mut || {
            ops::conv2d(
                &x,
                &w1,
                &b1,
                &g1,
                &mut y1,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut m1),
                },
            )
        },
    );
    gpu.set_direct_convs(DirectConvs::Winning);
    gpu.set_fused_epilogues(false);
    p.flops(conv1_f).time(
        "conv1 forward + bias + relu1, unfused",
        in_act + act + mask,
        false,
        &mut || {
            ops::conv2d(
                &x,
                &w1,
                &b1,
                &g1,
                &mut y1,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut m1),
                },
            )
        },
    );
    p.flops(conv1_f).time(
        "conv1 forward (+bias), unfused",
        in_act + act,
        false,
        &mut || ops::conv2d(&x, &w1, &b1, &g1, &mut y1, Default::default()),
    );
    gpu.set_fused_epilogues(true);
    p.flops(conv1_f)
        .time("conv1 forward (+bias)", in_act + act, false, &mut || {
            ops::conv2d(&x, &w1, &b1, &g1, &mut y1, Default::default())
        });
    p.time("relu1 (+bit mask)", 2.0 * act + mask, false, &mut || {
        ops::unary(Activation::Relu, &mut y1, Some(&mut m1))
    });
    p.flops(conv2_f).time(
        "conv2 forward + bias + relu2 (fused)",
        2.0 * act + mask,
        true,
        &mut || {
            ops::conv2d(
                &y1,
                &w2,
                &b2,
                &g2,
                &mut y2,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut m2),
                },
            )
        },
    );
    gpu.set_fused_epilogues(false);
    p.flops(conv2_f).time(
        "conv2 forward + bias + relu2, unfused",
        2.0 * act + mask,
        false,
        &mut || {
            ops::conv2d(
                &y1,
                &w2,
                &b2,
                &g2,
                &mut y2,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut m2),
                },
            )
        },
    );
    p.flops(conv2_f).time(
        "conv2 forward (+bias), unfused",
        2.0 * act,
        false,
        &mut || ops::conv2d(&y1, &w2, &b2, &g2, &mut y2, Default::default()),
    );
    gpu.set_fused_epilogues(true);
    p.flops(conv2_f)
        .time("conv2 forward (+bias)", 2.0 * act, false, &mut || {
            ops::conv2d(&y1, &w2, &b2, &g2, &mut y2, Default::default())
        });
    p.time("relu2 (+bit mask)", 2.0 * act + mask, false, &mut || {
        ops::unary(Activation::Relu, &mut y2, Some(&mut m2))
    });
    let mut y2f = y2.reshape([b, feat])?;
    let wbytes = (feat * 128 * 4) as f64;
    let mut dense1_forward = || {
        ops::matmul(&y2f, &wd, false, false, &mut z)?;
        ops::bias_add(&mut z, &bd)
    };
    let name = "dense1 forward (matmul + bias)";
    p.flops(dense_f)
        .time(name, act + wbytes, true, &mut dense1_forward);
    if p.gpu.precision() == Precision::Highest {
        // the step's product is our 3xTF32 kernel: cuBLAS's f32 GEMM beside it
        p.gpu.set_fp32_gemm_3xtf32(false);
        let name = "dense1 forward (cuBLAS f32 GEMM, not the step's)";
        p.flops(dense_f)
            .time(name, act + wbytes, false, &mut dense1_forward);
        p.gpu.set_fp32_gemm_3xtf32(true);
    }
    p.time(
        "relu3, dense2, loss, dense2 bwd, relu3 bwd",
        0.0,
        true,
        &mut || {
            ops::unary(Activation::Relu, &mut z, Some(&mut m3))?;
            ops::matmul(&z, &w3, false, false, &mut logits)?;
            ops::bias_add(&mut logits, &b3)?;
            ops::softmax_xent(&logits, &labels, &mut dlogits)?;
            ops::matmul(&z, &dlogits, true, false, &mut dw3)?;
            ops::bias_grad(&dlogits, &mut db3)?;
            ops::matmul(&dlogits, &w3, false, true, &mut dz)?;
            ops::unary_bwd(Activation::Relu, &m3, &mut dz)
        },
    );
    p.flops(dense_f).time(
        "dense1 weight gradient (+bias grad)",
        act + wbytes,
        false,
        &mut || {
            ops::matmul(&y2f, &dz, true, false, &mut dwd)?;
            ops::bias_grad(&dz, &mut dbd)
        },
    );
    p.flops(dense_f)
        .time("dense1 input gradient", act + wbytes, false, &mut || {
            ops::matmul(&dz, &wd, false, true, &mut dy2)
        });
    let mut dy2v = dy2.reshape([b, h, h, c])?;
    drop(dy2);
    p.flops(conv2_f).time(
        "relu2 bwd + conv2 bwd filter + bias grad (fused)",
        4.0 * act + mask,
        true,
        &mut || {
            ops::conv2d_bwd_filter(
                &y1,
                &mut dy2v,
                &g2,
                &mut dw2,
                &mut db,
                Some((Activation::Relu, &m2)),
            )
        },
    );
    gpu.set_fused_epilogues(false);
    p.flops(conv2_f).time(
        "relu2 bwd + conv2 bwd filter + bias grad, unfused",
        4.0 * act + mask,
        false,
        &mut || {
            ops::conv2d_bwd_filter(
                &y1,
                &mut dy2v,
                &g2,
                &mut dw2,
                &mut db,
                Some((Activation::Relu, &m2)),
            )
        },
    );
    gpu.set_fused_epilogues(true);
    p.time("relu2 backward", 2.0 * act + mask, false, &mut || {
        ops::unary_bwd(Activation::Relu, &m2, &mut dy2v)
    });
    p.flops(conv2_f).time(
        "conv2 backward filter (+bias grad)",
        2.0 * act,
        false,
        &mut || ops::conv2d_bwd_filter(&y1, &mut dy2v.clone(), &g2, &mut dw2, &mut db, None),
    );
    p.flops(conv2_f)
        .time("conv2 backward data", 2.0 * act, true, &mut || {
            ops::conv2d_bwd_data(&dy2v, &w2, &g2, &mut dy1)
        });
    p.flops(conv1_f).time(
        "relu1 bwd + conv1 bwd filter + bias grad (fused)",
        3.0 * act + in_act + mask,
        true,
        &mut || {
            ops::conv2d_bwd_filter(
                &x,
                &mut dy1,
                &g1,
                &mut dw1,
                &mut db,
                Some((Activation::Relu, &m1)),
            )
        },
    );
    gpu.set_direct_convs(DirectConvs::All);
    p.flops(conv1_f).time(
        "relu1 bwd + conv1 bwd filter + bias grad, direct kernel (all)",
        3.0 * act + in_act + mask,
        false,
        &mut || {
            ops::conv2d_bwd_filter(
                &x,
                &mut dy1,
                &g1,
                &mut dw1,
                &mut db,
                Some((Activation::Relu, &m1)),
            )
        },
    );
    gpu.set_direct_convs(DirectConvs::Winning);
    gpu.set_fused_epilogues(false);
    p.flops(conv1_f).time(
        "relu1 bwd + conv1 bwd filter + bias grad, unfused",
        3.0 * act + in_act + mask,
        false,
        &mut || {
            ops::conv2d_bwd_filter(
                &x,
                &mut dy1,
                &g1,
                &mut dw1,
                &mut db,
                Some((Activation::Relu, &m1)),
            )
        },
    );
    gpu.set_fused_epilogues(true);
    p.time("relu1 backward", 2.0 * act + mask, false, &mut || {
        ops::unary_bwd(Activation::Relu, &m1, &mut dy1)
    });
    p.flops(conv1_f).time(
        "conv1 backward filter (+bias grad)",
        in_act + act,
        false,
        &mut || ops::conv2d_bwd_filter(&x, &mut dy1.clone(), &g1, &mut dw1, &mut db, None),
    );
    p.time("bias gradient alone, 64 channels", act, false, &mut || {
        ops::bias_grad(&dy1, &mut db)
    });
    p.time("bias add alone, 64 channels", 2.0 * act, false, &mut || {
        ops::bias_add(&mut dy1, &b1)
    });
    let mut copy_dst = empty(&be, &[b, h, h, c], DType::F32);
    p.time(COPY_ROW, 2.0 * act, false, &mut || {
        ops::copy(&y2, &mut copy_dst)
    });
    drop(copy_dst);
    let big = 8192;
    let (ga, gb) = (
        tensor(&be, &[big, big], -1.0, 1.0, 10),
        tensor(&be, &[big, big], -1.0, 1.0, 11),
    );
    let mut gc = empty(&be, &[big, big], DType::F32);
    p.flops(2.0 * (big as f64).powi(3))
        .time(GEMM_ROW, 0.0, false, &mut || {
            ops::matmul(&ga, &gb, false, false, &mut gc)
        });
    drop((ga, gb, gc));

    // Adam: the large Dense(128) weight, then the 7 small tensors as one row.
    let mut m = wd.duplicate()?;
    let mut v = wd.duplicate()?;
    ops::unary(Activation::Relu, &mut v, None)?;
    let adam = Adam::new(1e-3);
    let h1: AdamHyper = adam.hyper(1);
    let n = (feat * 128) as f64;
    p.time(
        "adam dense1.w (327.7 M params)",
        28.0 * n,
        false,
        &mut || ops::adam(&mut wd, &dwd, &mut m, &mut v, &h1),
    );
    // What the step runs instead of the three rows above: Adam in dense1's backward pass.
    // At a small batch, the one-pass kernel and (for A/B) the chunks.
    let mut dx1 = empty(&be, &[b, feat], DType::F32);
    let one_pass = p.gpu.dense_adam_is_rows(b, 128, DType::F32);
    for rows_kernel in [true, false].into_iter().filter(|&r| one_pass || !r) {
        p.gpu.set_dense_adam_rows(rows_kernel);
        let x3 = p.gpu.dense_chunks_x3(b, 128, DType::F32);
        let name = match (rows_kernel, x3) {
            (true, _) => "dense1 backward + adam (dense_adam in one pass)",
            (false, true) => {
                "dense1 backward + adam (dense_adam: dw, dx in 3xTF32, adam by chunks)"
            }
            (false, false) => "dense1 backward + adam (dense_adam: dw, dx, adam by chunks)",
        };
        // the step runs the one pass where it applies: the chunks are then a reference row
        let in_step = rows_kernel || !one_pass;
        let mut update = || {
            let dx = DenseDx::Into(&mut dx1);
            ops::dense_adam(&mut y2f, &dz, &mut wd, &mut m, &mut v, dx, &h1)?;
            ops::bias_grad(&dz, &mut dbd)
        };
        let bytes = 2.0 * act + 24.0 * n;
        p.flops(2.0 * dense_f)
            .time(name, bytes, in_step, &mut update);
        if !rows_kernel && p.gpu.precision() == Precision::Highest && !x3 {
            // full fp32's chunks on our 3xTF32 kernel beside the step's cuBLAS GEMMs
            p.gpu.set_fp32_dense_chunks_3xtf32(true);
            if p.gpu.dense_chunks_x3(b, 128, DType::F32) {
                let name = "dense1 backward + adam (dw, dx in 3xTF32 by chunks, not the step's)";
                p.flops(2.0 * dense_f).time(name, bytes, false, &mut update);
            }
            p.gpu.set_fp32_dense_chunks_3xtf32(false);
        }
    }
    p.gpu.set_dense_adam_rows(true);
    drop(dx1);
    let mut small: Vec<[Tensor; 4]> = Vec::new();
    for (i, shape) in [
        &[3, 3, 3, c][..],
        &[c],
        &[3, 3, c, c],
        &[c],
        &[128],
        &[128, 2],
        &[2],
    ]
    .iter()
    .enumerate()
    {
        let s = 100 + 4 * i as u64;
        small.push([
            tensor(&be, shape, -1.0, 1.0, s),
            tensor(&be, shape, -1.0, 1.0, s + 1),
            tensor(&be, shape, -0.1, 0.1, s + 2),
            tensor(&be, shape, 0.0, 0.01, s + 3),
        ]);
    }
    p.time("adam, the 7 small tensors", 0.0, true, &mut || {
        for [pp, g, mm, vv] in small.iter_mut() {
            ops::adam(pp, g, mm, vv, &h1)?;
        }
        Ok(())
    });
    Ok(())
}

/// Times whole steps of the seed model through the trainer.
fn whole_step(gpu: &Arc<CudaBackend>, batch: usize, img: usize, steps: usize) {
    let be: Arc<dyn Backend> = gpu.clone();
    let model = stax::models::seed_cnn(2);
    let input = Shape::new([batch, img, img, 3]);
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let mut trainer = Trainer::new(model, input, Adam::new(1e-3), &be, 0)?;
        let x = Tensor::from_slice(
            &be,
            &random(batch * img * img * 3, 0.0, 1.0, 11),
            [batch, img, img, 3],
            Category::Input,
        )?;
        let mut labels = vec![0f32; batch * 2];
        for (i, row) in labels.chunks_mut(2).enumerate() {
            row[(i * 7 / 3) % 2] = 1.0;
        }
        let y = Tensor::from_slice(&be, &labels, [batch, 2], Category::Input)?;
        let planned = trainer.plan(batch).map(|p| p.peak.bytes).ok();
        let mut ms = Vec::new();
        let mut peak = 0;
        for i in 0..steps + 3 {
            let r = trainer.step(&x, &y)?;
            if i >= 3 {
                ms.push(r.step_ms);
            }
            peak = r.memory.peak;
        }
        ms.sort_by(f64::total_cmp);
        println!();
        println!(
            "whole step (Trainer::step, seed model, batch {batch}, {img}x{img}x3): median {:.3} ms, \
             min {:.3} ms over {steps} steps; peak {peak} bytes (plan {planned:?})",
            ms[ms.len() / 2],
            ms[0],
        );
        Ok(())
    };
    if let Err(e) = run() {
        println!("whole step FAILED: {e}");
    }
}

fn main() {
    let args = Args::parse();
    let options = BackendOptions {
        precision: args.precision,
        workspace_limit: args.workspace_mib.map(|m| m << 20),
        ..BackendOptions::default()
    };
    let gpu = match CudaBackend::new(0, &options) {
        Ok(g) => g,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    println!(
        "step_profile: batch {}, {}x{}x3, {:?}, {} reps per op",
        args.batch, args.img, args.img, args.precision, args.reps
    );
    let mut p = Profiler {
        gpu: gpu.clone(),
        reps: args.reps.max(1),
        rows: Vec::new(),
        next_flops: 0.0,
    };
    if let Err(e) = ops(&mut p, args.batch, args.img) {
        println!("op timing stopped: {e}");
    }
    p.print();
    for plan in gpu.conv_plans() {
        println!("{plan:#}");
    }
    gpu.allocator().empty_cache().ok();
    if args.steps > 0 {
        whole_step(&gpu, args.batch, args.img, args.steps);
        gpu.set_fused_epilogues(false);
        println!("(again with the epilogues unfused)");
        whole_step(&gpu, args.batch, args.img, args.steps);
        gpu.set_fused_epilogues(true);
        gpu.set_direct_convs(DirectConvs::All);
        println!("(again with every direct conv kernel: conv1 forward and filter grad)");
        whole_step(&gpu, args.batch, args.img, args.steps);
        gpu.set_direct_convs(DirectConvs::Winning);
        if gpu.dense_adam_is_rows(args.batch, 128, DType::F32) {
            gpu.set_dense_adam_rows(false);
            println!("(again with the dense update by chunks)");
            whole_step(&gpu, args.batch, args.img, args.steps);
            gpu.set_dense_adam_rows(true);
        }
    }
}
