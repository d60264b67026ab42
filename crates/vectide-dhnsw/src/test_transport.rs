//! A transport for the engine's fault tests: TCP to a memory node, every
//! doorbell handed to a closure that decides how it reaches the node (torn
//! into pieces, cut short by a death...). Control verbs pass straight on.

use vectide_core::Result;
use vectide_remote::{
    Completion, Counters, NodeSize, Region, RegionInfo, RemoteMemory, TcpMemory, Verb,
};

type Post = Box<dyn Fn(&TcpMemory, &[Verb]) -> Result<Vec<Completion>> + Send + Sync>;

pub(crate) struct Wrapped {
    pub inner: TcpMemory,
    pub post: Post,
}

impl RemoteMemory for Wrapped {
    fn create_region(&self, name: &str, size: u64) -> Result<Region> {
        self.inner.create_region(name, size)
    }
    fn open_region(&self, name: &str) -> Result<Region> {
        self.inner.open_region(name)
    }
    fn drop_region(&self, name: &str) -> Result<()> {
        self.inner.drop_region(name)
    }
    fn regions(&self) -> Result<(Vec<RegionInfo>, NodeSize)> {
        self.inner.regions()
    }
    fn post(&self, wrs: &[Verb]) -> Result<Vec<Completion>> {
        (self.post)(&self.inner, wrs)
    }
    fn counters(&self) -> &Counters {
        self.inner.counters()
    }
}
