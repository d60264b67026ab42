//! Creating and reopening a `fresh-diskann` directory (§5.6): recovery is
//! the LTI the manifest names, its RO-TempIndex snapshots, the DeleteList,
//! then a replay of the redo log into a new RW-TempIndex. Files the
//! manifest does not name (an interrupted merge's LTI, a snapshot or log of
//! an interrupted freeze) are removed.

use crate::engine::FreshDiskann;
use crate::lti::Lti;
use crate::manifest::{self, Manifest, MANIFEST};
use crate::params::{FreshDiskannParams, OpenKnobs};
use crate::state::{is_point, Inner, Loc, LtiGen, Place, State, Writer, LTI_SYNC};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use vectide_core::validate::Checked;
use vectide_core::{Error, Metric, Result, VectorIndex};
use vectide_storage::block::DirectFile;
use vectide_storage::durable::{replay, RedoLog};
use vectide_vamana::{FreshVamana, START_LABEL};

impl FreshDiskann {
    /// Creates an empty index in `dir` (absent or empty).
    pub fn create(
        dir: &Path,
        dim: usize,
        metric: Metric,
        mut params: FreshDiskannParams,
    ) -> Result<Self> {
        params.validate()?;
        params.resolve(dim)?;
        if dir.join(MANIFEST).exists() {
            return Err(Error::invalid(format!(
                "{} already holds an index (open it instead)",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io_at(dir, e))?;
        let m = Manifest {
            dim,
            metric,
            params: FreshDiskannParams {
                graph: vectide_vamana::VamanaParams {
                    threads: None,
                    ..params.graph.clone()
                },
                ..params.clone()
            },
            lti_gen: 0,
            ro: Vec::new(),
            rw: 1,
            covered_seq: 0,
            lti_dead: Vec::new(),
            ro_dead: Vec::new(),
        };
        let log = match params.external_log {
            true => None,
            false => Some(RedoLog::open(&manifest::log_file(dir, 1), dim)?.0),
        };
        m.write(dir)?;
        let writer = Writer { log, manifest: m };
        let inner = Inner::new(dir, dim, metric, params, State::default(), writer, 0)?;
        let rw = inner.new_temp(1)?;
        inner.state.write().temps.push(rw);
        Ok(FreshDiskann {
            inner: Arc::new(inner),
        })
    }

    /// Opens (recovers) the index in `dir` with the knobs that are not
    /// stored (the pool size, where and how merges run).
    pub fn open(dir: &Path, knobs: OpenKnobs) -> Result<Self> {
        let m = Manifest::read(dir)?;
        let mut params = m.params.clone();
        let threads = knobs.threads;
        params.graph.threads = threads;
        params.merge_inline = knobs.merge_inline;
        params.merge_l = knobs.merge_l;
        params.merge_refill = knobs.merge_refill;
        params.external_log = knobs.external_log;
        params.validate()?;
        let threads_n = threads.unwrap_or_else(rayon::current_num_threads);
        let mut st = State::default();
        let dead: HashSet<u32> = m.lti_dead.iter().copied().collect();
        if m.lti_gen > 0 {
            let file = DirectFile::open(&manifest::lti_file(dir, m.lti_gen), false, LTI_SYNC)?;
            let lti = Lti::open(Box::new(file), &manifest::pq_file(dir, m.lti_gen))?;
            let h = *lti.header();
            if h.dim as usize != m.dim || h.metric != m.metric {
                return Err(Error::corrupted(format!(
                    "the LTI holds {}-d {} vectors, the manifest {}-d {}",
                    h.dim,
                    h.metric.name(),
                    m.dim,
                    m.metric.name()
                )));
            }
            if dead.iter().any(|&n| n as u64 >= h.nodes) {
                return Err(Error::corrupted("the DeleteList names nodes past the LTI"));
            }
            lti.scan(|i, node| {
                if is_point(node.label) && !dead.contains(&i) {
                    let prev = st.loc.insert(
                        node.label,
                        Loc {
                            place: Place::Lti(i),
                            seq: h.durable_seq,
                        },
                    );
                    if prev.is_some() {
                        return Err(Error::corrupted(format!(
                            "the LTI holds point {} twice",
                            node.label
                        )));
                    }
                }
                Ok(())
            })?;
            st.lti = Some(Arc::new(LtiGen {
                gen: m.lti_gen,
                lti,
            }));
        }
        for &s in &m.ro {
            let v = FreshVamana::load(&manifest::temp_file(dir, s), Some(threads_n))?;
            if v.dim() != m.dim || v.metric() != m.metric {
                return Err(Error::corrupted(format!(
                    "snapshot temp-{s}.fv does not match the index's dimension or metric"
                )));
            }
            let g = v.export_graph();
            for (i, &label) in g.labels.iter().enumerate() {
                if label != START_LABEL {
                    st.loc.insert(
                        label,
                        Loc {
                            place: Place::temp(s),
                            seq: g.seqs[i],
                        },
                    );
                }
            }
            st.temps.push(Arc::new(crate::state::Temp {
                serial: s,
                index: v,
            }));
        }
        for &(s, id) in &m.ro_dead {
            if st.loc.get(&id).is_some_and(|l| l.place == Place::temp(s)) {
                st.loc.remove(&id);
            }
        }
        st.lti_dead = m.lti_dead.clone();
        st.ro_dead = m.ro_dead.clone();
        // The redo log of the RW-TempIndex. Under the database (whose
        // commit log is the only log) there is none, unless a standalone
        // index left one: its calls are replayed all the same. A
        // standalone freeze that a crash cut before its manifest left the
        // next serial's log too (`Inner::freeze_switch`): it holds the
        // writes after the freeze began, and becomes the RW log once the
        // freeze is finished below.
        let path = manifest::log_file(dir, m.rw);
        let cut_path = manifest::log_file(dir, m.rw + 1);
        let cut = cut_path.exists();
        let read = |p: &Path| RedoLog::open(p, m.dim);
        let (log, calls, cut_calls) = match (params.external_log, path.exists(), cut) {
            (true, false, false) => (None, Vec::new(), Vec::new()),
            (true, _, _) => (
                None,
                if path.exists() {
                    read(&path)?.1.ops
                } else {
                    Vec::new()
                },
                if cut {
                    read(&cut_path)?.1.ops
                } else {
                    Vec::new()
                },
            ),
            (false, _, false) => {
                let (log, rec) = read(&path)?;
                (Some(log), rec.ops, Vec::new())
            }
            (false, _, true) => {
                let calls = read(&path)?.1.ops;
                let (log, rec) = read(&cut_path)?;
                (Some(log), calls, rec.ops)
            }
        };
        let (dim, metric, rw, covered) = (m.dim, m.metric, m.rw, m.covered_seq);
        let writer = Writer {
            log,
            manifest: m.clone(),
        };
        let inner = Inner::new(dir, dim, metric, params, st, writer, covered)?;
        // Every call of a log follows the manifest's checkpoint; each log's
        // calls go to its own temp index, as they did when written.
        let mut durable = covered;
        let mut frozen = None;
        let logs = [(rw, calls), (rw + 1, cut_calls)];
        for (serial, calls) in logs.into_iter().take(if cut { 2 } else { 1 }) {
            let temp = inner.new_temp(serial)?;
            inner.state.write().temps.push(temp.clone());
            frozen = frozen.or(Some(temp));
            durable = replay(
                calls,
                durable,
                // Rows read back from the log are checked as they enter again.
                |seq, ids, vectors| {
                    inner.apply_insert(seq, Checked::new(dim, metric, ids, vectors)?, None)
                },
                |seq, ids| inner.apply_delete(seq, ids).map(drop),
            )?
            .watermark;
        }
        if cut {
            // The cut freeze's last steps: `temp-rw.fv` saved, the manifest
            // naming it. A crash before the manifest's rename leaves both
            // logs as they were, for the next open to do again.
            if let Some(frozen) = frozen {
                frozen.index.save(&manifest::temp_file(dir, rw))?;
            }
            inner.name_frozen(&mut inner.writer.lock(), rw, durable)?;
        }
        // What the redo log held was synced: durable, whoever logs from now.
        inner
            .durable
            .store(durable, std::sync::atomic::Ordering::Release);
        inner
            .synced
            .store(durable, std::sync::atomic::Ordering::Release);
        inner
            .covered
            .store(durable, std::sync::atomic::Ordering::Release);
        remove_unnamed(dir, &inner.writer.lock().manifest);
        Ok(FreshDiskann {
            inner: Arc::new(inner),
        })
    }

    /// Whether `dir` holds a `fresh-diskann` index.
    pub fn exists(dir: &Path) -> bool {
        dir.is_dir() && vectide_core::io::file_starts_with(&dir.join(MANIFEST), manifest::MAGIC)
    }
}

/// Removes the files of the directory that the manifest does not name.
fn remove_unnamed(dir: &Path, m: &Manifest) {
    let mut keep: HashSet<std::path::PathBuf> = HashSet::new();
    keep.insert(dir.join(MANIFEST));
    if m.lti_gen > 0 {
        keep.insert(manifest::lti_file(dir, m.lti_gen));
        keep.insert(manifest::pq_file(dir, m.lti_gen));
    }
    for &s in &m.ro {
        keep.insert(manifest::temp_file(dir, s));
    }
    keep.insert(manifest::log_file(dir, m.rw));
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        let ours = [
            "lti-",
            "pq-",
            "temp-",
            "redo-",
            ".MANIFEST",
            ".temp-",
            ".pq-",
        ]
        .iter()
        .any(|pre| name.starts_with(pre));
        if ours && p.is_file() && !keep.contains(&p) {
            let _ = std::fs::remove_file(&p);
        }
    }
}
