//! CONTRACT SKELETON (to be replaced by the real implementation; signatures are fixed).
#![allow(missing_docs, unused_variables)]
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Category { Parameter, OptimizerState, Gradient, Activation, Input, Workspace, Other }
impl Category {
    pub const ALL: [Category; 7] = [Category::Parameter, Category::OptimizerState, Category::Gradient, Category::Activation, Category::Input, Category::Workspace, Category::Other];
    pub fn index(self) -> usize { self as usize }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment { pub addr: u64, pub bytes: usize }

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("out of memory")]
    OutOfMemory(Box<OomReport>),
    #[error("backend {backend}: {op} failed: {message}")]
    Backend { backend: String, op: &'static str, message: String },
    #[error("STAX_ALLOCATOR={value:?}: {reason}")]
    InvalidStrategy { value: String, reason: String },
}
#[derive(Debug, Clone)]
pub struct OomReport { pub requested: u64, pub category: Category, pub reserved: u64, pub allocated: u64, pub allocated_by_category: [u64; 7], pub cached: u64, pub largest_free_block: u64, pub driver_free: Option<u64>, pub capacity: Option<u64>, pub can_never_fit: bool }

pub trait RawMemory: Send + Sync + std::fmt::Debug + 'static {
    fn name(&self) -> String;
    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError>;
    fn release(&self, segment: Segment) -> Result<(), AllocError>;
    fn granularity(&self) -> usize;
    fn alignment(&self) -> usize;
    fn capacity(&self) -> Option<u64>;
    fn free_bytes(&self) -> Option<u64>;
    fn stream_ordered(&self) -> bool { false }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub enum Strategy { #[default] Caching, Bfc { fraction: f64 }, Platform, Async { release_threshold: u64 } }

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CategoryStats { pub live: u64, pub allocated: u64, pub peak: u64 }
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub requested: u64, pub allocated: u64, pub reserved: u64, pub cached: u64,
    pub peak_requested: u64, pub peak_allocated: u64, pub peak_reserved: u64,
    pub peak_by_category: [u64; 7],
    pub by_category: [CategoryStats; 7],
    pub allocs: u64, pub frees: u64, pub segments: u64, pub backend_reserves: u64, pub backend_releases: u64,
    pub largest_free_block: u64, pub fragmentation: f64,
}

#[derive(Debug)]
pub struct Allocator { backend: Arc<dyn RawMemory> }
#[derive(Debug)]
pub struct Allocation { addr: u64, bytes: usize, category: Category, owner: Arc<Allocator> }
impl Allocation {
    pub fn addr(&self) -> u64 { self.addr }
    pub fn bytes(&self) -> usize { self.bytes }
    pub fn category(&self) -> Category { self.category }
    pub fn allocator(&self) -> &Arc<Allocator> { &self.owner }
}
impl Allocator {
    pub fn new(backend: Arc<dyn RawMemory>, strategy: Strategy) -> Result<Arc<Allocator>, AllocError> { todo!() }
    pub fn allocate(self: &Arc<Self>, bytes: usize, category: Category) -> Result<Allocation, AllocError> { todo!() }
    pub fn stats(&self) -> Stats { todo!() }
    pub fn reset_peak(&self) { todo!() }
    pub fn empty_cache(&self) -> Result<(), AllocError> { todo!() }
    pub fn backend(&self) -> &Arc<dyn RawMemory> { &self.backend }
    pub fn strategy(&self) -> &Strategy { todo!() }
}
#[derive(Debug)]
pub struct HostMemory;
impl HostMemory { pub fn new() -> Self { HostMemory } }
