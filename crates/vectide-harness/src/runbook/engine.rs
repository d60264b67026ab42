//! Which engines a runbook runs and how each is built: one rule for every
//! front end, so the CLI and Python build an engine alike.
//!
//! - The default set: every registered approximate engine (one with a
//!   search knob) that runs in memory or is an SSD index (which runs in a
//!   temporary directory). The persistent-memory engine and the durable
//!   in-RAM baselines join on request.
//! - Build parameters, by each engine's schema: `threads` = the update
//!   threads, the Vamana family's R / L / alpha (FreshDiskANN §6.2), the
//!   HNSW family's M / efConstruction, and `l_search` = the knob.
//! - The search knob, fixed for the run: `nprobe` for an engine whose
//!   primary knob is the postings probed (the SPANN family), else `knob`
//!   (a graph's L or ef).
//! - A variant `vectide:NAME@key=value@…` changes some of them; it runs and
//!   reports under its full name. Values are read as the schema's kind.

use vectide_core::{EngineDescriptor, Knob, Medium, SearchParams};
use vectide_engines::{ParamKind, ParamValue, Params};

/// The Vamana family's build parameters in every run.
pub const VAMANA_FAMILY: [(&str, f64); 3] = [("r", 64.0), ("l_build", 75.0), ("alpha", 1.2)];
/// The HNSW family's build parameters in every run.
pub const HNSW_FAMILY: [(&str, f64); 2] = [("m", 16.0), ("ef_construction", 200.0)];

/// One engine as it will run.
#[derive(Debug, Clone)]
pub struct EngineRun {
    /// `vectide:NAME` (with its `@key=value` changes), the key of its results.
    pub key: String,
    pub desc: &'static EngineDescriptor,
    /// Build parameters, without `path` (a run gives a directory engine a
    /// temporary one).
    pub params: Params,
    /// The primary search knob, fixed at the run's value.
    pub knob: Option<Knob>,
    pub search: SearchParams,
}

/// Every engine a runbook runs when none are named, as `vectide:NAME`.
pub fn default_engines() -> Vec<String> {
    vectide_engines::REGISTRY
        .iter()
        .filter(|d| {
            d.primary_knob.is_some() && (!d.persistence.in_directory() || d.medium == Medium::Ssd)
        })
        .map(|d| format!("vectide:{}", d.name))
        .collect()
}

/// Whether `spec` names a Vectide engine (`vectide:NAME…`) rather than a peer.
pub fn is_native(spec: &str) -> bool {
    spec.starts_with("vectide:")
}

impl EngineRun {
    /// Resolves `NAME`, `vectide:NAME` or `vectide:NAME@key=value@…`.
    pub fn new(
        spec: &str,
        update_threads: usize,
        knob: usize,
        nprobe: usize,
    ) -> Result<Self, String> {
        let (base, changes) = match spec.split_once('@') {
            Some((b, rest)) => (b, rest.split('@').collect::<Vec<_>>()),
            None => (spec, Vec::new()),
        };
        let name = base.strip_prefix("vectide:").unwrap_or(base);
        let desc = vectide_engines::descriptor(name).map_err(|e| e.to_string())?;
        let mut params = build_params(desc, update_threads, knob);
        let mut changed: Vec<&str> = Vec::new();
        for pair in changes {
            let (key, raw) = pair
                .split_once('=')
                .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                .ok_or_else(|| {
                    format!("engine variant {spec:?}: expected NAME@key=value, got {pair:?}")
                })?;
            if changed.contains(&key) {
                return Err(format!("engine variant {spec:?} sets {key:?} twice"));
            }
            changed.push(key);
            let p = desc.param(key).filter(|_| key != "path").ok_or_else(|| {
                let takes: Vec<&str> = desc
                    .params
                    .iter()
                    .map(|p| p.name)
                    .filter(|n| *n != "path")
                    .collect();
                format!(
                    "vectide:{name} has no parameter {key:?}; it takes {}",
                    takes.join(", ")
                )
            })?;
            params.insert(key.to_string(), typed(spec, key, raw, &p.kind)?);
        }
        let key = match spec.strip_prefix("vectide:") {
            Some(_) => spec.to_string(),
            None => format!("vectide:{spec}"),
        };
        let mut search = SearchParams::default();
        if let Some(kn) = desc.primary_knob {
            let value = if kn == Knob::Nprobe { nprobe } else { knob };
            search
                .set(kn, value)
                .map_err(|e| format!("{key}: {}: {e}", kn.name()))?;
        }
        Ok(Self {
            key,
            desc,
            params,
            knob: desc.primary_knob,
            search,
        })
    }

    /// Sets the primary knob (the calibration's sweep).
    pub fn set_knob(&mut self, value: usize) -> Result<(), String> {
        if let Some(kn) = self.knob {
            self.search
                .set(kn, value)
                .map_err(|e| format!("{}: knob: {e}", self.key))?;
        }
        Ok(())
    }

    /// The knob's current value.
    pub fn knob_value(&self) -> Option<usize> {
        self.knob.and_then(|kn| self.search.get(kn))
    }
}

/// A variant's value read as its parameter's kind.
fn typed(spec: &str, key: &str, raw: &str, kind: &ParamKind) -> Result<ParamValue, String> {
    let bad = |what: &str| format!("engine variant {spec:?}: {key}={raw} is not {what}");
    Ok(match kind {
        ParamKind::Int { .. } => ParamValue::Int(raw.parse().map_err(|_| bad("an integer"))?),
        ParamKind::Float { .. } => ParamValue::Float(raw.parse().map_err(|_| bad("a number"))?),
        ParamKind::Bool => ParamValue::Bool(match raw {
            "true" | "True" | "1" => true,
            "false" | "False" | "0" => false,
            _ => return Err(bad("true or false")),
        }),
        ParamKind::Choice(_) | ParamKind::Path | ParamKind::Text => {
            ParamValue::Str(raw.to_string())
        }
    })
}

/// The build parameters of an engine in a run (see the module's rule).
pub fn build_params(desc: &EngineDescriptor, update_threads: usize, knob: usize) -> Params {
    let mut params = Params::new();
    params.insert("threads".into(), ParamValue::Int(update_threads as i64));
    for (name, value) in VAMANA_FAMILY.iter().chain(HNSW_FAMILY.iter()) {
        if let Some(spec) = desc.param(name) {
            let value = match spec.kind {
                ParamKind::Float { .. } => ParamValue::Float(*value),
                _ => ParamValue::Int(*value as i64),
            };
            params.insert(name.to_string(), value);
        }
    }
    if desc.param("l_search").is_some() {
        params.insert("l_search".into(), ParamValue::Int(knob as i64));
    }
    params
}

/// How an engine keeps its index clean after deletes, as the results say.
pub fn policy(desc: &EngineDescriptor) -> &'static str {
    if desc.param("merge_points").is_some() {
        "the engine's own: deletes go to a DeleteList; the in-memory RW-TempIndex freezes at \
         temp_points and a StreamingMerge folds the temp indexes and the deletes into the SSD \
         index in the background at merge_points (engine parameters); searches and writes go on \
         during a merge"
    } else {
        "the engine's own: deletes are lazy and consolidation runs inside the delete or insert \
         call once the deleted fraction reaches consolidate_fraction (engine parameter)"
    }
}
