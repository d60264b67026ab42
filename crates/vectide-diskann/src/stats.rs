//! What `fresh-diskann` reports of itself: `stats` (parts, merge progress,
//! I/O counters) and the structural check.

use crate::state::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::{IndexStats, Result, VectorIndex};

impl Inner {
    pub(crate) fn stats(&self) -> IndexStats {
        let st = self.state.read();
        let temp_points = st.temp_points();
        let (lti_nodes, lti_mem, lti_reads) = st.lti.as_ref().map_or((0, 0, 0), |g| {
            (
                g.lti.header().nodes,
                g.lti.memory_bytes(),
                g.lti.file().stats().blocks_read,
            )
        });
        let temp_mem: usize = st
            .temps
            .iter()
            .map(|t| t.index.stats().map_or(0, |s| s.memory_bytes))
            .sum();
        let loc_mem = st.loc.capacity() * (std::mem::size_of::<(u64, Loc)>() + 1);
        let disk: u64 = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        let q = self.io.queries.load(Ordering::Relaxed).max(1) as f64;
        let s = &self.status;
        let mut extra = vec![
            ("lti_nodes".to_string(), lti_nodes as f64),
            (
                "lti_points".into(),
                st.loc
                    .values()
                    .filter(|l| matches!(l.place, Place::Lti(_)))
                    .count() as f64,
            ),
            ("lti_dead".into(), st.lti_dead.len() as f64),
            ("lti_ram_bytes".into(), (lti_mem + loc_mem) as f64),
            ("temp_indexes".into(), st.temps.len() as f64),
            ("temp_points".into(), temp_points as f64),
            ("ro_dead".into(), st.ro_dead.len() as f64),
            ("merges".into(), s.merges.load(Ordering::Relaxed) as f64),
            (
                "merge_failures".into(),
                s.failures.load(Ordering::Relaxed) as f64,
            ),
            (
                "merge_running".into(),
                f64::from(u8::from(s.running.load(Ordering::Relaxed))),
            ),
            (
                "merge_phase".into(),
                f64::from(s.phase.load(Ordering::Relaxed)),
            ),
            ("merge_done".into(), s.done.load(Ordering::Relaxed) as f64),
            ("merge_total".into(), s.total.load(Ordering::Relaxed) as f64),
            (
                "disk_queries".into(),
                self.io.queries.load(Ordering::Relaxed) as f64,
            ),
            (
                "sectors_per_query".into(),
                self.io.sectors.load(Ordering::Relaxed) as f64 / q,
            ),
            (
                "hops_per_query".into(),
                self.io.hops.load(Ordering::Relaxed) as f64 / q,
            ),
            (
                "cache_hits".into(),
                self.io.cache_hits.load(Ordering::Relaxed) as f64,
            ),
            (
                "lti_generation".into(),
                st.lti.as_ref().map_or(0, |g| g.gen) as f64,
            ),
        ];
        if let Some(m) = s.last.lock().as_ref() {
            extra.push(("last_merge_delete_secs".into(), m.delete_secs));
            extra.push(("last_merge_insert_secs".into(), m.insert_secs));
            extra.push(("last_merge_patch_secs".into(), m.patch_secs));
            extra.push(("last_merge_sectors_read".into(), m.sectors_read as f64));
            // The merge's named caches and buffers (MergeStats::cache_bytes).
            extra.push((
                "last_merge_near_start_bytes".into(),
                m.near_start_bytes as f64,
            ));
            extra.push(("last_merge_recent_bytes".into(), m.recent_bytes as f64));
            extra.push((
                "last_merge_io_buffer_bytes".into(),
                m.io_buffer_bytes as f64,
            ));
            extra.push((
                "last_merge_insert_cache_hits".into(),
                m.insert_cache_hits as f64,
            ));
            extra.push((
                "last_merge_insert_expanded".into(),
                m.insert_searches.expanded as f64,
            ));
            extra.push((
                "last_merge_insert_pq_distances".into(),
                m.insert_searches.pq_distances as f64,
            ));
            extra.push(("last_merge_orphans_linked".into(), m.orphans_linked as f64));
            extra.push(("last_merge_orphans_left".into(), m.orphans_left as f64));
        }
        let mut stats = IndexStats {
            live: st.loc.len(),
            slots_used: lti_nodes as usize + temp_points,
            capacity: lti_nodes as usize + temp_points,
            pending_deletes: st.lti_dead.len() + st.ro_dead.len(),
            memory_bytes: lti_mem + loc_mem + temp_mem,
            disk_bytes: disk,
            reads: lti_reads,
            bytes_read: lti_reads * 4096,
            round_trips: 0,
            pending_background: usize::from(s.running.load(Ordering::Relaxed)),
            consolidations: s.merges.load(Ordering::Relaxed),
            extra,
            ..IndexStats::default()
        };
        s.activity.fill(&mut stats);
        stats
    }

