//! Data parallel on the GPU through NCCL, one rank (the multi-GPU part needs a machine with
//! several GPUs): a one-rank NCCL communicator trains bit for bit as the plain trainer, every
//! step's peak equals its plan, and the plan and the reports show the buckets and NCCL's
//! own device memory (measured outside the allocator). Skips without a GPU (fails under
//! `STAX_REQUIRE_GPU=1`, also when NCCL cannot be loaded: `libnccl.so.2` on
//! `LD_LIBRARY_PATH`).

mod common;

use std::io::Write;
use std::time::Duration;

use common::{batch, cuda_backend_or_skip, gpu_required, seed_model, with_precision};
use stax::train::Trainer;
use stax::train::distributed::{DataParallel, Rendezvous};
use stax::{Adam, Backend, Precision, Shape};

#[test]
fn one_rank_nccl_is_bit_identical_to_the_plain_trainer() {
    let Some(cuda) = cuda_backend_or_skip(&with_precision(Precision::Tf32)) else {
        return;
    };
    cuda.set_deterministic(true);
    let be: std::sync::Arc<dyn Backend> = cuda;
    let input = Shape::new([8, 28, 28, 3]);
    let (x, y) = batch(&be, &input, 2);
    let bits = |t: &Trainer<stax::Serial>| -> Vec<u32> {
        common::host_values(t.params().leaves())
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    for adam in [Adam::new(1e-3), Adam::new(1e-3).collecting()] {
        let want = {
            let mut plain = Trainer::new(seed_model(), input.clone(), adam, &be, 5).unwrap();
            for _ in 0..3 {
                plain.step(&x, &y).unwrap();
            }
            bits(&plain)
        };
        let dir = std::env::temp_dir().join(format!("stax-gpu-dp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rv = Rendezvous::new(0, 1, dir.clone(), Duration::from_secs(60)).unwrap();
        let dp = match DataParallel::connect(&rv, &be) {
            Ok(dp) => dp.with_bucket_bytes(1 << 20),
            Err(e) if !gpu_required() => {
                let _ = writeln!(std::io::stderr(), "skipped: NCCL not usable ({e})");
                return;
            }
            Err(e) => panic!("STAX_REQUIRE_GPU=1 but NCCL is not usable: {e}"),
        };
        let nccl = dp
            .report()
            .device_bytes
            .expect("NCCL's device bytes are measured");
        let t = Trainer::new(seed_model(), input.clone(), adam, &be, 5).unwrap();
        let mut t = t.data_parallel(dp).unwrap();
        let plan = t.plan(8).unwrap();
        for _ in 0..3 {
            let r = t.step(&x, &y).unwrap();
            assert_eq!(
                r.memory.peak, plan.peak.bytes,
                "step {}: peak against plan",
                r.step
            );
            let comm = r.memory.comm.clone().unwrap();
            assert_eq!(comm.library, "nccl");
            assert_eq!(comm.device_bytes, Some(nccl));
            println!("step {}: {}", r.step, r.memory);
        }
        let comm = plan.comm.clone().unwrap();
        assert!(!comm.buckets.is_empty(), "the plan lists the buckets");
        println!("{adam:?}: NCCL holds {nccl} device bytes outside the allocator\n{comm}");
        assert_eq!(
            bits(&t),
            want,
            "{adam:?}: one NCCL rank differs from the plain trainer"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
