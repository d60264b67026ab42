//! Parameters of the `flat` engine and their schema.
//!
//! An exact index has nothing to tune but the worker pool of its batch
//! calls: there is no build parameter and no search knob.

use vectide_core::engine::THREADS;
use vectide_core::params::check_params;
use vectide_core::{limits, ParamSpec, ParamValue, Params, ParamsExt, Result};

/// Every parameter `flat` takes (the registry checks incoming [`Params`]
/// against it): only the common `threads`.
pub static PARAMS: [ParamSpec; 1] = [THREADS];

/// Parameters of a [`crate::Flat`] index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlatParams {
    /// Worker threads of batch calls, in a pool of the index's own.
    /// Default `None`: rayon's global pool (all cores).
    pub threads: Option<usize>,
}

impl FlatParams {
    /// Reads (and checks) loosely typed parameters; absent ones keep their
    /// defaults, unknown ones are an error listing the known ones.
    pub fn from_params(params: &Params) -> Result<Self> {
        check_params("flat", &PARAMS, params)?;
        let p = FlatParams {
            threads: params.usize("threads"),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks every field against its bound (`threads` in `1..=MAX_THREADS`).
    pub fn validate(&self) -> Result<()> {
        match self.threads {
            Some(t) => limits::check_threads(t),
            None => Ok(()),
        }
    }

    /// The parameters in effect as [`Params`], with the pool's real size.
    pub fn to_params(&self, threads: usize) -> Params {
        let mut out = Params::new();
        out.insert("threads".into(), ParamValue::Int(threads as i64));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::params::params_of;
    use vectide_core::Error;

    #[test]
    fn defaults_and_checks() {
        assert_eq!(
            FlatParams::from_params(&Params::new()).unwrap(),
            FlatParams::default()
        );
        let p = FlatParams::from_params(&params_of([("threads", ParamValue::Int(3))])).unwrap();
        assert_eq!(p.threads, Some(3));
        for bad in [
            params_of([("threads", ParamValue::Int(0))]),
            params_of([("threads", ParamValue::Int(100_000))]),
            params_of([("m", ParamValue::Int(16))]),
        ] {
            assert!(matches!(
                FlatParams::from_params(&bad),
                Err(Error::InvalidInput(_))
            ));
        }
        assert_eq!(p.to_params(3), params_of([("threads", ParamValue::Int(3))]));
    }
}
