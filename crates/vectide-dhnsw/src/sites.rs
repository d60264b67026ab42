//! The engine's persistence calls: every FLUSH it posts names its site, so
//! that the crash simulator counts them, crashes at them and, in its
//! mutation check, switches them off one at a time (a memory node in the
//! compute node's process records them; one across the network records its
//! own, `memnode.flush`). `docs/format-dhnsw.md` says what each makes
//! durable before what.

use vectide_remote::Site;

/// A new region's sections, before its header.
pub const BUILD: Site = Site("dhnsw.build");
/// A new region's header, last.
pub const BUILD_HEADER: Site = Site("dhnsw.build.header");
/// New node records and changed neighbour lists in a partition's gap.
pub const RECORDS: Site = Site("dhnsw.records");
/// A partition's overflow count, after the records it covers (with its
/// entry's rebuild intent cleared: the intent no longer says the same).
pub const COUNT: Site = Site("dhnsw.count");
/// A label map value swapped (where a label's node is, or absent), with
/// its bucket's key.
pub const MAP_SWAP: Site = Site("dhnsw.map.swap");
/// A rebuilt partition's new area, before its entry names it.
pub const REBUILD: Site = Site("dhnsw.rebuild");
/// A rebuild's intent (the new entry, checked) in the entry's spare bytes.
pub const REBUILD_INTENT: Site = Site("dhnsw.rebuild.intent");
/// A partition's entry fields naming its rebuilt area.
pub const REBUILD_ENTRY: Site = Site("dhnsw.rebuild.entry");
/// The value words of label-map buckets without a key (a claim a crash cut
/// short) zeroed by the recovery after a restart.
pub const MAP_UNTORN: Site = Site("dhnsw.map.untorn");
/// A torn (stale) intent's check word cleared by the writer or recovery
/// that takes the partition over, before the area it names can be handed
/// out again.
pub const INTENT_DROP: Site = Site("dhnsw.intent.drop");

/// The end of the bytes handed out, moved by a rebuild.
pub const ALLOC: Site = Site("dhnsw.alloc");
/// A region's lease taken (the header's owner word).
pub const LEASE: Site = Site("dhnsw.lease");
/// A writer's durable point in the writer table (at `flush()`).
pub const DURABLE: Site = Site("dhnsw.durable");