    /// Checks the location map against the parts.
    pub(crate) fn check(&self) -> Result<Vec<String>> {
        let st = self.state.read();
        let mut v = Vec::new();
        let serials: HashMap<u64, &Arc<Temp>> = st.temps.iter().map(|t| (t.serial, t)).collect();
        let nodes = st.lti.as_ref().map_or(0, |g| g.lti.header().nodes);
        let mut bad_temp = 0;
        let mut bad_node = 0;
        for (&id, l) in &st.loc {
            match l.place {
                Place::Temp(s) => match serials.get(&u64::from(s)) {
                    Some(t) if t.index.contains(id)? => {}
                    _ => bad_temp += 1,
                },
                Place::Lti(n) if (n as u64) < nodes => {}
                Place::Lti(_) => bad_node += 1,
            }
        }
        if bad_temp > 0 {
            v.push(format!(
                "{bad_temp} points placed in a temp index that lacks them"
            ));
        }
        if bad_node > 0 {
            v.push(format!("{bad_node} points placed past the LTI"));
        }
        if st.lti_dead.iter().any(|&n| n as u64 >= nodes) {
            v.push("the DeleteList names nodes past the LTI".into());
        }
        if let Some(g) = &st.lti {
            // Every live LTI point must be reachable from the start node
            // (deleted nodes still route). Reads the whole LTI: a checker.
            let n = nodes as usize;
            let mut lists: Vec<Vec<u32>> = vec![Vec::new(); n];
            g.lti.scan(|i, node| {
                lists[i as usize] = node.neighbor_ids().collect();
                Ok(())
            })?;
            let live: Vec<u32> = st
                .loc
                .values()
                .filter_map(|l| match l.place {
                    Place::Lti(node) => Some(node),
                    Place::Temp(_) => None,
                })
                .collect();
            let lost = unreachable(&lists, g.lti.header().start as u32, &live);
            if !lost.is_empty() {
                v.push(format!(
                    "{} live LTI points unreachable from the start node (nodes {:?}…)",
                    lost.len(),
                    &lost[..lost.len().min(8)]
                ));
            }
        }
        for t in &st.temps {
            for e in t.index.check_structure()? {
                v.push(format!("temp index {}: {e}", t.serial));
            }
        }
        Ok(v)
    }
}

/// The nodes of `live` that no path of out-edges from `start` reaches.
pub(crate) fn unreachable(lists: &[Vec<u32>], start: u32, live: &[u32]) -> Vec<u32> {
    let mut seen = vec![false; lists.len()];
    let mut stack = Vec::new();
    if (start as usize) < lists.len() {
        seen[start as usize] = true;
        stack.push(start);
    }
    while let Some(u) = stack.pop() {
        for &v in &lists[u as usize] {
            if let Some(s) = seen.get_mut(v as usize) {
                if !*s {
                    *s = true;
                    stack.push(v);
                }
            }
        }
    }
    let mut lost: Vec<u32> = live
        .iter()
        .copied()
        .filter(|&x| !seen.get(x as usize).copied().unwrap_or(false))
        .collect();
    lost.sort_unstable();
    lost
}

#[cfg(test)]
mod tests {
    use super::unreachable;

    #[test]
    fn unreachable_names_live_nodes_no_path_reaches() {
        // 0 -> 1 -> 2, 3 -> 0 (3 has no in-edge), 4 isolated, 9 past the end.
        let lists = vec![vec![1], vec![2], vec![], vec![0], vec![]];
        assert_eq!(unreachable(&lists, 0, &[1, 2, 3, 4, 9]), vec![3, 4, 9]);
        assert_eq!(unreachable(&lists, 3, &[0, 1, 2, 3]), Vec::<u32>::new());
        assert_eq!(unreachable(&lists, 7, &[0]), vec![0]);
    }
}
