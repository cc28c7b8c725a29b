//! [`Scratch`]: an op's workspace, allocated by its schedule.

use stax_alloc::{Allocation, Allocator, Category};
use std::sync::Arc;

use crate::{TensorError, WorkspaceStep};

/// An op's workspace buffers, allocated and freed as its
/// [`crate::Backend::workspace_schedule`] says: the op takes the schedule's steps in order, so
/// what it allocates is what a memory plan replays. An op that departs from its schedule gets
/// an error naming the step (a bug, never a silent mis-plan).
#[derive(Debug)]
pub struct Scratch {
    allocator: Arc<Allocator>,
    steps: Vec<WorkspaceStep>,
    next: usize,
    held: Vec<Option<Allocation>>,
    op: &'static str,
}

impl Scratch {
    /// The workspace of `op` on `allocator`, by `steps`.
    pub fn new(op: &'static str, allocator: &Arc<Allocator>, steps: Vec<WorkspaceStep>) -> Scratch {
        Scratch {
            allocator: allocator.clone(),
            steps,
            next: 0,
            held: Vec::new(),
            op,
        }
    }

    fn deviate(&self, what: &str) -> TensorError {
        TensorError::InvalidArgument {
            op: self.op,
            reason: format!(
                "internal: the op {what} at step {} of its workspace schedule {:?}",
                self.next, self.steps
            ),
        }
    }

    /// Takes the next step, which must allocate; returns the new buffer's index (for
    /// [`Scratch::addr`] and [`Scratch::free`]).
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when the allocation fails; [`TensorError::InvalidArgument`] when
    /// the schedule's next step is not an allocation.
    pub fn alloc(&mut self) -> Result<usize, TensorError> {
        let Some(&WorkspaceStep::Alloc(bytes)) = self.steps.get(self.next) else {
            return Err(self.deviate("allocates"));
        };
        self.held
            .push(Some(self.allocator.allocate(bytes, Category::Workspace)?));
        self.next += 1;
        Ok(self.held.len() - 1)
    }

    /// Takes the next step, which must free buffer `i`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when the schedule's next step is not that free.
    pub fn free(&mut self, i: usize) -> Result<(), TensorError> {
        if self.steps.get(self.next) != Some(&WorkspaceStep::Free(i)) {
            return Err(self.deviate(&format!("frees buffer {i}")));
        }
        self.held.get_mut(i).and_then(Option::take);
        self.next += 1;
        Ok(())
    }

    /// The address of buffer `i` (0 for none).
    pub fn addr(&self, i: usize) -> u64 {
        self.allocation(i).map_or(0, Allocation::addr)
    }

    /// Buffer `i`, while it is held.
    pub fn allocation(&self, i: usize) -> Option<&Allocation> {
        self.held.get(i).and_then(Option::as_ref)
    }

    /// Buffer `i` as writable host bytes, while it is held.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when it is not held or not host memory.
    pub fn host_mut(&mut self, i: usize) -> Result<&mut [u8], TensorError> {
        let op = self.op;
        self.held
            .get_mut(i)
            .and_then(Option::as_mut)
            .and_then(Allocation::host_bytes_mut)
            .ok_or_else(|| TensorError::InvalidArgument {
                op,
                reason: format!("workspace buffer {i} is not held host memory"),
            })
    }

    /// Buffers `i` and `j` (`i != j`) as writable host bytes at once, while both are held.
    ///
    /// # Errors
    /// As [`Scratch::host_mut`], and when `i == j`.
    pub fn host_pair_mut(
        &mut self,
        i: usize,
        j: usize,
    ) -> Result<(&mut [u8], &mut [u8]), TensorError> {
        let op = self.op;
        let bad = || TensorError::InvalidArgument {
            op,
            reason: format!("workspace buffers {i} and {j} are not two held host buffers"),
        };
        let mut views = self
            .held
            .iter_mut()
            .enumerate()
            .filter(|(k, _)| *k == i || *k == j)
            .map(|(k, a)| (k, a.as_mut().and_then(Allocation::host_bytes_mut)));
        let (Some((k1, Some(a))), Some((_, Some(b)))) = (views.next(), views.next()) else {
            return Err(bad());
        };
        Ok(if k1 == i { (a, b) } else { (b, a) })
    }

    /// Checks that every step was taken.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when steps are left.
    pub fn finish(self) -> Result<(), TensorError> {
        match self.next == self.steps.len() {
            true => Ok(()),
            false => Err(self.deviate("stops")),
        }
    }
}
