//! [`Mark`]: a point in a backend's stream of work, for timing what ran between two points
//! (as `torch.cuda.Event(enable_timing=True)` does).

use crate::TensorError;
use cudarc::driver::CudaEvent;
use std::fmt;
use std::time::Instant;

/// A point in a backend's stream of work ([`crate::Backend::mark`]): the host clock where ops
/// run synchronously (the CPU), or a CUDA event recorded on the compute stream, which the
/// device passes when every op queued before it has run.
pub struct Mark(Kind);

enum Kind {
    Host(Instant),
    Cuda(CudaEvent),
}

impl fmt::Debug for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Host(t) => f.debug_tuple("Mark::Host").field(t).finish(),
            Kind::Cuda(_) => f.write_str("Mark::Cuda"),
        }
    }
}

impl Mark {
    /// Now, on the host clock.
    pub fn host() -> Mark {
        Mark(Kind::Host(Instant::now()))
    }

    /// A CUDA event already recorded on the stream of the work it marks (with timing on).
    pub(crate) fn cuda(event: CudaEvent) -> Mark {
        Mark(Kind::Cuda(event))
    }

    /// Milliseconds from this mark to `later` (the work queued between them, as the device
    /// ran it). Waits for `later` to be reached (CUDA: `cuEventSynchronize`, then
    /// `cuEventElapsedTime`, whose resolution is about 0.5 µs).
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for marks of different kinds (host and CUDA);
    /// [`TensorError::Driver`] from the CUDA calls.
    pub fn elapsed_ms(&self, later: &Mark) -> Result<f64, TensorError> {
        match (&self.0, &later.0) {
            (Kind::Host(a), Kind::Host(b)) => {
                Ok(b.saturating_duration_since(*a).as_secs_f64() * 1e3)
            }
            (Kind::Cuda(a), Kind::Cuda(b)) => {
                b.synchronize()
                    .map_err(crate::cuda::driver("cuEventSynchronize"))?;
                let ms = a
                    .elapsed_ms(b)
                    .map_err(crate::cuda::driver("cuEventElapsedTime"))?;
                Ok(f64::from(ms))
            }
            _ => Err(TensorError::InvalidArgument {
                op: "Mark::elapsed_ms",
                reason: "the two marks come from different kinds of backend (host and CUDA)".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_marks_measure_the_host_clock_in_order() {
        let a = Mark::host();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = Mark::host();
        let ms = a.elapsed_ms(&b).unwrap();
        assert!((5.0..1000.0).contains(&ms), "{ms}");
        // the other way round saturates at zero
        assert_eq!(b.elapsed_ms(&a).unwrap(), 0.0);
    }
}
