//! [`Checked`]: an op's operands once the front end ([`crate::ops`]) has checked them.

/// An op call whose operands [`crate::ops`] has checked: all on the backend the call goes to
/// (by identity), of the dtypes, shapes and sizes the op needs, every output the only handle
/// to its buffer. Only this crate can make one, so a backend may rely on those facts (the CUDA
/// backend launches kernels on raw addresses from them).
#[derive(Debug)]
pub struct Checked<T>(T);

impl<T> Checked<T> {
    /// Wraps operands the caller has checked.
    pub(crate) fn new(call: T) -> Checked<T> {
        Checked(call)
    }

    /// The operands.
    pub fn get(&self) -> &T {
        &self.0
    }

    /// The operands, taken.
    pub fn into_inner(self) -> T {
        self.0
    }
}
