//! Seeded random initialization, with stax's initializers.

use crate::LayerError;
use crate::{Init, ParamSpec};
use chacha20::ChaCha12Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::StandardNormal;
use stax_alloc::AllocError;
use stax_tensor::Path;
use stax_tensor::TensorError;

/// Standard deviation of a standard normal truncated to [-2, 2]; JAX divides by it so that the
/// truncated draw has the requested variance (`jax.nn.initializers.variance_scaling`).
const TRUNCATED_NORMAL_STDDEV: f64 = 0.879_625_661_034_239_8;

/// A seeded random generator with stax-style splitting.
///
/// Streams come from ChaCha12 (`chacha20::ChaCha12Rng`, the generator behind `rand`'s
/// `StdRng`, seeded as `StdRng::seed_from_u64` seeds it, so the streams are `StdRng`'s) and are
/// reproducible for a fixed seed with the committed `Cargo.lock`; they are not bit-identical
/// to JAX's threefry. A clone continues the same stream ([`crate::Remat`] replays a layer's
/// draws).
#[derive(Debug)]
pub struct Rng(ChaCha12Rng);

impl Clone for Rng {
    /// The generator at the same point of the same stream.
    fn clone(&self) -> Self {
        let mut r = ChaCha12Rng::from_seed(self.0.get_seed());
        r.set_stream(self.0.get_stream());
        r.set_word_pos(self.0.get_word_pos());
        Rng(r)
    }
}

impl Rng {
    /// A generator from a seed (stax: `random.PRNGKey(seed)`).
    pub fn new(seed: u64) -> Self {
        Rng(ChaCha12Rng::seed_from_u64(seed))
    }

    /// `n` independent generators derived from this one (stax: `random.split(rng, n)`).
    pub fn split(&mut self, n: usize) -> Vec<Rng> {
        (0..n).map(|_| Rng::new(self.0.random())).collect()
    }

    /// The key of step `step` of a training run seeded with `seed`, independent of
    /// `Rng::new(seed)`'s own stream (JAX's `random.fold_in(key, step)`): the seed and the
    /// step are mixed by SplitMix64's output function ([`stax_tensor::ops::mix64`]) before
    /// seeding.
    pub fn fold_in(seed: u64, step: u64) -> Rng {
        use stax_tensor::ops::mix64;
        Rng::new(mix64(mix64(seed ^ 0x5354_4550_5354_4550) ^ step))
    }

    /// 64 random bits (a dropout's key, [`stax_tensor::ops::dropout_bits`]).
    pub fn bits(&mut self) -> u64 {
        self.0.random()
    }

    /// A standard normal draw.
    pub fn normal(&mut self) -> f64 {
        self.0.sample(StandardNormal)
    }

    /// Draws the initial values of one parameter tensor (row-major).
    ///
    /// # Errors
    /// [`LayerError::Config`] if a glorot axis is out of range or a fan is zero;
    /// [`LayerError::Tensor`] (host out of memory) when the values do not fit in host memory.
    pub fn sample(&mut self, path: &Path, spec: &ParamSpec) -> Result<Vec<f32>, LayerError> {
        let n = spec.shape.numel();
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            TensorError::Alloc(AllocError::BackendOutOfMemory {
                backend: "host".into(),
                op: "initial values",
                requested: (n as u64).saturating_mul(4),
            })
        })?;
        match spec.init {
            Init::Normal(stddev) => {
                out.extend((0..n).map(|_| (self.normal() * stddev as f64) as f32));
            }
            Init::Constant(v) => out.resize(n, v),
            Init::GlorotNormal { in_axis, out_axis } => {
                let stddev = glorot_stddev(path, spec, in_axis, out_axis)?;
                out.extend((0..n).map(|_| (self.truncated_normal() * stddev) as f32));
            }
        }
        Ok(out)
    }

    fn truncated_normal(&mut self) -> f64 {
        loop {
            let z = self.normal();
            if z.abs() <= 2.0 {
                return z;
            }
        }
    }
}

