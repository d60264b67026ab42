//! The engine's face: [`DHnsw`]'s [`VectorIndex`] implementation.

use crate::state::DHnsw;
use std::sync::atomic::Ordering;
use vectide_core::validate::{copy_normalized, Checked};
use vectide_core::{
    EngineDescriptor, Error, Filter, IndexStats, Metric, Neighbor, Params, Result, SearchParams,
    Seq, VectorIndex,
};

impl DHnsw {
    /// Runs `op`; when it failed on a region another compute node moved the
    /// index away from, attaches to the new one and runs it again (a few
    /// times: the index may move again meanwhile).
    fn on_moved<R>(&self, op: impl Fn() -> Result<R>) -> Result<R> {
        let mut moves = 0;
        loop {
            self.ensure_recovered()?;
            match op() {
                Err(e)
                    if vectide_remote::is_unknown_region(&e) && moves < 8 && self.reattach()? =>
                {
                    moves += 1;
                }
                other => return other,
            }
        }
    }

    fn insert_batch(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        if self.metric.normalizes() {
            let mut v = Vec::with_capacity(batch.vectors().len());
            let mut row = Vec::with_capacity(self.dim);
            for r in batch.vectors().chunks(self.dim) {
                copy_normalized(self.metric, r, &mut row);
                v.extend_from_slice(&row);
            }
            self.on_moved(|| self.insert_rows(seq, batch.ids(), &v))
        } else {
            self.on_moved(|| self.insert_rows(seq, batch.ids(), batch.vectors()))
        }
    }

    fn prepare(&self, queries: &[f32]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(queries.len());
        let mut buf = Vec::with_capacity(self.dim);
        for q in queries.chunks(self.dim) {
            let q = vectide_core::validate::prepare_query(self.dim, self.metric, q, &mut buf)?;
            out.extend_from_slice(q);
        }
        Ok(out)
    }
}

