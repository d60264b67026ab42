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

/// A 4-d point of its own for each label (the fault tests' data).
pub(crate) fn point(l: u64) -> Vec<f32> {
    let x = l as f32;
    vec![
        x.sin() * 10.0,
        x.cos() * 10.0,
        (x * 0.37).sin() * 10.0,
        (l % 7) as f32,
    ]
}

/// The points of `ls`, row after row.
pub(crate) fn rows(ls: &[u64]) -> Vec<f32> {
    ls.iter().flat_map(|&l| point(l)).collect()
}

/// A writer's parameters for the fault tests: a named region, `k`
/// partitions with small gaps (rebuilds come soon), no LRU.
pub(crate) fn writer_params(region: &str, k: i64) -> vectide_core::Params {
    use vectide_core::ParamValue;
    vectide_core::params::params_of([
        ("region", ParamValue::Str(region.into())),
        ("partitions", ParamValue::Int(k)),
        ("gap", ParamValue::Float(0.02)),
        ("m", ParamValue::Int(4)),
        ("threads", ParamValue::Int(1)),
        ("cache_partitions", ParamValue::Int(0)),
    ])
}
