//! Graph traversal lives in `vectide-graph`; re-exported for this crate's modules.

pub(crate) use vectide_graph::search::{knn, Scratch};