impl VectorIndex for DHnsw {
    fn descriptor(&self) -> &'static EngineDescriptor {
        &crate::DESCRIPTOR
    }
    fn params(&self) -> Params {
        use vectide_core::ParamValue;
        let mut p = self.params.to_params();
        p.insert("threads".into(), ParamValue::Int(self.threads() as i64));
        if let Some(l) = self.layout.read().as_ref() {
            p.insert("region".into(), ParamValue::Str(l.name.clone()));
            p.insert("partitions".into(), ParamValue::Int(i64::from(l.header.k)));
        }
        p
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_deref()
    }
    fn search_defaults(&self) -> SearchParams {
        SearchParams {
            ef: Some(self.params.ef_search),
            nprobe: Some(self.params.probe),
            ..SearchParams::default()
        }
    }
    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_batch(seq, Checked::new(self.dim, self.metric, ids, vectors)?)
    }
    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.insert_batch(seq, batch)
    }
    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.on_moved(|| self.delete_rows(seq, ids))
    }
    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        out.clear();
        if query.len() != self.dim {
            return Err(Error::DimensionMismatch {
                expected: self.dim,
                got: query.len(),
            });
        }
        let mut r = self.search_batch(query, k, params, filter)?;
        *out = r.pop().unwrap_or_default();
        Ok(())
    }
    fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        if k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        if !queries.len().is_multiple_of(self.dim) {
            return Err(Error::DimensionMismatch {
                expected: self.dim,
                got: queries.len() % self.dim,
            });
        }
        let qs = self.prepare(queries)?;
        self.on_moved(|| self.search_prepared(&qs, k, params, filter))
    }
    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let guard = self.layout.read();
        let Some(lay) = guard.as_ref() else {
            return Ok(None);
        };
        self.read_label(lay, id)
    }
    fn contains(&self, id: u64) -> Result<bool> {
        let guard = self.layout.read();
        let Some(lay) = guard.as_ref() else {
            return Ok(false);
        };
        Ok(lay
            .map
            .get(&*self.mem, id)?
            .is_some_and(|f| f.value.present))
    }
    fn len(&self) -> usize {
        // The region's live count (any compute node's writes); this node's
        // own count when the memory node does not answer.
        let guard = self.layout.read();
        let Some(lay) = guard.as_ref() else {
            return 0;
        };
        match self.mem.read(lay.region, crate::layout::LIVE_AT, 8) {
            Ok(w) => u64::from_le_bytes(w[..8].try_into().expect("8 bytes")) as usize,
            Err(_) => self.labels.read().len(),
        }
    }
    fn flush(&self) -> Result<()> {
        self.on_moved(|| self.flush_writer())
    }
    fn keeps_itself(&self) -> bool {
        // A named region on a memory node that keeps its regions across
        // its restarts (a backing file: a boot number).
        self.params.memnode.is_some() && self.params.region.is_some() && self.mem.boot() != 0
    }
    fn durable_seq(&self) -> Seq {
        self.durable.load(Ordering::Acquire)
    }
    fn stats(&self) -> Result<IndexStats> {
        let c = self.counters();
        let live = self.len();
        let guard = self.layout.read();
        let (slots, region, used, k) = guard.as_ref().map_or((0, 0, 0, 0), |l| {
            let slots: u64 = l.table.iter().map(|e| u64::from(e.n_base) + e.count).sum();
            (
                slots as usize,
                l.header.region_size,
                l.header.alloc_end,
                l.table.len(),
            )
        });
        // The free table and the region's used end as the region has them
        // (every compute node's rebuilds move them); this node's copy when
        // the memory node does not answer (statistics never fail on it).
        let (free, used) = match guard.as_ref() {
            Some(l) => {
                let remote = self
                    .mem
                    .read(l.region, crate::layout::ALLOC_END_AT, 8)
                    .map(|w| u64::from_le_bytes(w[..8].try_into().expect("8 bytes")));
                (self.free_bytes(l).unwrap_or(0), remote.unwrap_or(used))
            }
            None => (0, used),
        };
        let cache = self.cache.lock();
        let meta_bytes = guard.as_ref().map_or(0, |l| l.meta.memory_bytes());
        let t = &self.timing;
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
        Ok(IndexStats {
            live,
            slots_used: slots,
            capacity: slots,
            pending_deletes: slots.saturating_sub(live),
            memory_bytes: cache.bytes() + meta_bytes + live * 24,
            disk_bytes: 0,
            reads: c.work_requests,
            bytes_read: c.bytes_received,
            round_trips: c.round_trips,
            extra: vec![
                ("partitions".into(), k as f64),
                ("cached_partitions".into(), cache.len() as f64),
                ("cache_capacity".into(), cache.cap.min(k) as f64),
                ("cache_bytes".into(), cache.bytes() as f64),
                (
                    "cache_budget_bytes".into(),
                    if cache.budget == usize::MAX {
                        0.0
                    } else {
                        cache.budget as f64
                    },
                ),
                ("region_bytes".into(), region as f64),
                ("region_used_bytes".into(), used as f64),
                ("region_dead_bytes".into(), ld(&t.dead_bytes)),
                ("region_free_bytes".into(), free as f64),
                ("rebuilt_bytes".into(), ld(&t.rebuilt_bytes)),
                ("rebuilt_bytes_reused".into(), ld(&t.reused_bytes)),
                ("cas_retries".into(), ld(&t.cas_retries)),
                ("recovery.restarts".into(), ld(&t.recoveries)),
                ("rebuild_ns".into(), ld(&t.rebuild_ns)),
                ("partition_rebuilds".into(), ld(&t.rebuilds)),
                ("region_relayouts".into(), ld(&t.relayouts)),
                ("repartitions".into(), ld(&t.repartitions)),
                ("round_trips".into(), c.round_trips as f64),
                ("work_requests".into(), c.work_requests as f64),
                ("bytes_sent".into(), c.bytes_sent as f64),
                ("bytes_received".into(), c.bytes_received as f64),
                ("net_model_ns".into(), c.model_ns as f64),
                ("net_wall_ns".into(), c.wall_ns as f64),
                ("search_batches".into(), ld(&t.batches)),
                ("search_queries".into(), ld(&t.queries)),
                ("meta_ns".into(), ld(&t.meta_ns)),
                ("fetch_ns".into(), ld(&t.fetch_ns)),
                ("sub_ns".into(), ld(&t.sub_ns)),
                ("decode_thread_ns".into(), ld(&t.decode_ns)),
                ("batch_ns".into(), ld(&t.batch_ns)),
                ("partitions_fetched".into(), ld(&t.partitions_fetched)),
                ("partitions_cached".into(), ld(&t.partitions_cached)),
            ],
            ..IndexStats::default()
        })
    }
    fn maintain(&self) -> Result<()> {
        // Partitions a stopped writer left held: taken over (after six
        // timeouts of being seen so), their labels put right, published;
        // then old nodes a stopped writer owed a tombstone. A region whose
        // memory node restarted is put right first.
        self.ensure_recovered()?;
        self.repair_stuck()?;
        let _w = self.write.lock();
        let mut guard = self.layout.write();
        if let Some(lay) = guard.as_mut() {
            self.sweep_owed(lay)?;
        }
        Ok(())
    }
    fn save(&self, path: &std::path::Path) -> Result<()> {
        self.save_file(path)
    }
    fn check_structure(&self) -> Result<Vec<String>> {
        // The region as it is now (other compute nodes may have written):
        // every live node is named by the label map with its label, every
        // present value names a live node, and the header counts both.
        self.refresh_table()?;
        let mut out = Vec::new();
        let guard = self.layout.read();
        let Some(lay) = guard.as_ref() else {
            return Ok(out);
        };
        let scanned = lay.map.scan(&*self.mem)?;
        let mut named: std::collections::HashMap<(u32, u32), u64> =
            std::collections::HashMap::new();
        for (l, v) in &scanned {
            if v.present && named.insert((v.part, v.slot), *l).is_some() {
                out.push(format!("partition {} node {} named twice", v.part, v.slot));
            }
        }
        let present = named.len();
        let mut live = 0usize;
        let all: Vec<u32> = (0..lay.table.len() as u32).collect();
        let mut graphs = Vec::new();
        self.fetch_chains(lay, &all, self.params.chain_for(all.len()), |c| {
            for (p, b, e) in c {
                graphs.push((p, self.decode_part(lay, &e, p, &b)?));
            }
            Ok(())
        })?;
        for (p, g) in graphs {
            for node in 0..g.len() as u32 {
                if g.is_deleted(node) {
                    continue;
                }
                live += 1;
                let l = g.labels[node as usize];
                match named.remove(&(p, node)) {
                    Some(m) if m == l => {}
                    other => out.push(format!(
                        "partition {p} node {node}: label {l} is live, the label map names {other:?} there"
                    )),
                }
            }
        }
        for ((p, node), l) in named {
            out.push(format!(
                "the label map names partition {p} node {node} for label {l}, not a live node of it"
            ));
        }
        let head = self
            .mem
            .read(lay.region, 0, crate::layout::HEADER_BYTES as u32)?;
        let word = |at: u64| {
            u64::from_le_bytes(
                head[at as usize..at as usize + 8]
                    .try_into()
                    .expect("8 bytes"),
            )
        };
        let (live_word, keys_word) = (word(crate::layout::LIVE_AT), word(crate::layout::KEYS_AT));
        if live_word != present as u64 || keys_word != scanned.len() as u64 || live != present {
            out.push(format!(
                "the header counts {live_word} live and {keys_word} taken buckets; the map has {present} present of {} taken, the partitions {live} live nodes",
                scanned.len()
            ));
        }
        Ok(out)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
