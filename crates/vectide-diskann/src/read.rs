//! Reads of `fresh-diskann`: search over the LTI and every temp index
//! (the location map filters out stale copies), and `get`.

use crate::lti::Scratch;
use crate::state::*;
use std::sync::atomic::Ordering;
use vectide_core::validate::prepare_query;
use vectide_core::{Error, Filter, Neighbor, Result, SearchParams, VectorIndex};

impl Inner {
    // ----- reads -----

    pub(crate) fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        out.clear();
        let mut buf = Vec::new();
        let q = prepare_query(self.dim, self.metric, query, &mut buf)?;
        if k == 0 {
            return Ok(());
        }
        let l = params.ef.unwrap_or(self.params.graph.l_search).max(k);
        let w = params.beam_width.unwrap_or(self.params.beam_width);
        let st = self.state.read();
        if let Some(g) = &st.lti {
            let mut scratch = self.scratches.lock().pop().unwrap_or_default();
            let mut found = Vec::new();
            let admit = |node: u32, label: u64| {
                st.loc
                    .get(&label)
                    .is_some_and(|x| x.place == Place::Lti(node))
                    && filter.is_none_or(|f| f(label))
            };
            let r = g.lti.search(q, k, l, w, &admit, &mut scratch, &mut found);
            self.scratches.lock().push(scratch);
            let qs = r?;
            self.io.queries.fetch_add(1, Ordering::Relaxed);
            self.io
                .sectors
                .fetch_add(qs.sectors_read, Ordering::Relaxed);
            self.io.hops.fetch_add(qs.hops, Ordering::Relaxed);
            self.io
                .cache_hits
                .fetch_add(qs.cache_hits, Ordering::Relaxed);
            out.extend(found.iter().map(|&(d, id)| Neighbor::new(id, d)));
        }
        let tp = SearchParams::with_ef(l);
        let mut part = Vec::new();
        for t in &st.temps {
            if t.index.is_empty() {
                continue;
            }
            let serial = t.serial;
            let admit = |id: u64| {
                st.loc
                    .get(&id)
                    .is_some_and(|x| x.place == Place::temp(serial))
                    && filter.is_none_or(|f| f(id))
            };
            t.index.search_into(q, k, &tp, Some(&admit), &mut part)?;
            out.extend_from_slice(&part);
        }
        out.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
        out.truncate(k);
        Ok(())
    }

    pub(crate) fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let st = self.state.read();
        let Some(l) = st.loc.get(&id).copied() else {
            return Ok(None);
        };
        match l.place {
            Place::Temp(s) => match st.temps.iter().find(|t| t.serial == u64::from(s)) {
                Some(t) => t.index.get(id),
                None => Err(Error::corrupted(format!(
                    "point {id} names a missing temp index"
                ))),
            },
            Place::Lti(n) => {
                let g = st
                    .lti
                    .as_ref()
                    .ok_or_else(|| Error::corrupted(format!("point {id} names a missing LTI")))?;
                let mut v = vec![0.0; self.dim];
                let mut scratch = Scratch::default();
                g.lti
                    .read_records(&[n], &mut scratch, |_, node| node.vector_into(&mut v))?;
                Ok(Some(v))
            }
        }
    }

    /// The distances from `query` to the live points of `ids` (absent ones
    /// skipped): the LTI's nodes read in batches of 64 sectors (not one
    /// read per id), the temp indexes' points from memory. The state's
    /// lock is held only to locate the ids: the parts are kept alive by
    /// their `Arc`s while they are read, so writers and a merge's switch
    /// go on (a point moved meanwhile is answered from where it was).
    pub(crate) fn distances(
        &self,
        query: &[f32],
        ids: &[u64],
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        let mut qbuf = Vec::new();
        let q = prepare_query(self.dim, self.metric, query, &mut qbuf)?;
        let dist = self.metric.distance_fn();
        let (lti, temps, mut nodes, mut in_temp) = {
            let st = self.state.read();
            let mut nodes: Vec<(u32, u64)> = Vec::new();
            let mut in_temp: Vec<(u64, u64)> = Vec::new();
            for &id in ids {
                match st.loc.get(&id).map(|l| l.place) {
                    Some(Place::Lti(n)) => nodes.push((n, id)),
                    Some(Place::Temp(s)) => in_temp.push((u64::from(s), id)),
                    None => {}
                }
            }
            (st.lti.clone(), st.temps.clone(), nodes, in_temp)
        };
        in_temp.sort_unstable();
        for t in &temps {
            let lo = in_temp.partition_point(|&(s, _)| s < t.serial);
            let hi = in_temp.partition_point(|&(s, _)| s <= t.serial);
            let mine: Vec<u64> = in_temp[lo..hi].iter().map(|&(_, id)| id).collect();
            t.index.distances(query, &mine, out)?;
        }
        if let (Some(g), false) = (lti, nodes.is_empty()) {
            // In file order, so that the batches read neighbouring sectors.
            nodes.sort_unstable();
            let order: Vec<u32> = nodes.iter().map(|&(n, _)| n).collect();
            let mut scratch = Scratch::default();
            let mut at = 0;
            let mut v = vec![0.0; self.dim];
            g.lti.read_records(&order, &mut scratch, |_, node| {
                node.vector_into(&mut v)?;
                out.push(Neighbor::new(nodes[at].1, dist(q, &v)));
                at += 1;
                Ok(())
            })?;
        }
        Ok(())
    }
}