/// `sqrt(1 / fan_avg) / 0.8796...`, with fans as in `jax.nn.initializers.variance_scaling`:
/// receptive field = product of all dims except `in_axis` and `out_axis`.
fn glorot_stddev(
    path: &Path,
    spec: &ParamSpec,
    in_axis: usize,
    out_axis: usize,
) -> Result<f64, LayerError> {
    let dims = spec.shape.dims();
    if in_axis >= dims.len() || out_axis >= dims.len() || in_axis == out_axis {
        return Err(LayerError::Config {
            path: path.to_string(),
            layer: "glorot_normal".into(),
            reason: format!(
                "glorot axes ({in_axis}, {out_axis}) do not fit shape {}",
                spec.shape
            ),
        });
    }
    let receptive: usize = dims
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != in_axis && *i != out_axis)
        .map(|(_, d)| d)
        .product();
    let fan_avg = (dims[in_axis] + dims[out_axis]) as f64 * receptive as f64 / 2.0;
    if fan_avg == 0.0 {
        return Err(LayerError::Config {
            path: path.to_string(),
            layer: "glorot_normal".into(),
            reason: format!("zero fan for shape {}", spec.shape),
        });
    }
    Ok((1.0 / fan_avg).sqrt() / TRUNCATED_NORMAL_STDDEV)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    }

    #[test]
    fn glorot_normal_has_jax_variance_and_truncation() {
        // HWIO 3x3x64x64: fan_avg = (64 + 64) * 9 / 2 = 576, target stddev sqrt(1/576).
        let spec = ParamSpec::f32(
            [3, 3, 64, 64],
            Init::GlorotNormal {
                in_axis: 2,
                out_axis: 3,
            },
        );
        let v = Rng::new(0).sample(&Path::root(), &spec).unwrap();
        let (mean, sd) = stats(&v);
        let target = (1.0f64 / 576.0).sqrt();
        assert!(mean.abs() < 0.01 * target * 10.0, "mean {mean}");
        assert!((sd / target - 1.0).abs() < 0.03, "stddev {sd} vs {target}");
        let bound = 2.0 * target / TRUNCATED_NORMAL_STDDEV;
        assert!(v.iter().all(|&x| (x as f64).abs() <= bound + 1e-7));
    }

    #[test]
    fn normal_stddev_and_reproducibility() {
        let spec = ParamSpec::f32([20000], Init::Normal(1e-2));
        let a = Rng::new(7).sample(&Path::root(), &spec).unwrap();
        let b = Rng::new(7).sample(&Path::root(), &spec).unwrap();
        assert_eq!(a, b);
        let (_, sd) = stats(&a);
        assert!((sd / 1e-2 - 1.0).abs() < 0.03, "{sd}");
        let mut r = Rng::new(7);
        let mut keys = r.split(2);
        let first = keys[0].normal();
        assert_ne!(first, keys[1].normal());
    }

    #[test]
    fn bad_glorot_axes_are_errors() {
        let spec = ParamSpec::f32(
            [4],
            Init::GlorotNormal {
                in_axis: 0,
                out_axis: 1,
            },
        );
        assert!(matches!(
            Rng::new(0).sample(&Path::root(), &spec),
            Err(LayerError::Config { .. })
        ));
    }

    #[test]
    fn streams_are_std_rngs_and_a_clone_continues_one() {
        use rand::rngs::StdRng;
        for seed in [0, 7, u64::MAX] {
            let (mut ours, mut std) = (Rng::new(seed), StdRng::seed_from_u64(seed));
            for _ in 0..40 {
                assert_eq!(ours.bits(), std.random::<u64>(), "seed {seed}");
            }
            let f: f64 = ours.normal();
            assert_eq!(f, std.sample::<f64, _>(StandardNormal));
        }
        // an odd number of 32-bit words drawn, then a clone: the two draw the same from there
        let mut r = Rng::new(3);
        let _: u32 = r.0.random();
        r.normal();
        let mut c = r.clone();
        for _ in 0..100 {
            assert_eq!(r.bits(), c.bits());
        }
        assert_eq!(r.split(3)[2].bits(), c.split(3)[2].bits());
    }
}
