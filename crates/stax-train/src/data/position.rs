//! Where a training loop is in its data order, so that a resumed run sees the batches the
//! uninterrupted run would have seen.
//!
//! A loop over [`Loader::batches`] epoch after epoch is at a [`DataPosition`]: the order's seed,
//! the epoch, and how many examples of that epoch's permutation it has used. The position is
//! the whole state of the data order's randomness: each epoch's generator is seeded from
//! `(seed, epoch)` (see [`crate::data::loader`]), so nothing else needs saving.
//!
//! ```
//! use stax_train::data::{DataPosition, Loader};
//! let loader = Loader::new(10, 3, 7)?; // 3 full batches an epoch
//! let straight: Vec<Vec<usize>> = (0..3).flat_map(|e| loader.batches(e)).collect();
//! let at = loader.advance(loader.start(), 4); // after 4 batches: epoch 1, 3 examples in
//! assert_eq!(at, DataPosition { seed: 7, epoch: 1, index: 3 });
//! let resumed: Vec<Vec<usize>> = loader.batches_from(at)?.take(5).collect();
//! assert_eq!(resumed, straight[4..]);
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use serde::Serialize;

use super::Loader;
use crate::TrainError;

/// A point in a loader's data order: epoch `epoch` of the order drawn from `seed`, with the
/// first `index` examples of its permutation used (a multiple of the batch size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DataPosition {
    /// The seed the order is drawn from ([`Loader::seed`]).
    pub seed: u64,
    /// The epoch, from 0.
    pub epoch: u64,
    /// Examples of the epoch's permutation already used.
    pub index: u64,
}

impl std::fmt::Display for DataPosition {
    /// `epoch 0, example 500 of the order of seed 2793`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let DataPosition { seed, epoch, index } = self;
        write!(
            f,
            "epoch {epoch}, example {index} of the order of seed {seed}"
        )
    }
}

impl Loader {
    /// The start of epoch 0.
    pub fn start(&self) -> DataPosition {
        DataPosition {
            seed: self.seed(),
            epoch: 0,
            index: 0,
        }
    }

    /// The position `batches` full batches after `from`, epochs wrapping as
    /// [`Loader::batches`] ends them (the last incomplete batch dropped).
    pub fn advance(&self, from: DataPosition, batches: u64) -> DataPosition {
        let b = self.batch_size() as u64;
        let per_epoch = self.num_batches() as u64;
        let left = (per_epoch * b).saturating_sub(from.index) / b;
        if batches < left {
            return DataPosition {
                index: from.index + batches * b,
                ..from
            };
        }
        let after = batches - left;
        DataPosition {
            seed: from.seed,
            epoch: from.epoch.saturating_add(1 + after / per_epoch),
            index: (after % per_epoch) * b,
        }
    }

    /// The batches from `at` on: the rest of `at.epoch`'s, then every later epoch's, without
    /// end (take as many as the run needs). They are the batches a loop over
    /// [`Loader::batches`] from epoch 0 would see after reaching `at`.
    ///
    /// # Errors
    /// [`TrainError::DataPosition`] when `at` is another seed's, or its index is past the
    /// data set or not a multiple of the batch size.
    pub fn batches_from(
        &self,
        at: DataPosition,
    ) -> Result<impl Iterator<Item = Vec<usize>> + use<>, TrainError> {
        let b = self.batch_size() as u64;
        let bad = |reason: String| TrainError::DataPosition {
            position: at,
            reason,
        };
        if at.seed != self.seed() {
            return Err(bad(format!("the loader's seed is {}", self.seed())));
        }
        if at.index > self.dataset_len() as u64 || at.index % b != 0 {
            return Err(bad(format!(
                "the index must be a multiple of the batch size {b} and at most {}",
                self.dataset_len()
            )));
        }
        let loader = *self;
        // the epochs after it, up to the counter's last (inclusive: no overflow at the end)
        let later = at
            .epoch
            .checked_add(1)
            .into_iter()
            .flat_map(|e| e..=u64::MAX);
        let rest = later.flat_map(move |e| loader.batches(e));
        Ok(self
            .batches(at.epoch)
            .skip((at.index / b) as usize)
            .chain(rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resuming_anywhere_continues_the_straight_order() {
        let loader = Loader::new(23, 5, 11).unwrap(); // 4 batches an epoch, 3 examples dropped
        let straight: Vec<Vec<usize>> = (0..4).flat_map(|e| loader.batches(e)).collect();
        for done in 0..12 {
            let at = loader.advance(loader.start(), done);
            assert_eq!(at.epoch, done / 4);
            assert_eq!(at.index, (done % 4) * 5);
            let resumed: Vec<Vec<usize>> = loader.batches_from(at).unwrap().take(4).collect();
            assert_eq!(
                resumed,
                straight[done as usize..done as usize + 4],
                "after {done}"
            );
            // advancing in two hops is advancing once
            let hop = loader.advance(loader.advance(loader.start(), done / 2), done - done / 2);
            assert_eq!(hop, at);
        }
    }

    /// At the epoch counter's end the order gives that epoch's remaining batches, then stops.
    #[test]
    fn the_last_epoch_ends_the_order() {
        let loader = Loader::new(7, 3, 1).unwrap(); // 2 batches an epoch
        let at = DataPosition {
            seed: 1,
            epoch: u64::MAX,
            index: 3,
        };
        let left: Vec<Vec<usize>> = loader.batches_from(at).unwrap().take(4).collect();
        let last: Vec<Vec<usize>> = loader.batches(u64::MAX).skip(1).collect();
        assert_eq!(left, last);
        assert_eq!(left.len(), 1);
    }

    #[test]
    fn foreign_positions_are_typed_errors() {
        let loader = Loader::new(23, 5, 11).unwrap();
        let other = DataPosition {
            seed: 12,
            ..loader.start()
        };
        let e = loader.batches_from(other).err().unwrap();
        assert!(e.to_string().contains("the loader's seed is 11"), "{e}");
        for index in [3, 30] {
            let at = DataPosition {
                index,
                ..loader.start()
            };
            let e = loader.batches_from(at).err().unwrap();
            assert!(
                e.to_string().contains("multiple of the batch size 5"),
                "{e}"
            );
        }
    }
}
